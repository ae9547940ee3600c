"""Sharing rules: resolution per user, the one validator for create and change, usage, and
the admin operations on rules and open devices.

Resolution (per limit): the most specific scope that *sets* the limit wins, user over group
over default. ``None`` in a rule means "this rule does not set that limit" (it is inherited
from a less specific scope). A user in several groups gets the most generous group value:
the largest number, the union of the allowed lists.

Quantities:

* devices held at once / concurrent reservations: the peak over the requested window of the
  owner's active reservations (cancelled ones do not count; released ones until release),
  plus the request;
* GPU-hours per rolling 7 days: device-hours (real elapsed time, so 23 h and 25 h days are
  charged as such) of the owner's reservations inside a window of seven calendar days in
  the lab time zone, ``[00:00 of day D, 00:00 of day D+7)``; every window that the request
  touches must stay within the limit, so for every day the seven days ending on it do;
* reservation length and how far ahead: of the request itself (``start - now``).

Concurrency: :func:`validate_reservation` first takes a transaction-scoped advisory lock
keyed on the owner (PostgreSQL), so concurrent requests of one user are counted one after
the other; SQLite writers are already serialised by ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import advisory_xact_lock
from app.errors import Conflict, InvalidInput, NotFound, RuleViolation
from app.models import (
    AuditLog,
    Device,
    Group,
    GroupMember,
    Host,
    Reservation,
    ReservationDevice,
    SharingRule,
    User,
    utcnow,
)
from app.timeutil import fmt_duration, fmt_hours

NUMERIC_LIMITS = (
    "max_devices",
    "max_duration_seconds",
    "max_ahead_seconds",
    "max_gpu_hours_7d",
    "max_concurrent_reservations",
)
LIST_LIMITS = ("allowed_hosts", "allowed_models")
LIMIT_FIELDS = NUMERIC_LIMITS + LIST_LIMITS
SCOPES = ("default", "group", "user")

# pg_advisory_xact_lock keys: namespace in the high 32 bits, the id in the low ones.
QUOTA_LOCK_NAMESPACE = 0x51554F54  # "QUOT": one lock per user while counting quotas
RULES_LOCK_KEY = 0x52554C45 << 32  # "RULE": creating rules (one per scope target)
WINDOW_DAYS = 7
_EPS = 1e-9


def quota_lock_key(user_id: int) -> int:
    """The advisory-lock key that serialises quota counting for one user."""
    return (QUOTA_LOCK_NAMESPACE << 32) | (user_id & 0xFFFFFFFF)


# ---------------------------------------------------------------------------- resolution


@dataclass(frozen=True)
class Limit:
    """One effective limit: its value (``None`` = unlimited) and where it comes from."""

    name: str
    value: Any
    scope: str | None = None  # "user", "group:<name>", "default"; None when no rule sets it
    rule_id: int | None = None


def resolve_limits(session: Session, user: User) -> dict[str, Limit]:
    """Each limit's effective value for ``user`` with its source (see the module docstring)."""
    rules = list(session.scalars(select(SharingRule).order_by(SharingRule.id)))
    group_ids = set(session.scalars(select(GroupMember.group_id).where(GroupMember.user_id == user.id)))
    group_names = dict(session.execute(select(Group.id, Group.name).where(Group.id.in_(group_ids))).all()) if group_ids else {}
    user_rules = [r for r in rules if r.scope == "user" and r.user_id == user.id]
    group_rules = [r for r in rules if r.scope == "group" and r.group_id in group_ids]
    default_rules = [r for r in rules if r.scope == "default"]
    out: dict[str, Limit] = {}
    for f in LIMIT_FIELDS:
        limit = Limit(f, None)
        for r in reversed(user_rules):
            if getattr(r, f) is not None:
                limit = Limit(f, _copy(getattr(r, f)), "user", r.id)
                break
        else:
            setting = [r for r in group_rules if getattr(r, f) is not None]
            if setting:
                if f in LIST_LIMITS:
                    merged: list[str] = []
                    for r in setting:
                        merged += [v for v in getattr(r, f) if v not in merged]
                    best = max(setting, key=lambda r: len(getattr(r, f)))
                    limit = Limit(f, merged, f"group:{group_names.get(best.group_id, best.group_id)}", best.id)
                else:
                    best = max(setting, key=lambda r: getattr(r, f))
                    limit = Limit(f, getattr(best, f), f"group:{group_names.get(best.group_id, best.group_id)}", best.id)
            else:
                for r in reversed(default_rules):
                    if getattr(r, f) is not None:
                        limit = Limit(f, _copy(getattr(r, f)), "default", r.id)
                        break
        out[f] = limit
    return out


def _copy(v: Any) -> Any:
    return list(v) if isinstance(v, list) else v


def effective_limits(session: Session, user: User) -> dict[str, object]:
    """Each limit's value for ``user`` (``None`` = unlimited); see :func:`resolve_limits`."""
    return {name: lim.value for name, lim in resolve_limits(session, user).items()}


def model_allowed(name: str | None, patterns: Sequence[str]) -> bool:
    """True if the device model ``name`` contains one of ``patterns`` (case-insensitive)."""
    low = (name or "").lower()
    return any(p.strip().lower() in low for p in patterns if p.strip())


# ---------------------------------------------------------------------------- quantities


def _owner_rows(
    session: Session, *, owner_id: int, start: datetime, end: datetime, exclude_id: int | None
) -> list[tuple[int, datetime, datetime]]:
    """(reservation id, start, end) per reserved device of the owner's active reservations
    overlapping ``[start, end)``."""
    q = (
        select(ReservationDevice.reservation_id, ReservationDevice.start_at, ReservationDevice.end_at)
        .join(Reservation, Reservation.id == ReservationDevice.reservation_id)
        .where(
            Reservation.user_id == owner_id,
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
    """``18:00`` today, ``Tue 24 Mar 18:00`` another day (with the year if not this year), in ``tz``."""
    local = dt.astimezone(tz)
    ref = (now or utcnow()).astimezone(tz)
    if local.date() == ref.date():
        return local.strftime("%H:%M")
    if local.year == ref.year:
        return local.strftime("%a %d %b %H:%M")
    return local.strftime("%a %d %b %Y %H:%M")


def _fmt_hours(h: float) -> str:
    return f"{h:.1f}".rstrip("0").rstrip(".") if abs(h - round(h, 1)) < 1e-9 else f"{h:.2f}"


# ---------------------------------------------------------------------------- the validator


@dataclass
class Violation:
    """One refused limit: the rule, its value, what is used and left, and a sentence."""

    rule: str
    limit: Any
    detail: str
    used: Any = None
    left: Any = None
    until: datetime | None = None
    scope: str | None = None
    rule_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rule": self.rule, "limit": self.limit, "used": self.used, "left": self.left,
                             "scope": self.scope, "rule_id": self.rule_id, "detail": self.detail}
        if self.until is not None:
            d["until"] = self.until.isoformat()
        d.update(self.extra)
        return d


def check_limits(
    session: Session,
    *,
    owner: User,
    host: Host,
    devices: Sequence[Device],
    start: datetime,
    end: datetime,
    existing: Reservation | None,
    now: datetime,
    tz: ZoneInfo,
) -> list[Violation]:
    """Every sharing rule that ``[start, end)`` on ``devices`` of ``host`` would break for ``owner``.

    For a change of ``existing`` only the end can move: a shorter (or equal) end breaks
    nothing new and returns ``[]``; a longer one is checked for its length, and for devices
    and reservations at once and GPU-hours where the added time falls; where and how far
    ahead it starts did not change and is not re-checked. Takes no lock (see
    :func:`validate_reservation`).
    """
    if existing is not None and end <= existing.end_at:
        return []
    limits = resolve_limits(session, owner)
    out: list[Violation] = []

    def v(name: str, detail: str, **kw: Any) -> None:
        lim = limits[name]
        out.append(Violation(rule=name, limit=lim.value, detail=detail, scope=lim.scope, rule_id=lim.rule_id, **kw))

    if existing is None:
        hosts = limits["allowed_hosts"].value
        if hosts is not None and host.name not in hosts:
            v("allowed_hosts", f"host {host.name} is not among the hosts you may book ({', '.join(hosts)})",
              used=host.name, left=list(hosts))
        models = limits["allowed_models"].value
        if models is not None:
            bad = [d for d in devices if not model_allowed(d.name, models)]
            if bad:
                names = ", ".join(f"{d.uuid} ({d.name or 'unknown model'})" for d in bad)
                v("allowed_models", f"{names}: not an allowed GPU model (allowed: {', '.join(models)})",
                  used=[d.name for d in bad], left=list(models))
        opened = [d for d in devices if d.is_open]
        if opened:
            out.append(Violation(
                rule="open_devices", limit=[d.uuid for d in opened], scope="device",
                detail=f"{', '.join(d.uuid for d in opened)}: open device(s); anyone may use them without a reservation",
            ))

    length = (end - start).total_seconds()
    max_len = limits["max_duration_seconds"].value
    if max_len is not None and length > max_len:
        v("max_duration_seconds",
          f"reservation length {fmt_hours(length)} (real elapsed time) exceeds the limit of {fmt_hours(max_len)}",
          used=length, left=max_len)

    max_ahead = limits["max_ahead_seconds"].value
    if existing is None and max_ahead is not None and (start - now).total_seconds() > max_ahead:
        latest = now + timedelta(seconds=max_ahead)
        v("max_ahead_seconds",
          f"starts {fmt_duration((start - now).total_seconds())} ahead; reservations may start at most "
          f"{fmt_duration(max_ahead)} ahead (until {fmt_local(latest, tz, now)})",
          used=(start - now).total_seconds(), left=max_ahead, until=latest)

    max_dev = limits["max_devices"].value
    max_conc = limits["max_concurrent_reservations"].value
    max_gpuh = limits["max_gpu_hours_7d"].value
    exclude = existing.id if existing is not None else None
    added = existing.end_at if existing is not None else start  # the time this request adds
    if max_dev is not None or max_conc is not None:
        rows = _owner_rows(session, owner_id=owner.id, start=added, end=end, exclude_id=exclude)
        if max_dev is not None:
            p = peak([(s, e) for _r, s, e in rows], added, end)
            if p.value + len(devices) > max_dev:
                held = (f"you hold {p.value} of {max_dev} devices until {fmt_local(p.until, tz, now)}"
                        if p.value and p.until else f"you hold none of {max_dev} then")
                v("max_devices",
                  f"{len(devices)} more device(s) would make {p.value + len(devices)} at once; {held}, "
                  f"{max(0, max_dev - p.value)} left",
                  used=p.value, left=max(0, max_dev - p.value), until=p.until)
        if max_conc is not None:
            spans: dict[int, tuple[datetime, datetime]] = {}
            for rid, s, e in rows:
                spans[rid] = (s, e)
            p = peak(list(spans.values()), added, end)
            if p.value + 1 > max_conc:
                v("max_concurrent_reservations",
                  f"you have {p.value} of {max_conc} reservations at once until "
                  f"{fmt_local(p.until or end, tz, now)}, {max(0, max_conc - p.value)} left",
                  used=p.value, left=max(0, max_conc - p.value), until=p.until)

    if max_gpuh is not None:
        first = added.astimezone(tz).date() - timedelta(days=WINDOW_DAYS - 1)
        last = (end - timedelta(microseconds=1)).astimezone(tz).date()
        span_start, _ = quota_window(first, tz)
        _, span_end = quota_window(last, tz)
        rows = _owner_rows(session, owner_id=owner.id, start=span_start, end=span_end, exclude_id=exclude)
        day = first
        while day <= last:
            ws, we = quota_window(day, tz)
            used = device_hours(rows, ws, we)
            new = len(devices) * max(0.0, (min(end, we) - max(start, ws)).total_seconds()) / 3600.0
            if new > 0 and used + new > max_gpuh + _EPS:
                shown_end = day + timedelta(days=WINDOW_DAYS - 1)
                v("max_gpu_hours_7d",
                  f"this needs {_fmt_hours(new)} GPU-hours; in the 7 days {day:%a %d %b} – {shown_end:%a %d %b %Y} "
                  f"({tz.key}) you have {_fmt_hours(used)} of {_fmt_hours(max_gpuh)} GPU-hours booked, "
                  f"{_fmt_hours(max(0.0, max_gpuh - used))} left",
                  used=round(used, 4), left=round(max(0.0, max_gpuh - used), 4),
                  extra={"window": {"start": ws.isoformat(), "end": we.isoformat()}, "requested": round(new, 4)})
                break
            day += timedelta(days=1)
    return out


def validate_reservation(
    session: Session,
    *,
    owner: User,
    actor: User,
    host: Host,
    devices: Sequence[Device],
    start: datetime,
    end: datetime,
    existing: Reservation | None,
    override_reason: str | None,
    now: datetime,
    tz: ZoneInfo | None = None,
    label: str | None = None,
) -> list[Violation]:
    """The one validator for creating and changing a reservation (B32).

    Takes the owner's quota lock, then checks :func:`check_limits`. A refusal raises
    :class:`RuleViolation` (403) naming the rule, the limit, what is used and left (and
    ``violations`` listing every broken rule). An admin who gives ``override_reason``
    is let through; so is an admin who gives none (CASES B32: "admins unlimited"), recorded
    as such. The overridden rules and the reason are written to the audit log
    (``rule.override``) and returned. ``label`` prefixes the message (a series occurrence).
    """
    advisory_xact_lock(session, quota_lock_key(owner.id))
    zone = tz or ZoneInfo("UTC")
    found = check_limits(session, owner=owner, host=host, devices=devices, start=start, end=end,
                         existing=existing, now=now, tz=zone)
    if not found:
        return []
    if actor.is_admin:
        session.add(AuditLog(
            actor=f"user:{actor.username}",
            action="rule.override",
            target=f"reservation:{existing.id}" if existing is not None else f"user:{owner.username}",
            detail={"reason": override_reason or "(admin, no reason given)", "owner": owner.username, "host": host.name,
                    "start": start.isoformat(), "end": end.isoformat(),
                    "rules": [x.as_dict() for x in found]},
        ))
        return found
    first = found[0]
    detail = f"{first.rule}: {first.detail}"
    if label:
        detail = f"{label}: {detail}"
    raise RuleViolation(
        detail,
        rule=first.rule,
        limit=first.limit,
        used=first.used,
        left=first.left,
        until=first.until.isoformat() if first.until else None,
        scope=first.scope,
        violations=[x.as_dict() for x in found],
    )


# ---------------------------------------------------------------------------- usage


@dataclass
class UsageItem:
    rule: str
    limit: Any
    used: Any
    left: Any
    unit: str
    scope: str | None
    detail: str


def usage(session: Session, *, user: User, now: datetime, tz: ZoneInfo) -> dict[str, Any]:
    """Each limit of ``user``: its value, what is used now and what is left.

    Devices and reservations count what is held at ``now``; GPU-hours count the seven lab
    days ending today (booked hours, future parts of today included).
    """
    limits = resolve_limits(session, user)
    today = now.astimezone(tz).date()
    ws, we = quota_window(today - timedelta(days=WINDOW_DAYS - 1), tz)
    rows_now = _owner_rows(session, owner_id=user.id, start=now, end=now + timedelta(microseconds=1), exclude_id=None)
    held = len(rows_now)
    until = min((e for _r, _s, e in rows_now), default=None)
    res_now = len({rid for rid, _s, _e in rows_now})
    window_rows = _owner_rows(session, owner_id=user.id, start=ws, end=we, exclude_id=None)
    hours = device_hours(window_rows, ws, we)

    def left(lim: Any, used: float) -> Any:
        return None if lim is None else max(0, lim - used)

    items: list[UsageItem] = []
    lim = limits["max_devices"]
    items.append(UsageItem("max_devices", lim.value, held, left(lim.value, held), "devices", lim.scope,
                           f"{held} device(s) held now" + (f", the first until {fmt_local(until, tz, now)}" if until else "")))
    lim = limits["max_concurrent_reservations"]
    items.append(UsageItem("max_concurrent_reservations", lim.value, res_now, left(lim.value, res_now), "reservations",
                           lim.scope, f"{res_now} reservation(s) active now"))
    lim = limits["max_gpu_hours_7d"]
    items.append(UsageItem("max_gpu_hours_7d", lim.value, round(hours, 4),
                           None if lim.value is None else round(max(0.0, lim.value - hours), 4), "GPU-hours", lim.scope,
                           f"{_fmt_hours(hours)} GPU-hours booked {ws.astimezone(tz):%a %d %b} – "
                           f"{(we - timedelta(seconds=1)).astimezone(tz):%a %d %b} ({tz.key})"))
    for name, unit, what in (("max_duration_seconds", "seconds", "longest reservation"),
                             ("max_ahead_seconds", "seconds", "how far ahead a reservation may start")):
        lim = limits[name]
        items.append(UsageItem(name, lim.value, None, None, unit, lim.scope,
                               f"{what}: {fmt_duration(lim.value) if lim.value is not None else 'unlimited'}"))
    for name in LIST_LIMITS:
        lim = limits[name]
        items.append(UsageItem(name, lim.value, None, None, "names", lim.scope,
                               "any" if lim.value is None else ", ".join(lim.value)))
    return {
        "user": user.username,
        "timezone": tz.key,
        "now": now,
        "window": {"start": ws, "end": we},
        "limits": items,
    }


# ---------------------------------------------------------------------------- rule administration


def _target(session: Session, *, scope: str, user: str | None, group: str | None) -> tuple[int | None, int | None]:
    if scope not in SCOPES:
        raise InvalidInput(f"scope: one of {', '.join(SCOPES)}", field="scope")
    if scope == "default":
        if user or group:
            raise InvalidInput("scope: a default rule names no user or group", field="scope")
        return None, None
    if scope == "group":
        if user or not group:
            raise InvalidInput("group: a group rule names a group (and no user)", field="group")
        gid = session.scalar(select(Group.id).where(Group.name == group))
        if gid is None:
            raise InvalidInput(f"group: no group {group!r}", field="group")
        return None, gid
    if group or not user:
        raise InvalidInput("user: a user rule names a user (and no group)", field="user")
    uid = session.scalar(select(User.id).where(User.username == user))
    if uid is None:
        raise InvalidInput(f"user: no user {user!r}", field="user")
    return uid, None


def _check_values(values: dict[str, Any]) -> None:
    for f in LIST_LIMITS:
        if f in values and values[f] is not None:
            items = [str(x).strip() for x in values[f]]
            if not items or any(not x for x in items):
                raise InvalidInput(f"{f}: list at least one non-empty name, or null to inherit", field=f)
            values[f] = list(dict.fromkeys(items))


def create_rule(session: Session, *, scope: str, user: str | None, group: str | None, values: dict[str, Any],
                actor: User) -> SharingRule:
    """Create the rule of one scope target (default, a group, a user).

    Raises InvalidInput (422) naming the field for a bad scope/target or value, Conflict
    (409) when that target already has a rule (change it with PATCH instead).
    """
    advisory_xact_lock(session, RULES_LOCK_KEY)
    uid, gid = _target(session, scope=scope, user=user, group=group)
    _check_values(values)
    existing = session.scalar(select(SharingRule.id).where(
        SharingRule.scope == scope,
        SharingRule.user_id.is_(None) if uid is None else SharingRule.user_id == uid,
        SharingRule.group_id.is_(None) if gid is None else SharingRule.group_id == gid,
    ))
    if existing is not None:
        raise Conflict(f"scope: rule {existing} already covers this {scope}; change it with PATCH /api/v1/rules/{existing}",
                       field="scope", rule_id=existing)
    now = utcnow()
    rule = SharingRule(scope=scope, user_id=uid, group_id=gid, created_at=now, updated_at=now,
                       **{k: v for k, v in values.items() if k in LIMIT_FIELDS or k == "note"})
    session.add(rule)
    session.flush()
    session.add(AuditLog(actor=f"user:{actor.username}", action="rule.create", target=f"rule:{rule.id}",
                         detail={"scope": scope, "user": user, "group": group, **values}))
    return rule


def get_rule(session: Session, rule_id: int) -> SharingRule:
    rule = session.get(SharingRule, rule_id)
    if rule is None:
        raise NotFound(f"rule {rule_id} not found", field="id")
    return rule


def list_rules(session: Session) -> list[SharingRule]:
    """All rules: default first, then groups, then users."""
    rules = list(session.scalars(select(SharingRule).order_by(SharingRule.id)))
    return sorted(rules, key=lambda r: (SCOPES.index(r.scope), r.id))


def update_rule(session: Session, *, rule_id: int, changes: dict[str, Any], actor: User) -> SharingRule:
    """Set (or clear with ``None``) limits and the note of a rule; its scope target is fixed.

    Raises NotFound (404), InvalidInput (422) naming the field.
    """
    rule = get_rule(session, rule_id)
    _check_values(changes)
    for k, v in changes.items():
        if k not in LIMIT_FIELDS and k != "note":
            raise InvalidInput(f"{k}: cannot be changed; delete the rule and create another", field=k)
        setattr(rule, k, v)
    rule.updated_at = utcnow()
    session.add(AuditLog(actor=f"user:{actor.username}", action="rule.update", target=f"rule:{rule.id}", detail=changes))
    session.flush()
    return rule


def delete_rule(session: Session, *, rule_id: int, actor: User) -> SharingRule:
    """Delete a rule (its limits fall back to the less specific scopes); raises NotFound."""
    rule = get_rule(session, rule_id)
    session.delete(rule)
    session.add(AuditLog(actor=f"user:{actor.username}", action="rule.delete", target=f"rule:{rule_id}",
                         detail={"scope": rule.scope}))
    session.flush()
    return rule


def rule_target_names(session: Session, rules: Sequence[SharingRule]) -> dict[int, str]:
    """rule id → username or group name of its target."""
    uids = {r.user_id for r in rules if r.user_id}
    gids = {r.group_id for r in rules if r.group_id}
    users = dict(session.execute(select(User.id, User.username).where(User.id.in_(uids))).all()) if uids else {}
    groups = dict(session.execute(select(Group.id, Group.name).where(Group.id.in_(gids))).all()) if gids else {}
    out: dict[int, str] = {}
    for r in rules:
        if r.user_id:
            out[r.id] = users.get(r.user_id, "")
        elif r.group_id:
            out[r.id] = groups.get(r.group_id, "")
    return out


# ---------------------------------------------------------------------------- open devices


def list_open_devices(session: Session) -> list[Device]:
    """Devices anyone may use without a reservation (not retired), by host and index."""
    q = select(Device).join(Host, Host.id == Device.host_id).where(Device.is_open.is_(True), Device.retired_at.is_(None))
    return list(session.scalars(q.order_by(Host.name, Device.index, Device.uuid)))


def set_open(
    session: Session, *, uuids: Sequence[str], is_open: bool, actor: User, now: datetime
) -> list[tuple[Device, int]]:
    """Open (or close) devices by UUID; the agent learns it from its next snapshot ack.

    Raises NotFound naming the first unknown UUID; nothing is changed then. Returns each
    device with the number of its current and upcoming reservations, which opening does
    not cancel.
    """
    wanted = [u.strip() for u in uuids]
    devices = {d.uuid: d for d in session.scalars(select(Device).where(Device.uuid.in_(wanted)))}
    for u in wanted:
        if u not in devices:
            raise NotFound(f"devices: no device {u!r}", field="devices")
    out = []
    counts: dict[int, int] = defaultdict(int)
    ids = [d.id for d in devices.values()]
    for dev_id in session.scalars(select(ReservationDevice.device_id).where(
            ReservationDevice.device_id.in_(ids), ReservationDevice.active.is_(True), ReservationDevice.end_at > now)):
        counts[dev_id] += 1
    for u in dict.fromkeys(wanted):
        d = devices[u]
        d.is_open = is_open
        out.append((d, counts[d.id]))
    session.add(AuditLog(actor=f"user:{actor.username}", action="device.open" if is_open else "device.close",
                         target="devices", detail={"devices": list(dict.fromkeys(wanted))}))
    session.flush()
    return out
