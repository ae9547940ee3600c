"""GPU-hours per calendar day, ISO week and month in the lab time zone: a booking across a
boundary is charged to each window by the hours in it, DST days are 23/25 h, and the refusal
names the window, the limit and what is left (both databases, injected ``now``)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from app.db import lock_for_write
from app.errors import RuleViolation
from app.models import User
from app.services import limit_usage
from app.services.calendar_quotas import window_of, windows_touching
from tests.rules.helpers import rule
from tests.rules.test_quota_windows import _book

BERLIN = ZoneInfo("Europe/Berlin")


def _refused(session_factory, settings, who, devices, start, end, *, now) -> RuleViolation:
    with pytest.raises(RuleViolation) as e:
        _book(session_factory, settings, who, devices, start, end, now=now)
    return e.value


def test_windows_are_lab_calendar_windows_with_dst_lengths():
    assert window_of("week", date(2026, 12, 6), BERLIN).label == "ISO week 2026-W49"  # a Sunday
    assert window_of("week", date(2026, 12, 7), BERLIN).label == "ISO week 2026-W50"  # the Monday after
    assert window_of("week", date(2027, 1, 1), BERLIN).label == "ISO week 2026-W53"  # ISO year, not calendar year
    autumn = window_of("week", date(2026, 10, 25), BERLIN)
    assert (autumn.start, autumn.hours) == (datetime(2026, 10, 18, 22, tzinfo=UTC), 169)
    assert window_of("week", date(2026, 3, 29), BERLIN).hours == 167
    assert window_of("day", date(2026, 10, 25), BERLIN).hours == 25
    assert window_of("month", date(2026, 10, 9), BERLIN).hours == 31 * 24 + 1
    assert window_of("month", date(2026, 3, 9), BERLIN).hours == 31 * 24 - 1
    spans = windows_touching("day", datetime(2026, 6, 8, 18, tzinfo=UTC), datetime(2026, 6, 9, 2, tzinfo=UTC), BERLIN)
    assert [w.label for w in spans] == ["day Mon 2026-06-08", "day Tue 2026-06-09"]


def test_a_booking_across_midnight_is_charged_to_both_days(client, lab, session_factory, settings):
    now = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
    rule(client, lab.admin, scope="default", max_gpu_hours_day=10)
    _book(session_factory, settings, "alice", [0], "2026-06-08T20:00", "2026-06-09T04:00", now=now)  # 4 h + 4 h
    e = _refused(session_factory, settings, "alice", [1], "2026-06-08T10:00", "2026-06-08T17:00", now=now)
    assert e.extra["rule"] == "max_gpu_hours_day"
    assert ("day Mon 2026-06-08 (Europe/Berlin): this needs 7 GPU-hours in it; you have 4 of 10 GPU-hours "
            "booked there, 6 left") in e.detail
    (v,) = e.extra["violations"]
    assert v["window"]["name"] == "day Mon 2026-06-08" and (v["used"], v["left"], v["limit"]) == (4, 6, 10)
    # Tuesday holds 4 of its own: 6 more fit exactly
    _book(session_factory, settings, "alice", [1], "2026-06-09T10:00", "2026-06-09T16:00", now=now)
    _book(session_factory, settings, "bob", [2], "2026-06-08T08:00", "2026-06-08T18:00", now=now)  # bob is counted alone


def test_iso_week_refusal_names_the_week_and_what_is_left(client, lab, session_factory, settings):
    now = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)
    rule(client, lab.admin, scope="default", max_gpu_hours_week=30)
    # Sun 6 Dec 12:00 to Mon 7 Dec 12:00 on one device: 12 h in W49 and 12 h in W50
    _book(session_factory, settings, "alice", [0], "2026-12-06T12:00", "2026-12-07T12:00", now=now)
    # two devices for 9 h on Thu 3 Dec: 18 more in W49 makes 30, the limit
    _book(session_factory, settings, "alice", [1, 2], "2026-12-03T08:00", "2026-12-03T17:00", now=now)
    e = _refused(session_factory, settings, "alice", [3], "2026-12-04T10:00", "2026-12-04T11:00", now=now)
    assert "ISO week 2026-W49" in e.detail and "you have 30 of 30 GPU-hours booked there, 0 left" in e.detail
    # the week after holds only the 12 h of the Monday morning
    e = _refused(session_factory, settings, "alice", [1, 2], "2026-12-08T00:00", "2026-12-08T10:00", now=now)
    assert "ISO week 2026-W50" in e.detail and "needs 20 GPU-hours" in e.detail and "18 left" in e.detail
    _book(session_factory, settings, "alice", [1, 2], "2026-12-08T00:00", "2026-12-08T09:00", now=now)


@pytest.mark.parametrize("limit, ok", [(168, False), (169, True)])
def test_the_autumn_dst_week_has_169_hours(client, lab, session_factory, settings, limit, ok):
    now = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)
    rule(client, lab.admin, scope="default", max_gpu_hours_week=limit)
    args = ("alice", [0], "2026-10-19T00:00", "2026-10-26T00:00")  # Monday to Monday, Berlin
    if ok:
        _book(session_factory, settings, *args, now=now)
    else:
        e = _refused(session_factory, settings, *args, now=now)
        assert "ISO week 2026-W43" in e.detail and "needs 169 GPU-hours" in e.detail and "168 left" in e.detail


def test_a_booking_across_the_month_end_is_charged_to_each_month(client, lab, session_factory, settings):
    now = datetime(2026, 10, 20, 8, 0, tzinfo=UTC)
    rule(client, lab.admin, scope="default", max_gpu_hours_month=3)
    _book(session_factory, settings, "alice", [0], "2026-10-31T22:00", "2026-11-01T02:00", now=now)  # 2 h + 2 h
    e = _refused(session_factory, settings, "alice", [1], "2026-11-01T10:00", "2026-11-01T12:00", now=now)
    assert e.extra["rule"] == "max_gpu_hours_month" and "month 2026-11" in e.detail and "1 left" in e.detail
    _book(session_factory, settings, "alice", [1], "2026-10-20T10:00", "2026-10-20T11:00", now=now)  # October: 2 + 1


def test_extending_is_checked_where_the_added_hours_fall(client, lab, session_factory, settings):
    from app.schemas.reservation import ReservationUpdate
    from app.services import reservations as reservation_service

    now = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
    rule(client, lab.admin, scope="default", max_gpu_hours_day=3.5)
    rid = _book(session_factory, settings, "alice", [0], "2026-06-08T20:00", "2026-06-08T23:00", now=now)
    with session_factory() as s:
        lock_for_write(s)
        alice = s.scalar(select(User).where(User.username == "alice"))
        with pytest.raises(RuleViolation) as e:  # to 04:00 the next day: Monday would hold 4 h
            reservation_service.update_reservation(s, actor=alice, reservation_id=rid, settings=settings, now=now,
                                                   data=ReservationUpdate(end="2026-06-09T04:00", tz="Europe/Berlin"))
    assert "day Mon 2026-06-08" in e.value.detail and "needs 4 GPU-hours" in e.value.detail
    assert "3.5 left" in e.value.detail


def test_usage_shows_the_current_calendar_windows(client, lab, session_factory, settings):
    rule(client, lab.admin, scope="default", max_gpu_hours_day=24, max_gpu_hours_week=100, max_gpu_hours_month=300)
    now = datetime(2026, 10, 25, 8, 0, tzinfo=UTC)
    _book(session_factory, settings, "alice", [0, 1], "2026-10-25T10:00", "2026-10-25T13:00", now=now)
    with session_factory() as s:
        alice = s.scalar(select(User).where(User.username == "alice"))
        u = {i.rule: i for i in limit_usage.usage(s, user=alice, now=now, tz=BERLIN)["limits"]}
    assert (u["max_gpu_hours_day"].used, u["max_gpu_hours_day"].left) == (6, 18)
    assert "day Sun 2026-10-25 (25 h long)" in u["max_gpu_hours_day"].detail
    assert "ISO week 2026-W43 (169 h long)" in u["max_gpu_hours_week"].detail and u["max_gpu_hours_week"].left == 94
    assert "month 2026-10" in u["max_gpu_hours_month"].detail and u["max_gpu_hours_month"].left == 294


def test_rules_api_takes_and_validates_the_calendar_limits(client, lab):
    r = rule(client, lab.admin, scope="default", max_gpu_hours_week=40)
    assert (r["max_gpu_hours_week"], r["max_gpu_hours_day"], r["max_gpu_hours_month"]) == (40, None, None)
    bad = client.patch(f"/api/v1/rules/{r['id']}", json={"max_gpu_hours_month": -1}, headers=lab.admin.headers)
    assert bad.status_code == 422 and "max_gpu_hours_month" in bad.text
    ok = client.patch(f"/api/v1/rules/{r['id']}", json={"max_gpu_hours_day": 8.5}, headers=lab.admin.headers)
    assert ok.status_code == 200 and ok.json()["max_gpu_hours_day"] == 8.5
    assert client.patch(f"/api/v1/rules/{r['id']}", json={"max_gpu_hours_day": 1}, headers=lab.alice.headers).status_code == 403
