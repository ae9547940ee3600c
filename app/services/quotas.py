"""The quantities that sharing rules limit: the owner's reservation rows, the peak of
overlapping intervals (devices or reservations held at once), device-hours inside a window,
and the lab-zone quota windows ``[00:00 of day D, 00:00 of day D+7)``; plus how limits and
times are worded in refusals. Pure functions except :func:`owner_rows` (one query).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Reservation, ReservationDevice, utcnow

WINDOW_DAYS = 7  # the rolling GPU-hour quota window, in calendar days of the lab zone


def owner_rows(
    session: Session, *, owner_id: int, start: datetime, end: datetime, exclude_id: int | None
) -> list[tuple[int, datetime, datetime]]:
    """(reservation id, start, end) per reserved device of the owner's active reservations
    overlapping ``[start, end)``.

    A reserved device's interval is always its reservation's (set together on create,
    change and release), so the reservation's own ``end_at`` bounds the read too: it lets
    the ``(user_id, end_at)`` index skip the owner's past history.
    """
    q = (
        select(ReservationDevice.reservation_id, ReservationDevice.start_at, ReservationDevice.end_at)
        .join(Reservation, Reservation.id == ReservationDevice.reservation_id)
        .where(
            Reservation.user_id == owner_id,
            Reservation.end_at > start,
            Reservation.status != "cancelled",
            ReservationDevice.active.is_(True),
            ReservationDevice.start_at < end,
            ReservationDevice.end_at > start,
        )
    )
    if exclude_id is not None:
        q = q.where(ReservationDevice.reservation_id != exclude_id)
    return [(rid, s, e) for rid, s, e in session.execute(q).all()]


@dataclass(frozen=True)
class Peak:
    """The largest simultaneous count inside a window and the segment where it first holds."""

    value: int
    since: datetime | None = None
    until: datetime | None = None


def peak(intervals: Sequence[tuple[datetime, datetime]], start: datetime, end: datetime) -> Peak:
    """Maximum number of ``intervals`` (half-open) overlapping at one instant of ``[start, end)``.

    ``since`` is the first instant with that count; ``until`` is when the first of the
    intervals held then ends (possibly after ``end``: the real release time).
    """
    events: list[tuple[datetime, int]] = []
    for s, e in intervals:
        if s < end and e > start and s < e:
            events += [(s, 1), (e, -1)]
    if not events:
        return Peak(0)
    events.sort(key=lambda x: (x[0], x[1]))  # ends before starts at the same instant
    best = Peak(0)
    cur = 0
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            cur += events[i][1]
            i += 1
        nxt = events[i][0] if i < len(events) else None
        relevant = t < end and (nxt is None or nxt > start)
        if relevant and cur > best.value:
            best = Peak(cur, max(t, start), None)
    if best.since is not None:
        held = [e for s, e in intervals if s <= best.since < e]
        best = Peak(best.value, best.since, min(held))
    return best


def lab_midnight(day: date, tz: ZoneInfo) -> datetime:
    """00:00 of ``day`` in ``tz`` as UTC (a midnight inside a DST gap resolves forward)."""
    return datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)


def quota_window(day: date, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The 7-day GPU-hour window starting on ``day``: ``[00:00 day, 00:00 day+7)`` in ``tz``."""
    return lab_midnight(day, tz), lab_midnight(day + timedelta(days=WINDOW_DAYS), tz)


def device_hours(rows: Sequence[tuple[int, datetime, datetime]], ws: datetime, we: datetime) -> float:
    """Device-hours (real elapsed) of ``rows`` inside ``[ws, we)``."""
    total = 0.0
    for _rid, s, e in rows:
        overlap = (min(e, we) - max(s, ws)).total_seconds()
        if overlap > 0:
            total += overlap
    return total / 3600.0


def fmt_local(dt: datetime, tz: ZoneInfo, now: datetime | None = None) -> str:
    """``18:00`` today, ``Tue 24 Mar 18:00`` another day (with the year if not this year), in
    ``tz``; ``open-ended`` for an instant the zone cannot show (the end of year 9999 UTC)."""
    try:
        local = dt.astimezone(tz)
    except OverflowError:
        return "open-ended"
    ref = (now or utcnow()).astimezone(tz)
    if local.date() == ref.date():
        return local.strftime("%H:%M")
    if local.year == ref.year:
        return local.strftime("%a %d %b %H:%M")
    return local.strftime("%a %d %b %Y %H:%M")


def fmt_hours(h: float) -> str:
    return f"{h:.1f}".rstrip("0").rstrip(".") if abs(h - round(h, 1)) < 1e-9 else f"{h:.2f}"
