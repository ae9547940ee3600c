"""Recurring reservations: B26, B27, B28 with their 2026 dates (services, injected ``now``),
the API with dates shifted to a future year, conflicts per occurrence, all-or-nothing,
rules per occurrence, preview == stored, cancelling one occurrence or the series."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, select

from app.db import lock_for_write, transaction
from app.errors import InvalidInput, ReservationConflict, RuleViolation
from app.models import Reservation, ReservationSeries, User
from app.schemas.reservation import ReservationCreate
from app.schemas.series import SeriesCreate
from app.services import reservations as reservation_service
from app.services import series as series_service
from tests.conftest import process_timezone
from tests.rules.helpers import book, rule

BERLIN = ZoneInfo("Europe/Berlin")


def _series(session_factory, settings, who="alice", *, now, **fields):
    """Create (or dry-run) a series through the service at ``now``; commits unless it raises."""
    body = {"host": "node-01", "devices": [0], "freq": "weekly", **fields}
    with session_factory() as s:
        lock_for_write(s)
        actor = s.scalar(select(User).where(User.username == who))
        try:
            out = series_service.create_series(s, actor=actor, data=SeriesCreate(**body), settings=settings, now=now)
        except Exception:
            s.rollback()
            raise
        s.commit()
        return out


def _count(session_factory, *where):
    with session_factory() as s:
        return s.scalar(select(func.count()).select_from(Reservation).where(*where))


def _starts(read):
    return [o.start for o in read.occurrences]


@pytest.fixture(params=["America/Los_Angeles", "Asia/Tokyo"])
def client_tz(request):
    with process_timezone(request.param):
        yield request.param


# ---------------------------------------------------------------------------- B26


def test_b26_weekly_thursday_new_york_crosses_dst_end(client, lab, session_factory, settings):
    read = _series(session_factory, settings, now=datetime(2026, 10, 1, tzinfo=UTC), weekdays=["TH"],
                   start_date="2026-10-22", start_time="18:00", duration="PT2H", tz="America/New_York", count=4)
    assert _starts(read) == [datetime(2026, 10, 22, 22, tzinfo=UTC), datetime(2026, 10, 29, 22, tzinfo=UTC),
                             datetime(2026, 11, 5, 23, tzinfo=UTC), datetime(2026, 11, 12, 23, tzinfo=UTC)]
    ny = ZoneInfo("America/New_York")
    assert all(o.start.astimezone(ny).strftime("%a %H:%M") == "Thu 18:00" for o in read.occurrences)
    assert all(o.end - o.start == timedelta(hours=2) for o in read.occurrences)
    assert [o.local_start for o in read.occurrences][2] == "2026-11-05T18:00-05:00"


def test_b26_blackout_every_day_but_thursday_keeps_thursdays_free(client, lab, session_factory, settings):
    hel = ZoneInfo("Europe/Helsinki")
    read = _series(session_factory, settings, now=datetime(2026, 10, 1, tzinfo=UTC), weekdays=["MO", "TU", "WE", "FR", "SA", "SU"],
                   start_date="2026-10-19", until="2026-11-08", start_time="00:00", duration="P1D", tz="Europe/Helsinki")
    assert len(read.occurrences) == 18
    for o in read.occurrences:
        s, e = o.start.astimezone(hel), o.end.astimezone(hel)
        assert s.weekday() != 3 and (s.hour, s.minute) == (0, 0) and (e.hour, e.minute) == (0, 0)
        assert e.date() - s.date() == timedelta(days=1)
    lengths = {o.start.astimezone(hel).date(): o.end - o.start for o in read.occurrences}
    assert lengths[date(2026, 10, 25)] == timedelta(hours=25)  # the DST end in Helsinki
    # each Thursday is bookable in full, in every week
    for thursday in ("2026-10-22", "2026-10-29", "2026-11-05"):
        with transaction(session_factory, write=True) as s:
            bob = s.scalar(select(User).where(User.username == "bob"))
            day = date.fromisoformat(thursday)
            data = ReservationCreate(host="node-01", devices=[0], start=f"{day}T00:00", end=f"{day + timedelta(days=1)}T00:00",
                                     tz="Europe/Helsinki")
            reservation_service.create_reservation(s, actor=bob, data=data, settings=settings,
                                                   now=datetime(2026, 10, 1, tzinfo=UTC))


def test_b26_until_is_an_inclusive_date_in_the_series_zone_whatever_the_client_zone(
        client, lab, session_factory, settings, client_tz):
    now = datetime(2026, 10, 1, tzinfo=UTC)
    # 18:00 in Los Angeles on 12 Nov is 02:00Z on the 13th: a UTC reading of the date would drop it
    la = _series(session_factory, settings, now=now, weekdays=["TH"], start_date="2026-10-22", until="2026-11-12",
                 start_time="18:00", duration="PT1H", tz="America/Los_Angeles", dry_run=True)
    assert la.occurrences[-1].start.astimezone(ZoneInfo("America/Los_Angeles")).date() == date(2026, 11, 12)
    assert la.occurrences[-1].start == datetime(2026, 11, 13, 2, tzinfo=UTC)
    # 08:00 in Tokyo on 12 Nov is 23:00Z on the 11th
    tk = _series(session_factory, settings, now=now, devices=[1], weekdays=["TH"], start_date="2026-10-22", until="2026-11-12",
                 start_time="08:00", duration="PT1H", tz="Asia/Tokyo")
    assert [o.start.astimezone(ZoneInfo("Asia/Tokyo")).date() for o in tk.occurrences][-1] == date(2026, 11, 12)
    assert len(tk.occurrences) == 4
    # without tz the lab zone applies
    lab_zone = _series(session_factory, settings, now=now, devices=[2], weekdays=["TH"], start_date="2026-10-22",
                       until="2026-11-12", start_time="23:30", duration="PT30M")
    assert lab_zone.tz == "Europe/Berlin" and lab_zone.occurrences[-1].start == datetime(2026, 11, 12, 22, 30, tzinfo=UTC)


# ---------------------------------------------------------------------------- B27


def test_b27_series_first_then_single_booking_is_refused(client, lab, session_factory, settings):
    now = datetime(2026, 3, 1, tzinfo=UTC)
    read = _series(session_factory, settings, now=now, freq="daily", start_date="2026-03-20", until="2026-04-08",
                   start_time="09:00", duration="PT1H")
    assert len(read.occurrences) == 20
    by_day = {o.start.astimezone(BERLIN).date(): o for o in read.occurrences}
    assert by_day[date(2026, 3, 28)].start == datetime(2026, 3, 28, 8, tzinfo=UTC)  # CET
    assert by_day[date(2026, 4, 2)].start == datetime(2026, 4, 2, 7, tzinfo=UTC)  # CEST
    with session_factory() as s, pytest.raises(ReservationConflict) as e:
        lock_for_write(s)
        bob = s.scalar(select(User).where(User.username == "bob"))
        data = ReservationCreate(host="node-01", devices=[0], start="2026-04-02T09:30", end="2026-04-02T10:30", tz="Europe/Berlin")
        reservation_service.create_reservation(s, actor=bob, data=data, settings=settings, now=now)
    assert e.value.extra["conflicts"][0]["id"] == by_day[date(2026, 4, 2)].id


def test_b27_single_booking_first_then_series_is_refused_naming_the_occurrence(client, lab, session_factory, settings):
    now = datetime(2026, 3, 1, tzinfo=UTC)
    with transaction(session_factory, write=True) as s:
        bob = s.scalar(select(User).where(User.username == "bob"))
        data = ReservationCreate(host="node-01", devices=[0], start="2026-04-02T09:30", end="2026-04-02T10:30", tz="Europe/Berlin")
        b = reservation_service.create_reservation(s, actor=bob, data=data, settings=settings, now=now)
    assert b.start_at == datetime(2026, 4, 2, 7, 30, tzinfo=UTC)
    for dry_run in (True, False):
        with pytest.raises(ReservationConflict) as e:
            _series(session_factory, settings, now=now, freq="daily", start_date="2026-03-20", until="2026-04-08",
                    start_time="09:00", duration="PT1H", dry_run=dry_run)
        [occ] = e.value.extra["occurrences"]
        assert occ["start"] == "2026-04-02T07:00:00+00:00" and occ["local_start"] == "2026-04-02T09:00+02:00"
        assert occ["conflicts"][0]["id"] == b.id and occ["conflicts"][0]["user"] == "bob"
        assert "1 of 20 occurrences conflict" in e.value.detail
    # all or nothing: no series, no occurrence
    assert _count(session_factory, Reservation.series_id.is_not(None)) == 0
    with session_factory() as s:
        assert s.scalar(select(func.count()).select_from(ReservationSeries)) == 0


# ---------------------------------------------------------------------------- B28


@pytest.mark.parametrize(("fields", "expected"), [
    ({"freq": "monthly", "start_date": "2026-01-31", "until": "2026-06-30"}, ["2026-01-31", "2026-03-31", "2026-05-31"]),
    ({"freq": "weekly", "interval": 2, "start_date": "2026-05-25", "until": "2026-06-09"}, ["2026-05-25", "2026-06-08"]),
    ({"freq": "monthly", "start_date": "2026-01-29", "until": "2026-04-30"}, ["2026-01-29", "2026-03-29", "2026-04-29"]),
])
def test_b28_rfc5545_monthly_and_biweekly_and_the_preview_is_what_is_stored(
        client, lab, session_factory, settings, fields, expected):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    common = {"start_time": "10:00", "duration": "PT1H", **fields}
    preview = _series(session_factory, settings, now=now, dry_run=True, **common)
    assert preview.dry_run and preview.id is None
    assert [o.start.astimezone(BERLIN).date().isoformat() for o in preview.occurrences] == expected
    assert _count(session_factory) == 0
    stored = _series(session_factory, settings, now=now, **common)
    assert [(o.start, o.end) for o in stored.occurrences] == [(o.start, o.end) for o in preview.occurrences]
    via_api = client.get(f"/api/v1/series/{stored.id}", headers=lab.alice.headers).json()
    assert [datetime.fromisoformat(o["start"]) for o in via_api["occurrences"]] == _starts(preview)


def test_b28_expansion_matches_dateutil_rrule():
    rrule_mod = pytest.importorskip("dateutil.rrule")
    cases = [
        ("monthly", 1, None, date(2026, 1, 31), date(2026, 12, 31), rrule_mod.MONTHLY, {"bymonthday": 31}),
        ("monthly", 1, None, date(2026, 1, 29), date(2028, 4, 30), rrule_mod.MONTHLY, {"bymonthday": 29}),
        ("weekly", 2, [0, 3], date(2026, 5, 27), date(2026, 9, 1), rrule_mod.WEEKLY, {"byweekday": (0, 3), "wkst": 0}),
        ("daily", 3, None, date(2026, 2, 26), date(2026, 4, 1), rrule_mod.DAILY, {}),
    ]
    for freq, interval, wd, start, until, rfreq, kw in cases:
        ours = series_service.occurrence_days(freq=freq, interval=interval, weekdays=wd, start_date=start, until=until, count=None)
        theirs = [d.date() for d in rrule_mod.rrule(rfreq, interval=interval, dtstart=datetime.combine(start, datetime.min.time()),
                                                    until=datetime.combine(until, datetime.min.time()), **kw)]
        assert ours == theirs, (freq, interval, wd, start)


# ---------------------------------------------------------------------------- semantics and errors


def test_spring_forward_gap_takes_the_offset_before_it_and_days_are_calendar_days():
    tz = BERLIN
    s, e = series_service.occurrence_interval(date(2026, 3, 29), datetime.strptime("02:30", "%H:%M").time(), timedelta(hours=1), tz)
    assert s == datetime(2026, 3, 29, 1, 30, tzinfo=UTC) and s.astimezone(tz).strftime("%H:%M") == "03:30"
    assert e - s == timedelta(hours=1)
    s, e = series_service.occurrence_interval(date(2026, 3, 29), datetime.strptime("00:00", "%H:%M").time(), timedelta(days=1), tz)
    assert e - s == timedelta(hours=23)


@pytest.mark.parametrize(("fields", "field"), [
    ({"start_date": "2031-01-06", "start_time": "10:00", "duration": "PT1H"}, "until"),
    ({"start_date": "2031-01-06", "start_time": "10:00", "duration": "PT1H", "count": 2, "weekdays": ["XX"]}, "weekdays"),
    ({"start_date": "2031-01-06", "start_time": "25:00", "duration": "PT1H", "count": 2}, "start_time"),
    ({"start_date": "2031-01-06", "start_time": "10:00", "duration": "PT1H", "count": 2, "tz": "Mars/Olympus"}, "tz"),
    ({"start_date": "2020-01-06", "start_time": "10:00", "duration": "PT1H", "count": 2}, "start_date"),
    ({"start_date": "2031-01-06", "start_time": "10:00", "duration": "P8D", "count": 2}, "duration"),
    ({"start_date": "2031-01-06", "start_time": "10:00", "duration": "PT1H", "until": "2031-01-01"}, "until"),
    ({"start_date": "2031-01-06", "start_time": "10:00", "duration": "PT1H", "until": "2040-01-01", "freq": "daily"}, "until"),
    ({"start_date": "2031-01-06", "start_time": "10:00", "duration": "PT1H", "count": 2, "freq": "monthly", "weekdays": ["MO"]}, "weekdays"),
    ({"start_date": "2031-01-06", "start_time": "10:00", "duration": "PT1H", "count": 2, "devices": ["GPU-nope"]}, "devices"),
])
def test_bad_series_input_gets_422_naming_the_field(client, lab, fields, field):
    body = {"host": "node-01", "devices": [0], "freq": "weekly", **fields}
    r = client.post("/api/v1/series", json=body, headers=lab.alice.headers)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()


def _future_thursday_before_us_dst_end() -> date:
    """A Thursday 10 days before the first Sunday of November of next year (DST end in the US)."""
    year = datetime.now(UTC).year + 1
    first_sunday = next(date(year, 11, d) for d in range(1, 8) if date(year, 11, d).weekday() == 6)
    return first_sunday - timedelta(days=10)


def test_api_series_new_york_in_a_future_year_and_cancelling(client, lab):
    start = _future_thursday_before_us_dst_end()
    body = {"host": "node-01", "devices": [1], "freq": "weekly", "weekdays": ["TH"], "start_date": start.isoformat(),
            "start_time": "18:00", "duration": "PT2H", "tz": "America/New_York", "count": 4}
    preview = client.post("/api/v1/series", json={**body, "dry_run": True}, headers=lab.alice.headers)
    assert preview.status_code == 200 and preview.json()["id"] is None
    r = client.post("/api/v1/series", json=body, headers=lab.alice.headers)
    assert r.status_code == 201, r.text
    doc = r.json()
    assert r.headers["location"] == f"/api/v1/series/{doc['id']}"
    hours = [datetime.fromisoformat(o["start"]).astimezone(UTC).hour for o in doc["occurrences"]]
    assert hours == [22, 22, 23, 23]
    assert [o["start"] for o in doc["occurrences"]] == [o["start"] for o in preview.json()["occurrences"]]
    # each occurrence is a reservation of the series
    occ = doc["occurrences"]
    one = client.get(f"/api/v1/reservations/{occ[1]['id']}", headers=lab.alice.headers).json()
    assert one["series_id"] == doc["id"]
    # cancel one occurrence
    r = client.delete(f"/api/v1/reservations/{occ[1]['id']}", headers=lab.alice.headers)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    got = client.get(f"/api/v1/series/{doc['id']}", headers=lab.bob.headers).json()
    assert [o["state"] for o in got["occurrences"]] == ["upcoming", "cancelled", "upcoming", "upcoming"]
    assert [o["sequence"] for o in got["occurrences"]] == [0, 1, 0, 0]
    # bob may not cancel alice's series; alice may
    assert client.delete(f"/api/v1/series/{doc['id']}", headers=lab.bob.headers).status_code == 403
    r = client.delete(f"/api/v1/series/{doc['id']}", headers=lab.alice.headers)
    assert r.status_code == 200 and r.json()["cancelled"] == 3 and r.json()["cancelled_at"] is not None
    assert {o["state"] for o in r.json()["occurrences"]} == {"cancelled"}
    # the slots are free again
    assert book(client, lab.bob, [1], occ[2]["start"], occ[2]["end"]).status_code == 201
    assert [s["id"] for s in client.get("/api/v1/series", params={"user": "alice"}, headers=lab.bob.headers).json()] == [doc["id"]]


def test_api_series_conflicts_are_listed_per_occurrence_and_nothing_is_stored(client, lab):
    year = datetime.now(UTC).year + 1
    body = {"host": "node-01", "devices": [2], "freq": "daily", "start_date": f"{year}-03-20", "until": f"{year}-04-08",
            "start_time": "09:00", "duration": "PT1H"}
    first = book(client, lab.bob, [2], f"{year}-03-25T09:30", f"{year}-03-25T10:30", tz="Europe/Berlin")
    second = book(client, lab.bob, [2], f"{year}-04-02T08:00", f"{year}-04-02T09:30", tz="Europe/Berlin")
    assert first.status_code == second.status_code == 201
    r = client.post("/api/v1/series", json=body, headers=lab.alice.headers)
    assert r.status_code == 409
    doc = r.json()
    assert [o["local_start"][:10] for o in doc["occurrences"]] == [f"{year}-03-25", f"{year}-04-02"]
    assert [o["conflicts"][0]["id"] for o in doc["occurrences"]] == [first.json()["id"], second.json()["id"]]
    assert client.get("/api/v1/reservations", params={"user": "alice"}, headers=lab.alice.headers).json()["total"] == 0
    assert client.get("/api/v1/series", headers=lab.alice.headers).json() == []


def test_series_occurrences_are_rules_checked_together(client, lab, session_factory, settings):
    rule(client, lab.admin, scope="default", max_gpu_hours_7d=5, max_ahead_seconds=30 * 86400)
    now = datetime(2026, 3, 1, tzinfo=UTC)
    with pytest.raises(RuleViolation) as e:  # 6 daily hours in one week: the 6th breaks the 5 GPU-hours
        _series(session_factory, settings, now=now, freq="daily", start_date="2026-03-02", count=6, start_time="09:00",
                duration="PT1H")
    assert e.value.extra["rule"] == "max_gpu_hours_7d" and "occurrence 2026-03-07T09:00+01:00" in e.value.detail
    with pytest.raises(RuleViolation) as e:  # the 6th weekly occurrence starts more than 30 days ahead
        _series(session_factory, settings, now=now, start_date="2026-03-02", count=6, start_time="09:00", duration="PT1H")
    assert e.value.extra["rule"] == "max_ahead_seconds" and "occurrence 2026-04-06" in e.value.detail
    assert _count(session_factory) == 0
    ok = _series(session_factory, settings, now=now, start_date="2026-03-02", count=4, start_time="09:00", duration="PT1H")
    assert len(ok.occurrences) == 4


def test_occurrences_overlapping_each_other_are_refused():
    with pytest.raises(InvalidInput) as e:
        series_service.expand(freq="daily", interval=1, weekdays=None, start_date=date(2031, 1, 1),
                              start_time=datetime.strptime("09:00", "%H:%M").time(), duration=timedelta(hours=25),
                              tz=BERLIN, until=None, count=3)
    assert e.value.field == "duration"


def test_a_series_past_year_9999_is_refused_naming_the_field_and_nothing_is_stored(client, lab):
    base = {"host": "node-01", "devices": [0], "freq": "daily", "start_time": "10:00", "count": 3}
    for extra, field in (({"start_date": "2027-01-04", "duration": "P999999999D"}, "duration"),
                         ({"start_date": "9999-12-30", "duration": "PT2H"}, "start_date")):
        r = client.post("/api/v1/series", json={**base, **extra}, headers=lab.alice.headers)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field and "9999" in r.json()["detail"], r.text
    assert client.get("/api/v1/reservations", headers=lab.alice.headers).json()["total"] == 0


def test_a_series_409_names_the_devices_in_the_way_as_a_booking_does(client, lab):
    year = datetime.now(UTC).year + 1
    held = book(client, lab.bob, [0, 1], f"{year}-03-25T09:30", f"{year}-03-25T10:30", tz="Europe/Berlin")
    assert held.status_code == 201, held.text
    body = {"host": "node-01", "devices": [1], "freq": "daily", "start_date": f"{year}-03-20", "until": f"{year}-03-28",
            "start_time": "09:00", "duration": "PT1H", "tz": "Europe/Berlin"}
    r = client.post("/api/v1/series", json=body, headers=lab.alice.headers)
    assert r.status_code == 409, r.text
    [day] = r.json()["occurrences"]
    assert day["conflicts"][0]["devices"] == [lab.devices[1]]  # bob's GPU 0 is not in the way of GPU 1
