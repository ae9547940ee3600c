"""The owner's device-hours per window as the database sums them (``quotas.window_hours``, one
statement) equal what the Python sum over the owner's rows gave before (``device_hours`` below,
the former ``app.services.quotas.device_hours``), on random reservations around the 2026 DST
changes in Berlin: half-open intervals, microseconds, 23 h and 25 h days, cancelled
reservations, inactive device rows, other owners and an extension's ``exclude_id`` (both
databases).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from app.models import Device, Host, Reservation, ReservationDevice, User
from app.services.calendar_quotas import window_of
from app.services.quotas import owner_rows, quota_window, window_hours

BERLIN = ZoneInfo("Europe/Berlin")
SPRING, AUTUMN = date(2026, 3, 29), date(2026, 10, 25)  # 23 h and 25 h days in Berlin
_users = itertools.count()


def device_hours(rows: Sequence[tuple[int, datetime, datetime]], ws: datetime, we: datetime) -> float:
    """Device-hours (real elapsed) of ``rows`` inside ``[ws, we)``: the Python sum the quota
    checks used before the database summed them (kept here as the reference)."""
    total = 0.0
    for _rid, s, e in rows:
        overlap = (min(e, we) - max(s, ws)).total_seconds()
        if overlap > 0:
            total += overlap
    return total / 3600.0


def _windows(around: date) -> list[tuple[datetime, datetime]]:
    """The rolling windows of the 13 days around ``around`` and its calendar day, week and month."""
    out = [quota_window(around + timedelta(days=d), BERLIN) for d in range(-8, 5)]
    for kind in ("day", "week", "month"):
        w = window_of(kind, around, BERLIN)
        out.append((w.start, w.end))
    return out


# one reserved interval: gap after the previous one on the same device, length (both in
# seconds), microseconds of start and end, status, and whether the device row is active
_micro = st.one_of(st.integers(min_value=0, max_value=999_999), st.sampled_from([999_500, 999_999]))
_piece = st.tuples(
    st.integers(min_value=0, max_value=30 * 3600),
    st.integers(min_value=1, max_value=40 * 3600),
    _micro,
    _micro,
    st.sampled_from(["confirmed", "confirmed", "released", "cancelled"]),
    st.booleans(),
)


def _seed(s, *, owner: int, other: int, host: int, devices: list[int], base: datetime, chains,
          whole: bool) -> dict[int, tuple[datetime, datetime] | None]:
    """Insert one chain of intervals per device (none overlap on a device, so any of them may be
    active, cancelled ones too); every fourth reservation is ``other``'s. Returns the owner's
    reservations by id: the interval where it counts, ``None`` where it does not (cancelled,
    or its device row inactive)."""
    mine: dict[int, tuple[datetime, datetime] | None] = {}
    for dev, chain in zip(devices, chains):
        t = base
        for k, (gap, length, us_s, us_e, status, active) in enumerate(chain):
            start = t + timedelta(seconds=gap, microseconds=0 if whole else us_s)
            end = start + timedelta(seconds=length, microseconds=0 if whole else us_e)
            t = end
            who = other if k % 4 == 3 else owner
            r = Reservation(user_id=who, host_id=host, start_at=start, end_at=end, status=status)
            r.items = [ReservationDevice(device_id=dev, physical_id=dev, slice_kind=0, start_at=start, end_at=end,
                                         active=active)]
            s.add(r)
            s.flush()
            if who == owner:
                mine[r.id] = (start, end) if active and status != "cancelled" else None
    return mine


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chains=st.lists(st.lists(_piece, max_size=8), min_size=4, max_size=4), around=st.sampled_from([SPRING, AUTUMN]),
       lead=st.integers(min_value=0, max_value=9 * 24), whole=st.booleans(), exclude=st.integers(min_value=0, max_value=9))
def test_database_sums_equal_the_python_sums(session_factory, lab, make_user, chains, around, lead, whole, exclude):
    n = next(_users)
    make_user(f"sum{n}")
    with session_factory() as s:
        owner = s.scalar(select(User.id).where(User.username == f"sum{n}"))
        other = s.scalar(select(User.id).where(User.username == "bob"))
        host = s.scalar(select(Host.id).where(Host.name == "node-01"))
        devices = list(s.scalars(select(Device.id).where(Device.host_id == host).order_by(Device.id)))
        base = quota_window(around, BERLIN)[0] - timedelta(hours=lead)
        mine = _seed(s, owner=owner, other=other, host=host, devices=devices, base=base, chains=chains, whole=whole)
        s.flush()
        windows = _windows(around)
        for exclude_id in (None, list(mine)[exclude % len(mine)] if mine else None):
            got = window_hours(s, owner_id=owner, windows=windows, exclude_id=exclude_id)
            for ws, we in windows:
                counted = [v for rid, v in mine.items() if v is not None and rid != exclude_id]
                exact = sum(max(timedelta(0), min(e, we) - max(b, ws)) // timedelta(microseconds=1) for b, e in counted)
                assert got[(ws, we)] == exact / 3_600_000_000, (ws, we)  # what counts, to the microsecond
                rows = owner_rows(s, owner_id=owner, start=ws, end=we, exclude_id=exclude_id)
                old = device_hours(rows, ws, we)
                if whole:  # whole seconds: the same float, bit for bit
                    assert got[(ws, we)] == old, (ws, we)
                else:  # the database sums exact microseconds; Python summed rounded seconds
                    assert got[(ws, we)] == pytest.approx(old, rel=1e-12, abs=1e-12), (ws, we)
        s.rollback()  # the next example reuses the devices and times


def test_window_edges_are_half_open_and_dst_days_count_real_hours(session_factory, lab):
    with session_factory() as s:
        alice = s.scalar(select(User.id).where(User.username == "alice"))
        host = s.scalar(select(Host.id).where(Host.name == "node-01"))
        devices = list(s.scalars(select(Device.id).where(Device.host_id == host).order_by(Device.id)))
        autumn = window_of("day", AUTUMN, BERLIN)  # 25 h
        spring = window_of("day", SPRING, BERLIN)  # 23 h
        tick = timedelta(microseconds=1)
        spans = [(autumn.start, autumn.end),  # the whole 25-hour day
                 (spring.start, spring.end),  # the whole 23-hour day
                 (spring.end - tick, spring.end + timedelta(hours=1)),  # one microsecond before the next day
                 (datetime(2026, 6, 1, 9, 59, 59, 999_600, tzinfo=UTC), datetime(2026, 6, 1, 10, 59, 59, 999_999, tzinfo=UTC))]
        for dev, (start, end) in zip(devices, spans):
            r = Reservation(user_id=alice, host_id=host, start_at=start, end_at=end)
            r.items = [ReservationDevice(device_id=dev, physical_id=dev, slice_kind=0, start_at=start, end_at=end)]
            s.add(r)
            s.flush()
        june = (datetime(2026, 6, 1, 9, tzinfo=UTC), datetime(2026, 6, 1, 12, tzinfo=UTC))
        got = window_hours(s, owner_id=alice, windows=[(autumn.start, autumn.end), (spring.start, spring.end),
                                                        (spring.end, spring.end + timedelta(days=1)), june],
                           exclude_id=None)
        assert got[(autumn.start, autumn.end)] == 25
        assert got[(spring.start, spring.end)] == 23 + 1 / 3_600_000_000  # its day and the next's first microsecond
        assert got[(spring.end, spring.end + timedelta(days=1))] == 1  # from 00:00: the rest of that one, 1 h
        # fractions of a second near a whole one are not rounded (SQLite's strftime keeps milliseconds)
        assert got[june] == (3600 * 1_000_000 + 399) / 3_600_000_000
        assert window_hours(s, owner_id=alice, windows=[], exclude_id=None) == {}
        s.rollback()
