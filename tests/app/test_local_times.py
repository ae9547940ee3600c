"""Local times people type, in the lab's zone (Europe/Berlin in the tests): a wall time of the
autumn DST night is refused naming both instants unless ``fold`` or an offset says which;
a spring-gap time is refused; messages print lab time; a maximum length is real hours."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.errors import InvalidInput
from app.timeutil import fmt_hours, fmt_local, parse_instant
from tests.conftest import book

# 2027-10-31: Berlin goes from CEST (+02:00) back to CET (+01:00) at 03:00 local; 02:30 occurs twice.
TWICE = "2027-10-31T02:30"
# 2027-03-28: Berlin jumps from 02:00 CET to 03:00 CEST; 02:30 does not exist.
GAP = "2027-03-28T02:30"


def test_parse_instant_refuses_a_repeated_wall_time_naming_both_instants():
    with pytest.raises(InvalidInput) as e:
        parse_instant(TWICE, tz="Europe/Berlin", field="start")
    assert e.value.field == "start"
    assert "2027-10-31 02:30 CEST (UTC+02:00) = 2027-10-31T00:30:00+00:00" in e.value.detail
    assert "2027-10-31 02:30 CET (UTC+01:00) = 2027-10-31T01:30:00+00:00" in e.value.detail
    assert [c["fold"] for c in e.value.extra["choices"]] == [0, 1]
    assert parse_instant(TWICE, tz="Europe/Berlin", field="start", fold=0) == datetime(2027, 10, 31, 0, 30, tzinfo=UTC)
    assert parse_instant(TWICE, tz="Europe/Berlin", field="start", fold=1) == datetime(2027, 10, 31, 1, 30, tzinfo=UTC)
    assert parse_instant(TWICE + "+01:00", field="start") == datetime(2027, 10, 31, 1, 30, tzinfo=UTC)
    # an ordinary time ignores fold
    assert parse_instant("2027-10-31T12:00", tz="Europe/Berlin", field="start", fold=1) == datetime(2027, 10, 31, 11, 0, tzinfo=UTC)


def test_parse_instant_refuses_a_spring_gap_time():
    with pytest.raises(InvalidInput) as e:
        parse_instant(GAP, tz="Europe/Berlin", field="end", fold=0)
    assert e.value.field == "end" and "does not exist in Europe/Berlin" in e.value.detail
    assert "from CET to CEST" in e.value.detail


def test_format_helpers():
    assert fmt_local(datetime(2027, 1, 5, 8, 0, tzinfo=UTC), __import__("zoneinfo").ZoneInfo("Europe/Berlin")) == \
        "2027-01-05 09:00 CET (UTC+01:00)"
    assert fmt_local(datetime(2027, 1, 5, 8, 0, tzinfo=UTC), __import__("zoneinfo").ZoneInfo("UTC")) == "2027-01-05 08:00 UTC"
    assert fmt_hours(25 * 3600) == "25 h" and fmt_hours(5400) == "1.5 h"


def test_api_refuses_repeated_wall_time_then_books_with_fold_or_offset(client, lab):
    r = book(client, lab.alice, [0], TWICE, tz="Europe/Berlin")
    assert r.status_code == 422
    doc = r.json()
    assert doc["field"] == "start" and "occurs twice" in doc["detail"]
    assert [c["instant"] for c in doc["choices"]] == ["2027-10-31T00:30:00+00:00", "2027-10-31T01:30:00+00:00"]
    later = book(client, lab.alice, [0], TWICE, tz="Europe/Berlin", fold=1)
    assert later.status_code == 201, later.text
    assert later.json()["start"].startswith("2027-10-31T01:30:00")
    earlier = book(client, lab.alice, [1], TWICE, tz="Europe/Berlin", fold=0)
    assert earlier.status_code == 201 and earlier.json()["start"].startswith("2027-10-31T00:30:00")
    offset = book(client, lab.alice, [2], TWICE + "+02:00")
    assert offset.status_code == 201 and offset.json()["start"].startswith("2027-10-31T00:30:00")
    assert book(client, lab.alice, [3], GAP, tz="Europe/Berlin").status_code == 422


def test_extend_to_a_repeated_wall_time_needs_fold(client, lab):
    r = book(client, lab.alice, [0], "2027-10-30T20:00", "2027-10-30T22:00", tz="Europe/Berlin")
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    p = client.patch(f"/api/v1/reservations/{rid}", json={"end": TWICE, "tz": "Europe/Berlin"}, headers=lab.alice.headers)
    assert p.status_code == 422 and p.json()["field"] == "end"
    p = client.patch(f"/api/v1/reservations/{rid}", json={"end": TWICE, "tz": "Europe/Berlin", "fold": 1},
                     headers=lab.alice.headers)
    assert p.status_code == 200 and p.json()["end"].startswith("2027-10-31T01:30:00")


def test_conflict_and_past_messages_print_lab_time(client, lab):
    assert book(client, lab.alice, [0], "2027-01-05T09:00+01:00").status_code == 201
    r = book(client, lab.bob, [0], "2027-01-05T09:30+01:00")
    assert r.status_code == 409
    detail = r.json()["detail"]
    assert "[2027-01-05 09:00 CET (UTC+01:00), 2027-01-05 10:00 CET (UTC+01:00))" in detail
    assert "all free from 2027-01-05 10:00 CET (UTC+01:00)" in detail and "+00:00" not in detail
    # the machine-readable part stays ISO 8601 UTC
    assert r.json()["conflicts"][0]["start"].startswith("2027-01-05T08:00:00")
    past = book(client, lab.bob, [1], "2020-01-05T09:30+01:00")
    assert past.status_code == 422 and "2020-01-05 09:30 CET (UTC+01:00) is in the past" in past.json()["detail"]


def test_maximum_length_is_real_elapsed_hours_and_says_so(client, lab):
    r = client.post("/api/v1/rules", json={"scope": "default", "max_duration_seconds": 24 * 3600},
                    headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    # midnight to midnight on the autumn day is 25 real hours
    r = book(client, lab.alice, [0], "2027-10-31T00:00", "2027-11-01T00:00", tz="Europe/Berlin")
    assert r.status_code == 403
    assert "reservation length 25 h (real elapsed time) exceeds the limit of 24 h" in r.json()["detail"]
    # midnight to midnight on the spring day is 23 real hours: allowed
    assert book(client, lab.alice, [0], "2027-03-28T00:00", "2027-03-29T00:00", tz="Europe/Berlin").status_code == 201
