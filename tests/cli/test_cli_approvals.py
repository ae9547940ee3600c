"""``gpuroster approvals/approve/deny/maintenance`` against a live server (per database, as
in test_cli): an admin approves and denies with a reason, a lost decision exits 3 naming
the winner, a maintenance without --override exits 3 listing the holders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.cli.test_cli import _json, lab, server  # noqa: F401 - fixtures


def _at(hours: int) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).replace(second=0, microsecond=0).isoformat()


def test_approve_deny_and_a_late_decision(lab):  # noqa: F811
    r = lab.api("POST", "/rules", lab.admin, json={"scope": "default", "approval_above_devices": 1})
    assert r.status_code == 201, r.text
    first = _json(lab.cli("reserve", "-n", "2", "--for", "1h", "--start", _at(2), "--json"))
    second = _json(lab.cli("reserve", "-n", "2", "--for", "1h", "--start", _at(2), "--json", token="bob"))
    assert first["state"] == second["state"] == "pending"
    listed = lab.cli("approvals", token="admin")
    assert listed.returncode == 0 and f"#{first['id']} pending" in listed.stdout and "by alice" in listed.stdout
    assert lab.cli("approvals", token="alice").stdout.strip() == "nothing awaits your approval"
    out = lab.cli("approve", str(first["id"]), "--reason", "ok for the paper", token="admin")
    assert out.returncode == 0 and f"#{first['id']} upcoming" in out.stdout, out.stderr
    out = lab.cli("deny", str(second["id"]), "--reason", "the A100s are promised", token="admin")
    assert out.returncode == 0 and "denied" in out.stdout, out.stderr
    late = lab.cli("approve", str(second["id"]), token="admin")
    assert late.returncode == 3 and "denied by boss" in late.stderr
    assert lab.cli("approve", str(first["id"]), token="alice").returncode == 4


def test_maintenance_needs_override_to_move_holders(lab):  # noqa: F811
    held = _json(lab.cli("reserve", "-n", "1", "--for", "1h", "--start", _at(1), "--json"))
    out = lab.cli("maintenance", "node-01", "--reason", "driver update", token="admin")
    assert out.returncode == 3 and f"#{held['id']} by alice" in out.stderr
    out = lab.cli("maintenance", "node-01", "--reason", "driver update", "--override", token="admin")
    assert out.returncode == 0, out.stderr
    assert "(open-ended)" in out.stdout and f"#{held['id']} of alice cancelled" in out.stdout
