"""Usage history: the booked-versus-used report, and pruning of the per-minute rollups.

Ingest keeps one ``usage_rollups`` row per device and minute (mean utilization, memory,
the Unix users with processes on it). The report is computed at read time from those rows
and the reservations, so it needs no extra bookkeeping at ingest (``usage_rollups.holder``
stays unused): for every reservation of the users in scope, over each reserved device and
each minute of ``[max(start, period start), min(end, period end, now))``, the minute's
overlap (seconds) is counted as

* **used** when a process of the holder, or of a user or group member the reservation is
  shared with, ran on the device during that minute and the device's mean utilization was
  at least ``threshold_pct`` (or unknown, as NVML reports for MIG instances); for a whole-GPU
  reservation of a GPU in MIG mode, processes on its MIG instances count;
* **idle** when the device was reported but the holder did not compute;
* **unmonitored** when no rollup exists for that minute (the agent was down, or the
  history was pruned), so an outage is never blamed on the holder.

``reserved = used + idle + unmonitored`` holds exactly, in seconds, for every reservation.
Quarantined time and the per-host rows are :mod:`app.services.report_hosts`.

History is kept for ``settings.rollup_retention_days``: :func:`prune_history` deletes older
rollups (and old idempotency keys, :func:`app.services.ingest.prune`) at most once per
:data:`PRUNE_EVERY` across all app processes; the app's lifespan calls it hourly (see
``app.api.reports.install``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.config import Settings
from app.db import advisory_xact_lock
from app.errors import InvalidInput, NotFound
from app.models.reservation import NOT_HELD
from app.models import (
    AuditLog,
    Device,
    Group,
    GroupMember,
    Reservation,
    ReservationDevice,
    ReservationShare,
    UsageRollup,
    User,
)
from app.models.states import FindingKind
from app.schemas.report import ReservationUsage, UsageReport, UserUsage
from app.services import ingest, report_counts, report_hosts
from app.timeutil import parse_instant
from app.services.audit import record_audit

DEFAULT_THRESHOLD_PCT = 5.0  # the agent's default idle threshold (HostPolicy.idle_utilization_pct)
MAX_PERIOD = timedelta(days=366)
PERIOD_MIN = datetime(1970, 1, 1, tzinfo=UTC)
PERIOD_MAX = datetime(9000, 1, 1, tzinfo=UTC)
PRUNE_EVERY = timedelta(hours=1)
PRUNE_ACTION = "history.prune"
PRUNE_LOCK_KEY = 0x67707275_6E65  # pg advisory lock: one pruner at a time across processes
FINDING_KINDS = tuple(FindingKind)


# ---------------------------------------------------------------------------- the period


def _parse_bound(value: str, *, tz: ZoneInfo, field: str, now: datetime) -> datetime:
    text = value.strip()
    if len(text) == 10:
        try:
            day = date.fromisoformat(text)
        except ValueError:
            raise InvalidInput(f"{field}: not a date (YYYY-MM-DD) or ISO 8601 instant: {value!r}", field=field) from None
        return datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)
    return parse_instant(text, tz=tz.key, field=field, now=now)


def month_start(now: datetime, tz: ZoneInfo) -> datetime:
    """Midnight of the first day of ``now``'s month in ``tz``, as UTC."""
    local = now.astimezone(tz)
    return datetime(local.year, local.month, 1, tzinfo=tz).astimezone(UTC)


def next_month(start: datetime, tz: ZoneInfo) -> datetime:
    local = start.astimezone(tz)
    y, m = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
    return datetime(y, m, 1, tzinfo=tz).astimezone(UTC)


def parse_period(start: str | None, end: str | None, *, tz: ZoneInfo, now: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` in UTC from the ``from``/``to`` parameters.

    Each is a date (``2026-11-01``, midnight in the lab zone ``tz``), an ISO 8601 instant
    with an offset, or wall time (read in ``tz``). Defaults: the current month in ``tz``
    (``from`` alone: until the start of the next month; ``to`` alone: from the start of the
    month of the instant before it). Raises InvalidInput naming ``from`` or ``to``.
    """
    lo = _parse_bound(start, tz=tz, field="from", now=now) if start else None
    hi = _parse_bound(end, tz=tz, field="to", now=now) if end else None
    for name, bound in (("from", lo), ("to", hi)):
        # the default end (the next month) and the lab zone must stay representable
        if bound is not None and not (PERIOD_MIN <= bound <= PERIOD_MAX):
            raise InvalidInput(f"{name}: out of range ({PERIOD_MIN.year}-{PERIOD_MAX.year - 1})", field=name)
    if lo is None and hi is None:
        lo = month_start(now, tz)
        hi = next_month(lo, tz)
    elif lo is None:
        assert hi is not None
        lo = month_start(hi - timedelta(microseconds=1), tz)
    elif hi is None:
        hi = next_month(month_start(lo, tz), tz)
    if hi <= lo:
        raise InvalidInput(f"to: must be after from ({hi.isoformat()} <= {lo.isoformat()})", field="to")
    if hi - lo > MAX_PERIOD:
        raise InvalidInput(f"to: a report covers at most {MAX_PERIOD.days} days", field="to")
    return lo, hi


# ---------------------------------------------------------------------------- accounting


@dataclass
class _Tally:
    """Seconds of reserved device-time, split three ways."""

    used: float = 0.0
    idle: float = 0.0
    unmonitored: float = 0.0

    def add(self, other: "_Tally") -> None:
        self.used += other.used
        self.idle += other.idle
        self.unmonitored += other.unmonitored

    def figures(self) -> dict[str, float | None]:
        reserved = self.used + self.idle + self.unmonitored
        watched = self.used + self.idle
        return dict(
            reserved_gpu_hours=round(reserved / 3600, 4),
            used_gpu_hours=round(self.used / 3600, 4),
            idle_gpu_hours=round(self.idle / 3600, 4),
            unmonitored_gpu_hours=round(self.unmonitored / 3600, 4),
            used_fraction=round(self.used / watched, 4) if watched > 0 else None,
        )


@dataclass
class _Minute:
    util_sum: float = 0.0
    util_samples: int = 0
    users: set[str] = field(default_factory=set)


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 4)


def _floor_minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def device_interval_tally(
    session: Session,
    *,
    device_ids: list[int],
    util_device_id: int,
    start: datetime,
    end: datetime,
    entitled: set[str],
    threshold_pct: float,
) -> _Tally:
    """Split ``[start, end)`` of one reserved device into used / idle / unmonitored seconds.

    ``device_ids``: the device and, for a whole GPU in MIG mode, its MIG instances (whose
    processes count); ``util_device_id``: the device whose utilization counts;
    ``entitled``: Unix names whose processes count as the holder's.
    """
    tally = _Tally()
    if end <= start:
        return tally
    minutes: dict[datetime, _Minute] = defaultdict(_Minute)
    rows = session.execute(
        select(UsageRollup.device_id, UsageRollup.minute, UsageRollup.utilization_sum,
               UsageRollup.utilization_samples, UsageRollup.users)
        .where(UsageRollup.device_id.in_(device_ids), UsageRollup.minute >= _floor_minute(start),
               UsageRollup.minute < end)
    )
    for dev_id, minute, util_sum, util_samples, users in rows:
        m = minutes[minute]
        if dev_id == util_device_id:
            m.util_sum += util_sum or 0.0
            m.util_samples += util_samples or 0
        m.users.update(users or ())
    covered = 0.0
    for minute, m in minutes.items():
        w = (min(minute + timedelta(minutes=1), end) - max(minute, start)).total_seconds()
        if w <= 0:
            continue
        covered += w
        util = m.util_sum / m.util_samples if m.util_samples else None
        if m.users & entitled and (util is None or util >= threshold_pct):
            tally.used += w
        else:
            tally.idle += w
    tally.unmonitored = max(0.0, (end - start).total_seconds() - covered)
    return tally


def _entitled(r: Reservation, group_members: dict[int, set[str]]) -> set[str]:
    names = {r.user.unix_name}
    for s in r.shares:
        if s.user is not None:
            names.add(s.user.unix_name)
        elif s.group_id is not None:
            names |= group_members.get(s.group_id, set())
    return names


def _scope_users(session: Session, *, user: str | None, group: str | None) -> tuple[str, str, list[User]]:
    if (user is None) == (group is None):
        raise InvalidInput("user: give exactly one of 'user' or 'group'", field="user")
    if user is not None:
        u = session.scalar(select(User).where(User.username == user))
        if u is None:
            raise NotFound(f"user {user!r} not found", field="user")
        return "user", user, [u]
    g = session.scalar(select(Group).where(Group.name == group))
    if g is None:
        raise NotFound(f"group {group!r} not found", field="group")
    members = list(session.scalars(
        select(User).join(GroupMember, GroupMember.user_id == User.id).where(GroupMember.group_id == g.id)
        .order_by(User.username)
    ))
    return "group", g.name, members


def usage_report(
    session: Session,
    *,
    user: str | None = None,
    group: str | None = None,
    start: datetime,
    end: datetime,
    now: datetime,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
) -> UsageReport:
    """The booked-versus-used report of ``user`` or ``group`` (exactly one) for ``[start, end)``.

    Figures cover ``[start, min(end, now))``: time that has not happened yet is not counted.
    Raises InvalidInput (422) for a bad scope or threshold, NotFound (404) for an unknown
    user or group.
    """
    if not 0 <= threshold_pct <= 100:
        raise InvalidInput("threshold: a percentage between 0 and 100", field="threshold")
    scope, name, users = _scope_users(session, user=user, group=group)
    until = max(start, min(end, now))
    user_ids = [u.id for u in users]
    reservations = list(session.scalars(
        select(Reservation)
        .options(
            selectinload(Reservation.items).selectinload(ReservationDevice.device),
            selectinload(Reservation.user),
            selectinload(Reservation.host),
            selectinload(Reservation.shares).selectinload(ReservationShare.user),
        )
        .where(Reservation.user_id.in_(user_ids), Reservation.status.notin_(NOT_HELD),
               Reservation.start_at < until, Reservation.end_at > start)
        .order_by(Reservation.start_at, Reservation.id)
    )) if user_ids else []

    group_ids = {s.group_id for r in reservations for s in r.shares if s.group_id is not None}
    group_members: dict[int, set[str]] = defaultdict(set)
    if group_ids:
        for gid, unix in session.execute(
            select(GroupMember.group_id, User.unix_name).join(User, User.id == GroupMember.user_id)
            .where(GroupMember.group_id.in_(group_ids))
        ):
            group_members[gid].add(unix)
    parent_ids = {i.device_id for r in reservations for i in r.items if i.device.parent_id is None}
    children: dict[int, list[int]] = defaultdict(list)
    if parent_ids:
        for child_id, parent_id in session.execute(
            select(Device.id, Device.parent_id).where(Device.parent_id.in_(parent_ids))
        ):
            children[parent_id].append(child_id)

    per_user: dict[int, _Tally] = {u.id: _Tally() for u in users}
    counts: dict[int, int] = defaultdict(int)
    checkins = {u.id: report_counts.CheckinFigures() for u in users}
    quarantined_s: dict[int, float] = defaultdict(float)
    q_spans, _ = report_hosts.quarantine_spans(session, start=start, until=until, device_ids={
        d for r in reservations for i in r.items for d in (i.device_id, i.device.parent_id)})
    hosts = report_hosts.HostRows(_Tally)
    rows: list[ReservationUsage] = []
    for r in reservations:
        a, b = max(r.start_at, start), min(r.end_at, until)
        entitled = _entitled(r, group_members)
        tally, idle_checked_in, r_quarantined = _Tally(), 0.0, 0.0
        for item in sorted(r.items, key=lambda i: i.device.uuid):
            r_quarantined += report_hosts.overlap_seconds(
                [*q_spans.get(item.device_id, ()), *q_spans.get(item.device.parent_id, ())], a, min(b, item.end_at))
            # split at the check-in, so the idle time of a holder who showed up is told apart
            for lo, hi, checked_in in report_counts.spans(r, a, min(b, item.end_at)):
                part = device_interval_tally(
                    session, device_ids=[item.device_id, *children.get(item.device_id, [])],
                    util_device_id=item.device_id, start=lo, end=hi, entitled=entitled, threshold_pct=threshold_pct,
                )
                tally.add(part)
                idle_checked_in += part.idle if checked_in else 0.0
        per_user[r.user_id].add(tally)
        counts[r.user_id] += 1
        quarantined_s[r.user_id] += r_quarantined
        hosts.add(r, tally, idle_checked_in, r_quarantined)
        figures = checkins[r.user_id].add(r, idle_checked_in)
        rows.append(ReservationUsage(
            id=r.id, user=r.user.username, host=r.host.name, devices=sorted(i.device.uuid for i in r.items),
            start=r.start_at, end=r.end_at, status=r.status, **tally.figures(), **figures,
            quarantined_gpu_hours=_hours(r_quarantined),
        ))

    findings = report_counts.finding_counts(session, users=users, reservation_ids=[r.id for r in reservations],
                                            start=start, until=until)
    user_rows = [
        UserUsage(user=u.username, reservations=counts[u.id], findings=findings.get(u.id, {}), **per_user[u.id].figures(),
                  **checkins[u.id].figures(), quarantined_gpu_hours=_hours(quarantined_s[u.id]))
        for u in users
    ]
    total = _Tally()
    for t in per_user.values():
        total.add(t)
    all_findings: dict[str, int] = defaultdict(int)
    for by_kind in findings.values():
        for k, n in by_kind.items():
            all_findings[k] += n
    totals = UserUsage(user=name, reservations=len(reservations), findings=dict(all_findings), **total.figures(),
                       **report_counts.CheckinFigures.total(checkins.values()).figures(),
                       quarantined_gpu_hours=_hours(sum(quarantined_s.values())))
    host_rows, lab_quarantined = hosts.rows(session, start=start, until=until)
    return UsageReport(scope=scope, name=name, start=start, end=end, until=until, threshold_pct=threshold_pct,
                       totals=totals, users=user_rows, reservations=rows, hosts=host_rows,
                       quarantined_device_hours=lab_quarantined)


# ---------------------------------------------------------------------------- retention


def prune_history(session: Session, *, settings: Settings, now: datetime, force: bool = False) -> bool:
    """Delete rollups older than ``settings.rollup_retention_days`` (and expired idempotency
    keys) unless another process did so within :data:`PRUNE_EVERY`; returns True if it pruned.

    Takes the write lock first (SQLite ``BEGIN IMMEDIATE`` by the caller's write session;
    on PostgreSQL a transaction-scoped advisory lock), so concurrent app processes prune
    once. Records an ``audit_log`` row (action :data:`PRUNE_ACTION`) as the marker.
    """
    advisory_xact_lock(session, PRUNE_LOCK_KEY)
    if not force:
        recent = session.scalar(
            select(AuditLog.id).where(AuditLog.action == PRUNE_ACTION, AuditLog.at > now - PRUNE_EVERY).limit(1)
        )
        if recent is not None:
            return False
    ingest.prune(session, settings=settings, now=now)
    record_audit(session, at=now, actor="system", action=PRUNE_ACTION, target="usage_rollups",
                 detail={"retention_days": settings.rollup_retention_days})
    return True


__all__ = [
    "DEFAULT_THRESHOLD_PCT",
    "PRUNE_EVERY",
    "device_interval_tally",
    "month_start",
    "parse_period",
    "prune_history",
    "usage_report",
]


def report_for_request(
    session: Session, *, tz: ZoneInfo, viewer_name: str, user: str | None, group: str | None,
    start: str | None, end: str | None, threshold_pct: float, now: datetime,
) -> UsageReport:
    """The report that the API route and the page answer for the same query: ``start``/``end``
    as typed (dates in ``tz`` or ISO 8601, default the current month), the viewer's own
    report when neither ``user`` nor ``group`` is given. Errors as :func:`usage_report`."""
    lo, hi = parse_period(start, end, tz=tz, now=now)
    if user is None and group is None:
        user = viewer_name
    return usage_report(session, user=user, group=group, start=lo, end=hi, now=now, threshold_pct=threshold_pct)
