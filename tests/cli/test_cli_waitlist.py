"""``gpuroster wait`` and ``gpuroster waitlist [cancel ID]`` against a live server (per
database, as in test_cli): an entry waits its turn, is listed with its place in line in the
lab's zone, is cancelled once (a second cancel exits 3), and is booked when the holder
cancels; input no host can meet exits 2 naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.cli.test_cli import _json, lab, server  # noqa: F401 - fixtures


def _at(hours: int) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).replace(second=0, microsecond=0).isoformat()


def test_wait_list_cancel_and_booked_after_a_cancel(lab):  # noqa: F811
    held = _json(lab.cli("reserve", "-n", "4", "--for", "4h", "--start", _at(2), "--json", token="bob"))
    booked = _json(lab.cli("wait", "-n", "2", "--for", "3h", "--within", "3h", "--start", _at(2), "--book", "--json"))
    assert booked["state"] == "waiting" and booked["book"] is True and booked["count"] == 2
    told = lab.cli("wait", "-n", "1", "--for", "1h", "--within", "3h", "--start", _at(2), "--host", "node-01")
    assert told.returncode == 0, told.stderr
    assert "waiting (#2 in line): 1 GPU(s) for 1h on node-01 within" in told.stdout and ", notify" in told.stdout
    told_id = int(told.stdout.split()[0].lstrip("#"))
    listed = lab.cli("waitlist")
    assert listed.returncode == 0, listed.stderr
    assert f"#{booked['id']} waiting (#1 in line): 2 GPU(s) for 3h" in listed.stdout and ", book" in listed.stdout
    assert "+00:00" not in listed.stdout and "T" not in listed.stdout.split("within")[1].split(",")[0]
    out = lab.cli("waitlist", "cancel", str(told_id))
    assert out.returncode == 0 and out.stdout.strip() == f"#{told_id} cancelled", (out.stdout, out.stderr)
    again = lab.cli("waitlist", "cancel", str(told_id))
    assert again.returncode == 3 and "cancelled" in again.stderr
    assert lab.cli("waitlist", "cancel", str(booked["id"]), token="bob").returncode == 4
    assert lab.cli("cancel", str(held["id"]), token="bob").returncode == 0
    after = lab.cli("waitlist", "--all")
    assert after.returncode == 0, after.stderr
    assert f"#{booked['id']} booked: 2 GPU(s) for 3h" in after.stdout and "→ reservation #" in after.stdout
    assert f"#{told_id} cancelled" in after.stdout
    assert lab.cli("waitlist").stdout.strip() == "nothing waiting (see --all)"
    rows = _json(lab.cli("waitlist", "--everyone", "--all", "--json", token="admin"))
    assert {r["id"] for r in rows} == {booked["id"], told_id}


def test_wait_for_more_than_any_host_has_exits_2(lab):  # noqa: F811
    out = lab.cli("wait", "-n", "9", "--for", "1h")
    assert out.returncode == 2 and "count:" in out.stderr
    out = lab.cli("wait", "-n", "1", "--for", "1h", "--within", "soon")
    assert out.returncode == 2 and "--within" in out.stderr


def test_wait_that_books_at_once_says_what_it_booked(lab):  # noqa: F811
    out = lab.cli("wait", "-n", "1", "--for", "1h", "--book")
    assert out.returncode == 0, out.stderr
    assert " booked: 1 GPU(s) for 1h" in out.stdout and "→ reservation #" in out.stdout
    assert "reserved #" in out.stdout and " active on node-01: GPU " in out.stdout, out.stdout
