"""Messages give times in the lab's zone (Europe/Berlin in the tests); the machine-readable
members of a problem stay in UTC."""

from __future__ import annotations

from zoneinfo import ZoneInfo

from app.errors import localize_instants
from tests.conftest import book


def test_conflict_message_gives_times_in_the_lab_zone_and_members_in_utc(client, lab):
    start = "2031-05-04T09:00:00+02:00"  # 07:00 UTC, summer time in Berlin
    assert book(client, lab.alice, [0], start, "2031-05-04T11:00:00+02:00").status_code == 201
    r = book(client, lab.bob, [0], "2031-05-04T10:00:00+02:00", "2031-05-04T10:30:00+02:00")
    assert r.status_code == 409
    doc = r.json()
    assert "[2031-05-04 09:00 CEST (UTC+02:00), 2031-05-04 11:00 CEST (UTC+02:00))" in doc["detail"], doc["detail"]
    assert "all free from 2031-05-04 11:00 CEST" in doc["detail"]
    assert "+00:00" not in doc["detail"]
    assert doc["earliest_free_start"] == "2031-05-04T09:00:00+00:00"  # members: UTC, for programs


def test_localize_instants_rewrites_only_instants_with_an_offset():
    berlin = ZoneInfo("Europe/Berlin")
    text = "from 2031-01-10T08:00:00Z to 2031-01-10T09:30:15.5+00:00; day 2031-01-10; naive 2031-01-10T08:00"
    assert localize_instants(text, berlin) == (
        "from 2031-01-10 09:00 CET to 2031-01-10 10:30:15 CET; day 2031-01-10; naive 2031-01-10T08:00")
