"""Quota windows and day boundaries in the lab time zone, charges in real elapsed hours.

Driven through the services with an injected ``now`` so the 2026 DST dates of the cases
can be used as they are, on both databases and under several process time zones.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from app.db import lock_for_write, transaction
from app.errors import RuleViolation
from app.models import User
from app.schemas.reservation import ReservationCreate
from app.services import reservations as reservation_service
from app.services import limit_usage
from app.services import rules as rules_service
from tests.conftest import process_timezone
from tests.rules.helpers import rule

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(params=["UTC", "America/Los_Angeles", "Asia/Tokyo"])
def process_tz(request):
    """The process time zone must not matter (B24)."""
    with process_timezone(request.param):
        yield request.param


def _book(session_factory, settings, who, devices, start, end, *, now, tz="Europe/Berlin"):
    """Book as ``who`` through the service at ``now``; returns the reservation id or raises."""
    with session_factory() as s:
        lock_for_write(s)
        actor = s.scalar(select(User).where(User.username == who))
        data = ReservationCreate(host="node-01", devices=devices, start=start, end=end, tz=tz)
        try:
            r = reservation_service.create_reservation(s, actor=actor, data=data, settings=settings, now=now)
        except Exception:
            s.rollback()
            raise
        s.commit()
        return r.id


def test_25_hour_day_is_charged_25_gpu_hours(client, lab, session_factory, settings, process_tz):
    now = datetime(2026, 10, 20, 10, 0, tzinfo=UTC)  # CEST; the 25th has 25 hours in Berlin
    rid = rule(client, lab.admin, scope="default", max_gpu_hours_7d=24.5)["id"]
    with pytest.raises(RuleViolation) as e:
        _book(session_factory, settings, "alice", [0], "2026-10-25T00:00", "2026-10-26T00:00", now=now)
    assert e.value.extra["rule"] == "max_gpu_hours_7d"
    assert "needs 25 GPU-hours" in e.value.detail and "24.5 left" in e.value.detail
    client.patch(f"/api/v1/rules/{rid}", json={"max_gpu_hours_7d": 25}, headers=lab.admin.headers)
    _book(session_factory, settings, "alice", [0], "2026-10-25T00:00", "2026-10-26T00:00", now=now)


def test_23_hour_day_is_charged_23_gpu_hours_and_the_window_holds_both_days(client, lab, session_factory, settings, process_tz):
    now = datetime(2026, 3, 20, 10, 0, tzinfo=UTC)
    rule(client, lab.admin, scope="default", max_gpu_hours_7d=23)
    _book(session_factory, settings, "alice", [0], "2026-03-29T00:00", "2026-03-30T00:00", now=now)  # 23 h
    with pytest.raises(RuleViolation) as e:
        _book(session_factory, settings, "alice", [1], "2026-03-30T09:00", "2026-03-30T10:00", now=now)
    assert e.value.extra["used"] == 23 and e.value.extra["left"] == 0
    # the 23-hour day left the window seven lab days later
    _book(session_factory, settings, "alice", [1], "2026-04-05T00:00", "2026-04-05T01:00", now=now)


def test_rolling_window_days_start_at_lab_midnight_not_utc(client, lab, session_factory, settings, process_tz):
    now = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
    rule(client, lab.admin, scope="default", max_gpu_hours_7d=10)
    # Mon 8 June 16:00–24:00 Berlin = 14:00Z–22:00Z: 8 GPU-hours on lab day 8 June
    _book(session_factory, settings, "alice", [0], "2026-06-08T16:00", "2026-06-09T00:00", now=now)
    # Sun 14 June is the 7th lab day with 8 June: 8 + 3 > 10
    with pytest.raises(RuleViolation) as e:
        _book(session_factory, settings, "alice", [1], "2026-06-14T10:00", "2026-06-14T13:00", now=now)
    window = e.value.extra["violations"][0]["window"]
    assert datetime.fromisoformat(window["start"]) == datetime(2026, 6, 7, 22, 0, tzinfo=UTC)  # 00:00 Berlin
    # Mon 15 June 00:00–03:00 Berlin is 14 June 22:00Z–01:00Z: a UTC day would still see the 8 h
    _book(session_factory, settings, "alice", [1], "2026-06-15T00:00", "2026-06-15T03:00", now=now)


def test_refusal_names_lab_time_release(client, lab, session_factory, settings, make_host):
    from tests.conftest import gpu, snapshot_body

    h = make_host("node-02")
    client.post("/api/v1/agent/snapshots", headers=h.headers, json=snapshot_body(
        "node-02", 1, [gpu(f"GPU-9{i}000000-0000-0000-0000-000000000000", i) for i in range(2)]))
    now = datetime(2026, 5, 4, 6, 0, tzinfo=UTC)
    rule(client, lab.admin, scope="default", max_devices=4)
    _book(session_factory, settings, "alice", [0, 1, 2], "2026-05-04T10:00", "2026-05-04T18:00", now=now)
    with session_factory() as s:
        lock_for_write(s)
        alice = s.scalar(select(User).where(User.username == "alice"))
        data = ReservationCreate(host="node-02", devices=[0, 1], start="2026-05-04T12:00", end="2026-05-04T13:00",
                                 tz="Europe/Berlin")
        with pytest.raises(RuleViolation) as e:
            reservation_service.create_reservation(s, actor=alice, data=data, settings=settings, now=now)
    assert "you hold 3 of 4 devices until 18:00, 1 left" in e.value.detail
    assert e.value.extra["until"] == "2026-05-04T16:00:00+00:00"


def test_released_reservations_are_charged_until_release_and_cancelled_not_at_all(client, lab, session_factory, settings):
    now = datetime(2026, 5, 4, 8, 0, tzinfo=UTC)
    a = _book(session_factory, settings, "alice", [0, 1], "2026-05-04T10:00", "2026-05-04T14:00", now=now)
    b = _book(session_factory, settings, "alice", [2], "2026-05-05T10:00", "2026-05-05T14:00", now=now)
    with transaction(session_factory, write=True) as s:
        alice = s.scalar(select(User).where(User.username == "alice"))
        reservation_service.end_reservation(s, actor=alice, reservation_id=a, now=datetime(2026, 5, 4, 9, 30, tzinfo=UTC))
        reservation_service.end_reservation(s, actor=alice, reservation_id=b, now=now)
    with session_factory() as s:
        alice = s.scalar(select(User).where(User.username == "alice"))
        u = limit_usage.usage(s, user=alice, now=datetime(2026, 5, 6, 8, 0, tzinfo=UTC), tz=BERLIN)
    hours = {i.rule: i for i in u["limits"]}["max_gpu_hours_7d"].used
    assert hours == pytest.approx(2 * 1.5)  # two devices, 08:00Z–09:30Z
    assert u["window"]["start"] == datetime(2026, 4, 29, 22, 0, tzinfo=UTC)  # 30 April 00:00 Berlin
    assert u["window"]["end"] == datetime(2026, 5, 6, 22, 0, tzinfo=UTC)


def test_peak_counts_half_open_intervals():
    t = datetime(2030, 1, 1, tzinfo=UTC)
    h = timedelta(hours=1)
    p = rules_service.peak([(t, t + 2 * h), (t + 2 * h, t + 3 * h), (t + h, t + 3 * h)], t, t + 4 * h)
    assert (p.value, p.since, p.until) == (2, t + h, t + 2 * h)
    assert rules_service.peak([(t, t + h)], t + h, t + 2 * h).value == 0
