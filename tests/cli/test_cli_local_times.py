"""The CLI on the autumn DST night: a repeated wall time is refused with both instants in the
lab's zone; an explicit offset books the chosen one. (Live server per database, as in test_cli.)"""

from __future__ import annotations

from tests.cli.test_cli import _json, lab, server  # noqa: F401 - fixtures


def test_reserve_at_a_repeated_wall_time_names_both_instants_and_offset_picks_one(lab):  # noqa: F811
    out = lab.cli("reserve", "--for", "1h", "--start", "2027-10-31 02:30")
    assert out.returncode == 2, out.stderr
    assert "occurs twice" in out.stderr
    assert "2027-10-31 02:30 CEST (UTC+02:00)" in out.stderr and "2027-10-31 02:30 CET (UTC+01:00)" in out.stderr
    r = _json(lab.cli("reserve", "--for", "1h", "--start", "2027-10-31T02:30+01:00", "--json"))
    assert r["start"].startswith("2027-10-31T01:30:00")
