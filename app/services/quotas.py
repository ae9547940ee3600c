"""The quantities that sharing rules limit: the owner's reservation rows, the peak of
overlapping intervals (devices or reservations held at once), the owner's device-hours inside
windows, and the lab-zone quota windows ``[00:00 of day D, 00:00 of day D+7)``; plus how limits
and times are worded in refusals. Pure functions except :func:`owner_rows` and
:func:`window_hours` (one query each).

Device-hours are summed by the database (:func:`window_hours`), every window in one
statement: the GPU-hour limits (the rolling 7 days, calendar day, week and month) and the Usage
page read them there, so a handful of numbers reach Python however many reservations the owner
holds in the windows (the database still reads those rows, through the ``(user_id, end_at)``
index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import BigInteger, Dialect, Select, TypeDecorator, bindparam, literal_column, select, true
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeEngine

from app.db import is_sqlite
from app.models import Reservation, ReservationDevice, utcnow
from app.models.base import UTCDateTime

WINDOW_DAYS = 7  # the rolling GPU-hour quota window, in calendar days of the lab zone


def _owned(owner_id: Any, start: Any, end: Any, exclude_id: Any, *, sqlite: bool) -> Select[Any]:
    """(reservation id, start, end) of what counts against the owner's limits over
    ``[start, end)``: the active reserved devices of the owner's reservations that are not
    cancelled (nor ``exclude_id``) and overlap it. Values or bound parameters.

    The owner's reservations are read first, through the ``(user_id, end_at)`` index (a
    reserved device's interval is always its reservation's, set together on create, change
    and release, so the reservation's own ``end_at`` bounds the read and skips the owner's
    past history), then each one's devices by its key. On PostgreSQL the devices are a
    ``LATERAL`` subquery fenced by ``OFFSET 0``: with a plain join, statistics taken before the
    live reservations were booked made the planner read the lab's live reserved devices and,
    for each, the owner's live reservations again. SQLite's planner keeps the join's order.
    """
    owner = (Reservation.user_id == owner_id, Reservation.end_at > start, Reservation.status != "cancelled")
    item = [ReservationDevice.active.is_(True), ReservationDevice.start_at < end, ReservationDevice.end_at > start]
    if exclude_id is not None:
        item.append(ReservationDevice.reservation_id != exclude_id)
    cols = (ReservationDevice.reservation_id, ReservationDevice.start_at, ReservationDevice.end_at)
    if sqlite:
        return select(*cols).join(Reservation, Reservation.id == ReservationDevice.reservation_id).where(*owner, *item)
    items = (select(*cols).where(ReservationDevice.reservation_id == Reservation.id, *item)
             .offset(literal_column("0")).lateral("i"))
    return select(items.c.reservation_id, items.c.start_at, items.c.end_at).select_from(Reservation).join(
        items, true()).where(*owner)


def owner_rows(
    session: Session, *, owner_id: int, start: datetime, end: datetime, exclude_id: int | None
) -> list[tuple[int, datetime, datetime]]:
    """(reservation id, start, end) per reserved device of the owner's active reservations
    overlapping ``[start, end)`` (see :func:`_owned`)."""
    q = _owned(owner_id, start, end, exclude_id, sqlite=is_sqlite(session))
    return [(rid, s, e) for rid, s, e in session.execute(q).all()]


class _instant(FunctionElement[Any]):
    """A UTC timestamp as the window sums compare it: itself on PostgreSQL, on SQLite (where it is
    stored as ``'YYYY-MM-DD HH:MM:SS[.ffffff]'``) the exact integer microseconds since 1970."""

    inherit_cache = True


@compiles(_instant)
def _instant_default(element: _instant, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(_instant, "sqlite")
def _instant_sqlite(element: _instant, compiler: SQLCompiler, **kw: Any) -> str:
    # whole seconds from the first 19 characters (strftime would round a fraction to
    # milliseconds first), microseconds from the rest
    x = compiler.process(element.clauses, **kw)
    return f"(CAST(strftime('%s', substr({x}, 1, 19)) AS INTEGER) * 1000000 + CAST(substr({x}, 21, 6) AS INTEGER))"


class _clipped_us(FunctionElement[int]):
    """``_clipped_us(s, e, ws, we)``: the sum over the rows of ``[s, e)`` inside ``[ws, we)``
    (:class:`_instant` values), in exact integer microseconds (0 without rows)."""

    type = BigInteger()
    inherit_cache = True


@compiles(_clipped_us)
def _clipped_us_default(element: _clipped_us, compiler: SQLCompiler, **kw: Any) -> str:
    # timestamp arithmetic: intervals are exact integers (days and microseconds) and cheap,
    # the one EXTRACT (numeric since PostgreSQL 14) is done once per window
    s, e, ws, we = (compiler.process(c, **kw) for c in element.clauses)
    return (f"CAST(EXTRACT(EPOCH FROM COALESCE(SUM(GREATEST(LEAST({e}, {we}) - GREATEST({s}, {ws}), INTERVAL '0')), "
            f"INTERVAL '0')) * 1000000 AS BIGINT)")


@compiles(_clipped_us, "sqlite")
def _clipped_us_sqlite(element: _clipped_us, compiler: SQLCompiler, **kw: Any) -> str:
    s, e, ws, we = (compiler.process(c, **kw) for c in element.clauses)
    return f"COALESCE(SUM(max(0, min({e}, {we}) - max({s}, {ws}))), 0)"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _InstantParam(TypeDecorator[datetime]):
    """A window bound (aware UTC) sent as :class:`_instant` compares it: a timestamp on PostgreSQL,
    integer microseconds since 1970 on SQLite."""

    impl = UTCDateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(BigInteger() if dialect.name == "sqlite" else UTCDateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None or dialect.name != "sqlite":
            return value
        return (value - _EPOCH) // timedelta(microseconds=1)


@lru_cache(maxsize=64)
def _window_sums(windows: int, exclude: bool, sqlite: bool) -> Select[Any]:
    """The statement of :func:`window_hours` for ``windows`` windows (parameters ``owner_id``,
    ``lo``, ``hi``, ``exclude_id``, ``ws<i>``, ``we<i>``), built once per shape: building it
    costs more than running it."""
    when, bound = UTCDateTime(), _InstantParam()
    owned = _owned(bindparam("owner_id"), bindparam("lo", type_=when), bindparam("hi", type_=when),
                   bindparam("exclude_id") if exclude else None, sqlite=sqlite)
    _rid, start, end = owned.selected_columns
    held = owned.with_only_columns(_instant(start).label("s"), _instant(end).label("e"), maintain_column_froms=False)
    if sqlite:  # keep the rows apart from the sums, or SQLite converts each row's times once per window
        held = held.offset(0)
    held = held.subquery()
    return select(*(_clipped_us(held.c.s, held.c.e, bindparam(f"ws{i}", type_=bound), bindparam(f"we{i}", type_=bound))
                    for i in range(windows)))


_US_PER_HOUR = 3_600_000_000


def window_hours(
    session: Session, *, owner_id: int, windows: Sequence[tuple[datetime, datetime]], exclude_id: int | None
) -> dict[tuple[datetime, datetime], float]:
    """The owner's device-hours (real elapsed time) inside each window ``[ws, we)`` (aware UTC):
    for every active reserved device of the owner's reservations (:func:`_owned`, less
    ``exclude_id``), the part of its interval inside the window, summed. One statement for all
    the windows, returning one number each (the database sums exact microseconds); ``{}``
    without windows. Keyed by ``(ws, we)``; a repeated window is read once.
    """
    keys = list(dict.fromkeys(windows))
    if not keys:
        return {}
    params: dict[str, Any] = {"owner_id": owner_id, "lo": min(ws for ws, _ in keys), "hi": max(we for _, we in keys),
                              "exclude_id": exclude_id}
    for i, (ws, we) in enumerate(keys):
        params[f"ws{i}"], params[f"we{i}"] = ws, we
    got = session.execute(_window_sums(len(keys), exclude_id is not None, is_sqlite(session)), params).one()
    return {k: int(us) / _US_PER_HOUR for k, us in zip(keys, got)}


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


_EPS = 1e-9  # GPU-hours: float sums a hair over a limit they meet exactly do not break it


def requested_hours(devices: int, start: datetime, end: datetime, ws: datetime, we: datetime) -> float:
    """The device-hours a request of ``devices`` over ``[start, end)`` adds inside the window
    ``[ws, we)`` (real elapsed time; 0 when they do not overlap)."""
    return devices * max(0.0, (min(end, we) - max(start, ws)).total_seconds()) / 3600.0


def overfills(used: float, needed: float, limit: float) -> bool:
    """Whether adding ``needed`` GPU-hours to a window holding ``used`` breaks ``limit`` (a
    request that adds nothing there breaks nothing)."""
    return needed > 0 and used + needed > limit + _EPS


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
