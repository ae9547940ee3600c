"""``gpuroster boost ask|list``, ``gpuroster admin boost approve|deny`` and the boost in
``gpuroster usage`` against a live server (per database, as in test_cli)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.cli.test_cli import _json, lab, server  # noqa: F401 - fixtures


def test_ask_list_approve_deny_and_usage(lab):  # noqa: F811
    r = lab.api("POST", "/rules", lab.admin, json={"scope": "default", "max_duration_seconds": 3600, "max_devices": 1})
    assert r.status_code == 201, r.text
    day = (datetime.now(UTC) + timedelta(days=4)).date().isoformat()
    out = lab.cli("boost", "ask", "max_duration_seconds", "12h", "--until", day, "--reason", "paper deadline")
    assert out.returncode == 0 and "pending: max_duration_seconds to 12h until" in out.stdout, out.stderr
    bid = int(out.stdout.split("#")[1].split()[0])
    other = _json(lab.cli("boost", "ask", "max_devices", "2", "--until", day, "--reason", "sweep", "--json"))
    assert other["state"] == "pending" and other["value"] == 2
    listed = lab.cli("boost", "list", "--state", "pending", token="admin")
    assert listed.returncode == 0 and f"#{bid}" in listed.stdout and "paper deadline" in listed.stdout
    assert lab.cli("admin", "boost", "approve", str(bid)).returncode == 4  # alice may not decide her own
    out = lab.cli("admin", "boost", "approve", str(bid), "--reason", "go", token="admin")
    assert out.returncode == 0 and f"boost #{bid} active" in out.stdout and "alice was told" in out.stdout, out.stderr
    out = lab.cli("admin", "boost", "deny", str(other["id"]), "--reason", "no", token="admin")
    assert out.returncode == 0 and "denied" in out.stdout, out.stderr
    late = lab.cli("admin", "boost", "deny", str(bid), token="admin")
    assert late.returncode == 3 and "already approved by boss" in late.stderr
    usage = lab.cli("usage")
    assert usage.returncode == 0 and f"boost:{bid}" in usage.stdout and "12h" in usage.stdout
    assert f"boost #{bid} active: max_duration_seconds to 12h until" in usage.stdout
    bad = lab.cli("boost", "ask", "max_devices", "two", "--until", day, "--reason", "x")
    assert bad.returncode == 2 and "value" in bad.stderr
    bad = lab.cli("boost", "ask", "max_devices", "1", "--until", day, "--reason", "x")
    assert bad.returncode == 2 and "not above" in bad.stderr
