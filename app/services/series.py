"""Recurring reservations: expansion (RFC 5545 semantics) and all-or-nothing booking.

Expansion happens in the series' time zone (default: the lab's), so 09:00 stays 09:00
across DST changes; every occurrence is then an ordinary reservation in UTC with
``series_id`` and ``recurrence_start`` set.

* ``daily``: every ``interval`` days from ``start_date`` (``weekdays`` filter the days).
* ``weekly``: in every ``interval``-th week (weeks start on Monday, RFC ``WKST=MO``) on
  ``weekdays`` (default: the weekday of ``start_date``); days before ``start_date`` are
  skipped.
* ``monthly``: on the day of month of ``start_date`` every ``interval`` months; months
  without that day are skipped (RFC ``BYMONTHDAY``: the 31st gives Jan, Mar, May…, never
  "Mar 3" and never a clamped last day; the 29th skips February in common years).
* ``until`` is a date, inclusive, in the series' zone (never parsed as UTC midnight, which
  would move the last occurrence a day for zones west of UTC);
  ``count`` counts occurrences. One of them is required; at most
  :data:`~app.schemas.series.MAX_OCCURRENCES` occurrences.
* A wall time that does not exist on a day (spring-forward gap) is taken with the UTC offset
  before the gap (RFC 5545 3.3.5: 02:30 becomes 03:30); an ambiguous one (fall-back) is the
  first of the two.
* The duration's whole days are calendar days, the rest is exact: ``00:00`` + ``P1D``
  ends at the next midnight also on 23 h and 25 h days; ``09:00`` + ``PT1H`` lasts an hour.

Every occurrence is conflict-checked and rules-checked (the same validator as a single
booking). Conflicts are collected for all occurrences and reported together (409 with
``occurrences``); nothing is stored unless every occurrence can be. ``dry_run`` runs the same
code inside a savepoint that is rolled back, so the preview equals what would be stored.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import Forbidden, InvalidInput, NotFound, ReservationConflict
from app.models import Device, Host, Reservation, ReservationSeries, User, utcnow
from app.schemas.series import MAX_OCCURRENCES, OccurrenceRead, SeriesCreate, SeriesRead
from app.services import hosts as host_service
from app.services import conflicts as conflict_service
from app.services import device_refs
from app.services import lifecycle
from app.services import reservations as reservation_service
from app.services.booking_write import add_reservation
from app.services.intervals import PAST_SLACK
from app.services import rules as rules_service
from app.services import shares as share_service
from app.services.slot_freed import on_slot_freed
from app.timeutil import fmt_duration, zone
from app.services.audit import record_audit

WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
_ALIASES = {name.lower(): i for i, name in enumerate(WEEKDAYS)} | {
    name.lower(): i for i, name in enumerate(("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"))
}
_MAX_STEPS = 100_000


def parse_weekdays(values: list[str] | None) -> list[int] | None:
    """``["MO", "th"]`` → ``[0, 3]`` (sorted, unique); raises InvalidInput naming ``weekdays``."""
    if values is None:
        return None
    out = set()
    for v in values:
        i = _ALIASES.get(str(v).strip().lower())
        if i is None:
            raise InvalidInput(f"weekdays: {v!r} is not one of {' '.join(WEEKDAYS)}", field="weekdays")
        out.add(i)
    if not out:
        raise InvalidInput("weekdays: name at least one day, or leave it out", field="weekdays")
    return sorted(out)


def parse_wall_time(value: str, *, field: str = "start_time") -> time:
    """``HH:MM`` (00:00–23:59) → time; raises InvalidInput naming ``field``."""
    try:
        hh, mm = value.split(":")
        t = time(int(hh), int(mm))
    except ValueError:
        raise InvalidInput(f"{field}: {value!r} is not a wall time HH:MM (00:00–23:59)", field=field) from None
    if len(hh) != 2 or len(mm) != 2:
        raise InvalidInput(f"{field}: {value!r} is not a wall time HH:MM (00:00–23:59)", field=field)
    return t


def occurrence_days(
    *, freq: str, interval: int, weekdays: list[int] | None, start_date: date, until: date | None, count: int | None,
    limit: int = MAX_OCCURRENCES,
) -> list[date]:
    """The days of the rule (see the module docstring), in order.

    Raises InvalidInput naming ``until`` or ``count`` when neither bounds the series or it
    has more than ``limit`` occurrences, ``weekdays`` when given for a monthly series.
    """
    if until is None and count is None:
        raise InvalidInput("until: give 'until' (a date, inclusive) or 'count'", field="until")
    if until is not None and until < start_date:
        raise InvalidInput(f"until: {until} is before start_date {start_date}", field="until")
    if freq == "monthly" and weekdays is not None:
        raise InvalidInput("weekdays: only for daily and weekly series", field="weekdays")
    out: list[date] = []

    def take(d: date) -> bool:
        """Adds ``d``; False once the series is complete."""
        if until is not None and d > until:
            return False
        out.append(d)
        if len(out) > limit:
            raise InvalidInput(f"{'count' if until is None else 'until'}: more than {limit} occurrences; "
                               "split the series", field="until" if until is not None else "count")
        return count is None or len(out) < count

    if freq == "daily":
        for k in range(_MAX_STEPS):
            d = start_date + timedelta(days=k * interval)
            if until is not None and d > until:
                break
            if weekdays is not None and d.weekday() not in weekdays:
                continue
            if not take(d):
                break
    elif freq == "weekly":
        days = weekdays if weekdays is not None else [start_date.weekday()]
        monday = start_date - timedelta(days=start_date.weekday())
        done = False
        for k in range(_MAX_STEPS):
            week = monday + timedelta(weeks=k * interval)
            if until is not None and week > until:
                break
            for wd in days:
                d = week + timedelta(days=wd)
                if d < start_date:
                    continue
                if not take(d):
                    done = True
                    break
            if done:
                break
    elif freq == "monthly":
        for k in range(_MAX_STEPS):
            m0 = start_date.month - 1 + k * interval
            y, m = start_date.year + m0 // 12, m0 % 12 + 1
            if until is not None and date(y, m, 1) > until:
                break
            if start_date.day > calendar.monthrange(y, m)[1]:
                continue  # RFC 5545: a month without that day has no occurrence
            if not take(date(y, m, start_date.day)):
                break
    else:
        raise InvalidInput("freq: one of daily, weekly, monthly", field="freq")
    return out


def occurrence_interval(day: date, start_time: time, duration: timedelta, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """``[start, end)`` in UTC of the occurrence on ``day`` (gap: offset before it; whole
    days of ``duration`` are calendar days)."""
    start = datetime.combine(day, start_time, tzinfo=tz).astimezone(UTC)
    whole = timedelta(days=duration.days)
    end = datetime.combine(day + whole, start_time, tzinfo=tz).astimezone(UTC) + (duration - whole)
    return start, end


def expand(
    *, freq: str, interval: int, weekdays: list[int] | None, start_date: date, start_time: time,
    duration: timedelta, tz: ZoneInfo, until: date | None, count: int | None,
) -> list[tuple[date, datetime, datetime]]:
    """(day, start, end) of every occurrence; raises InvalidInput if occurrences overlap each other
    or the series runs past the calendar's last day (31 December 9999: no date, database or
    feed can hold a later one)."""
    try:
        days = occurrence_days(freq=freq, interval=interval, weekdays=weekdays, start_date=start_date, until=until,
                               count=count)
    except OverflowError:
        raise InvalidInput(f"start_date: a series from {start_date} runs past year 9999", field="start_date") from None
    try:
        out = [(d, *occurrence_interval(d, start_time, duration, tz)) for d in days]
    except OverflowError:
        raise InvalidInput(f"duration: an occurrence of {fmt_duration(duration.total_seconds())} ends after year 9999",
                           field="duration") from None
    for (d1, _s1, e1), (d2, s2, _e2) in zip(out, out[1:]):
        if e1 > s2:
            raise InvalidInput(f"duration: the occurrence of {d1} runs into the one of {d2}; shorten it", field="duration")
    return out


# ---------------------------------------------------------------------------- views


def _local(dt: datetime, tz: ZoneInfo) -> str:
    return dt.astimezone(tz).isoformat(timespec="minutes")


def _occurrences(session: Session, series_id: int) -> list[Reservation]:
    return list(session.scalars(
        select(Reservation).where(Reservation.series_id == series_id).order_by(Reservation.recurrence_start, Reservation.id)
    ))


@dataclass
class _Row:
    id: int | None
    start: datetime
    end: datetime
    state: str
    sequence: int


def _read(s: ReservationSeries, *, user: str, host: str, rows: list[_Row], dry_run: bool) -> SeriesRead:
    tz = ZoneInfo(s.tz)
    return SeriesRead(
        id=None if dry_run else s.id, user=user, host=host, devices=list(s.device_uuids), freq=s.freq,  # type: ignore[arg-type]
        interval=s.interval, weekdays=s.weekdays, start_date=date.fromisoformat(s.start_date), start_time=s.local_start,
        duration_seconds=s.duration_seconds, tz=s.tz, until=date.fromisoformat(s.until_date) if s.until_date else None,
        count=s.count, note=s.note, cancelled_at=s.cancelled_at, dry_run=dry_run,
        occurrences=[OccurrenceRead(id=None if dry_run else r.id, start=r.start, end=r.end, local_start=_local(r.start, tz),
                                    state=r.state, sequence=r.sequence) for r in rows],
    )


def series_read(session: Session, series: ReservationSeries, *, now: datetime | None = None) -> SeriesRead:
    """The API view of a stored series with its occurrences."""
    now = now or utcnow()
    user = session.scalar(select(User.username).where(User.id == series.user_id)) or ""
    host = session.scalar(select(Host.name).where(Host.id == series.host_id)) or ""
    rows = [_Row(r.id, r.start_at, r.end_at, reservation_service.reservation_state(r, now), r.sequence)
            for r in _occurrences(session, series.id)]
    return _read(series, user=user, host=host, rows=rows, dry_run=False)


def get_series(session: Session, series_id: int) -> ReservationSeries:
    s = session.get(ReservationSeries, series_id)
    if s is None:
        raise NotFound(f"series {series_id} not found", field="id")
    return s


def list_series(session: Session, *, user: str | None) -> list[ReservationSeries]:
    """Series, newest first; of ``user`` when given."""
    q = select(ReservationSeries)
    if user:
        q = q.join(User, User.id == ReservationSeries.user_id).where(User.username == user)
    return list(session.scalars(q.order_by(ReservationSeries.id.desc())))


# ---------------------------------------------------------------------------- create / cancel


def _owner(session: Session, actor: User, data: SeriesCreate) -> User:
    return reservation_service.resolve_owner(
        session, actor=actor, username=data.user, override_reason=data.override_reason
    )


def _book(
    session: Session, *, actor: User, owner: User, host: Host, devices: list[Device], data: SeriesCreate,
    settings: Settings, now: datetime, tz: ZoneInfo, start_time: time, weekdays: list[int] | None,
) -> tuple[ReservationSeries, list[_Row]]:
    occ = expand(freq=data.freq, interval=data.interval, weekdays=weekdays, start_date=data.start_date,
                 start_time=start_time, duration=data.duration, tz=tz, until=data.until, count=data.count)
    if not occ:
        raise InvalidInput("until: the rule gives no occurrence up to that date", field="until")
    if occ[0][1] < now - PAST_SLACK:
        raise InvalidInput(f"start_date: the first occurrence ({_local(occ[0][1], tz)}) is in the past", field="start_date")
    series = ReservationSeries(
        user_id=owner.id, host_id=host.id, freq=data.freq, interval=data.interval,
        weekdays=[WEEKDAYS[i] for i in weekdays] if weekdays is not None else None,
        local_start=start_time.strftime("%H:%M"), duration_seconds=int(data.duration.total_seconds()), tz=tz.key,
        start_date=data.start_date.isoformat(), until_date=data.until.isoformat() if data.until else None,
        count=data.count, device_uuids=[d.uuid for d in devices], note=data.note, created_at=now,
    )
    session.add(series)
    session.flush()
    shares = list(data.share_with or [])
    conflicts: list[dict] = []
    rows: list[_Row] = []
    for day, start, end in occ:
        rules_service.validate_reservation(
            session, owner=owner, actor=actor, host=host, devices=devices, start=start, end=end, existing=None,
            override_reason=data.override_reason, now=now, tz=ZoneInfo(settings.timezone),
            label=f"occurrence {_local(start, tz)}",
        )
        clash = conflict_service.find_conflicts(session, devices=devices, start=start, end=end)
        if clash:
            conflicts.append({
                "day": day.isoformat(), "start": start.isoformat(), "end": end.isoformat(), "local_start": _local(start, tz),
                "conflicts": conflict_service.conflict_refs(devices, clash, start, end),
            })
            continue
        r = add_reservation(session, user=owner, host=host, devices=devices, start=start, end=end,
                            values={"status": "confirmed", "note": data.note, "created_by_id": actor.id,
                                    "override_reason": data.override_reason, "series_id": series.id,
                                    "recurrence_start": start, "sequence": 0, "created_at": now, "updated_at": now},
                            shares=share_service.resolve_shares(session, shares), tz=tz)
        rows.append(_Row(r.id, start, end, reservation_service.reservation_state(r, now), 0))
    if conflicts:
        listed = "; ".join(
            f"{c['local_start']} with " + ", ".join(f"#{x['id']} by {x['user']}" for x in c["conflicts"]) for c in conflicts
        )
        raise ReservationConflict(
            f"{len(conflicts)} of {len(occ)} occurrences conflict, nothing was booked: {listed}",
            occurrences=conflicts,
            conflicts=[x for c in conflicts for x in c["conflicts"]],
        )
    record_audit(session, actor=f"user:{actor.username}", action="series.create", target=f"series:{series.id}",
                 detail={"user": owner.username, "occurrences": len(rows),
                         **({"override_reason": data.override_reason} if data.override_reason else {})})
    return series, rows


def create_series(
    session: Session, *, actor: User, data: SeriesCreate, settings: Settings, now: datetime | None = None
) -> SeriesRead:
    """Book every occurrence of the series or none; with ``data.dry_run`` store nothing.

    Raises InvalidInput (422) naming the field (``tz``, ``start_time``, ``weekdays``,
    ``until``, ``count``, ``duration``, ``start_date``, ``devices``), Forbidden (403) for
    booking for others or overriding as a member, RuleViolation (403) naming the rule and
    the occurrence, ReservationConflict (409) listing each conflicting occurrence
    (``occurrences[]``: its start and the reservations in the way).
    """
    now = now or utcnow()
    owner = _owner(session, actor, data)
    tz = zone(data.tz or settings.timezone, field="tz")
    start_time = parse_wall_time(data.start_time)
    weekdays = parse_weekdays(data.weekdays)
    if data.duration.total_seconds() < settings.min_reservation_seconds:
        raise InvalidInput(f"duration: at least {settings.min_reservation_seconds} s", field="duration")
    host = host_service.get_host(session, data.host)
    devices = device_refs.resolve_devices(session, host=host, refs=data.devices)
    device_refs.check_health(session, devices, tz=settings.tz)
    kw = dict(actor=actor, owner=owner, host=host, devices=devices, data=data, settings=settings, now=now, tz=tz,
              start_time=start_time, weekdays=weekdays)
    if not data.dry_run:
        series, rows = _book(session, **kw)  # type: ignore[arg-type]
        return _read(series, user=owner.username, host=host.name, rows=rows, dry_run=False)
    savepoint = session.begin_nested()
    try:
        series, rows = _book(session, **kw)  # type: ignore[arg-type]
        view = _read(series, user=owner.username, host=host.name, rows=rows, dry_run=True)
    finally:
        if savepoint.is_active:
            savepoint.rollback()
    return view


def cancel_series(session: Session, *, actor: User, series_id: int, now: datetime | None = None) -> tuple[ReservationSeries, int, list[int]]:
    """Cancel every upcoming occurrence (status ``cancelled``, ``sequence`` bumped) and mark
    the series cancelled; an active or past occurrence is left as it is.

    Returns (series, number cancelled, ids kept). Raises NotFound, Forbidden (not the
    owner or an admin).
    """
    now = now or utcnow()
    s = get_series(session, series_id)
    if not actor.is_admin and s.user_id != actor.id:
        raise Forbidden(f"series {series_id} is not yours; only its owner or an admin may cancel it")
    cancelled = 0
    kept: list[int] = []
    freed: list[Reservation] = []
    # the occurrences' row locks first, as every state change takes them (app.services.lifecycle)
    lifecycle.lock_rows(session, list(session.scalars(select(Reservation.id).where(Reservation.series_id == s.id))))
    for r in session.scalars(
        select(Reservation).where(Reservation.series_id == s.id).options(*reservation_service.loaded_options())
        .execution_options(populate_existing=True)
    ):
        if (lifecycle.phase(r, now), lifecycle.Action.CANCEL) in lifecycle.TRANSITIONS:
            r.status = lifecycle.Status.CANCELLED
            r.cancelled_at = now
            r.sequence += 1
            r.updated_at = now
            for i in r.items:
                i.active = False
            cancelled += 1
            freed.append(r)
        elif r.status == "confirmed":
            kept.append(r.id)
    if s.cancelled_at is None:
        s.cancelled_at = now
    record_audit(session, actor=f"user:{actor.username}", action="series.cancel", target=f"series:{s.id}",
                 detail={"cancelled": cancelled, "kept": kept})
    session.flush()
    for r in freed:
        on_slot_freed(session, r)
    return s, cancelled, kept
