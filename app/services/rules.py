"""Sharing rules: the one validator for create and change, and usage. Each limit's value
for a user comes from :mod:`app.services.limits`; the admin operations on rules and open
devices are :mod:`app.services.rule_admin`.

Quantities:

* devices held at once / concurrent reservations: the peak over the requested window of the
  owner's active reservations (cancelled ones do not count; released ones until release),
  plus the request;
* GPU-hours per rolling 7 days: device-hours (real elapsed time, so 23 h and 25 h days are
  charged as such) of the owner's reservations inside a window of seven calendar days in
  the lab time zone, ``[00:00 of day D, 00:00 of day D+7)``; every window that the request
  touches must stay within the limit, so for every day the seven days ending on it do (the
  database sums every window in one statement, :func:`app.services.quotas.window_hours`);
* GPU-hours per calendar day, ISO week and month: device-hours inside each such window in the
  lab time zone that the request touches (:mod:`app.services.calendar_quotas`);
* reservation length and how far ahead: of the request itself (``start - now``).

Quota boosts: an approved boost (:mod:`app.services.boosts`) raises one numeric limit of its
user while ``now`` is before its end, for requests that end by then; it never lowers one.

Concurrency: when a counted limit applies, :func:`validate_reservation` takes a
transaction-scoped advisory lock keyed on the owner (PostgreSQL) before counting, so
concurrent requests of one user are counted one after the other; SQLite writers are
already serialised by ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.orm import Session

from app.db import advisory_xact_lock
from app.errors import RuleViolation
from app.models import Device, Host, Reservation, User
from app import timeutil
from app.services import calendar_quotas
from app.services.limits import Limit, resolve_limits
from app.services.calendar_quotas import CALENDAR_LIMITS
from app.services.quotas import (WINDOW_DAYS, fmt_hours, fmt_local, overfills, owner_rows, peak, quota_window,
                                 requested_hours, window_hours)
from app.timeutil import fmt_duration
from app.services.audit import record_audit

# pg_advisory_xact_lock keys: namespace in the high 32 bits, the id in the low ones.
QUOTA_LOCK_NAMESPACE = 0x51554F54  # "QUOT": one lock per user while counting quotas
RULES_LOCK_KEY = 0x52554C45 << 32  # "RULE": creating rules (one per scope target)
# Limits counted over the owner's other reservations (the quota lock serialises them).
COUNTED_LIMITS = ("max_devices", "max_concurrent_reservations", "max_gpu_hours_7d") + tuple(CALENDAR_LIMITS)


def quota_lock_key(user_id: int) -> int:
    """The advisory-lock key that serialises quota counting for one user."""
    return (QUOTA_LOCK_NAMESPACE << 32) | (user_id & 0xFFFFFFFF)


def model_allowed(name: str | None, patterns: Sequence[str]) -> bool:
    """True if the device model ``name`` contains one of ``patterns`` (case-insensitive)."""
    low = (name or "").lower()
    return any(p.strip().lower() in low for p in patterns if p.strip())


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
    limits: dict[str, Limit] | None = None,
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
    if limits is None:
        limits = resolve_limits(session, owner, now=now, until=end)
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
          f"reservation length {timeutil.fmt_hours(length)} (real elapsed time) exceeds the limit of "
          f"{timeutil.fmt_hours(max_len)}",
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
        rows = owner_rows(session, owner_id=owner.id, start=added, end=end, exclude_id=exclude)
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

    # every GPU-hour window the added time touches, read in one statement: for the rolling
    # limit, the seven lab days ending on each day from the first added one to the last
    rolling = []  # (first lab day, its window)
    if max_gpuh is not None:  # only then: an end in year 9999 has no lab date
        first = added.astimezone(tz).date() - timedelta(days=WINDOW_DAYS - 1)
        last = (end - timedelta(microseconds=1)).astimezone(tz).date()
        days = (first + timedelta(days=i) for i in range((last - first).days + 1))
        rolling = [(day, quota_window(day, tz)) for day in days]
    cal = {name: limits[name].value for name in CALENDAR_LIMITS}
    touched = calendar_quotas.windows(cal, added, end, tz)
    hours = window_hours(session, owner_id=owner.id, exclude_id=exclude,
                         windows=[w for _, w in rolling] + [(w.start, w.end) for ws in touched.values() for w in ws])
    for day, (ws, we) in rolling:
        used = hours[(ws, we)]
        new = requested_hours(len(devices), start, end, ws, we)
        if overfills(used, new, max_gpuh):
            shown_end = day + timedelta(days=WINDOW_DAYS - 1)
            v("max_gpu_hours_7d",
              f"this needs {fmt_hours(new)} GPU-hours; in the 7 days {day:%a %d %b} – {shown_end:%a %d %b %Y} "
              f"({tz.key}) you have {fmt_hours(used)} of {fmt_hours(max_gpuh)} GPU-hours booked, "
              f"{fmt_hours(max(0.0, max_gpuh - used))} left",
              used=round(used, 4), left=round(max(0.0, max_gpuh - used), 4),
              extra={"window": {"start": ws.isoformat(), "end": we.isoformat()}, "requested": round(new, 4)})
            break
    for b in calendar_quotas.breaches(hours, touched=touched, limits=cal, devices=len(devices), start=start, end=end):
        v(b.rule, b.sentence(tz), used=b.used, left=round(b.left, 4),
          extra={"window": b.window.as_dict(), "requested": b.needed})
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
    """The one validator for creating and changing a reservation, so that an edit is never
    refused by a rule that creating the same reservation would not apply.

    Takes the owner's quota lock when a counted limit applies, then checks :func:`check_limits`. A refusal raises
    :class:`RuleViolation` (403) naming the rule, the limit, what is used and left (and
    ``violations`` listing every broken rule). An admin who gives ``override_reason``
    is let through; so is an admin who gives none (admins are not limited by sharing rules), recorded
    as such. The overridden rules and the reason are written to the audit log
    (``rule.override``) and returned. ``label`` prefixes the message (a series occurrence).
    """
    if existing is not None and end <= existing.end_at:
        return []  # a shorter (or equal) end breaks nothing new (see check_limits)
    limits = resolve_limits(session, owner, now=now, until=end)
    session.info[("gpuroster.resolved_limits", owner.id)] = limits  # approval thresholds read them (one query)
    if any(limits[name].value is not None for name in COUNTED_LIMITS):
        # only counted limits read the owner's other reservations; without one there is
        # nothing to serialise and the lock would cost a round trip per booking
        advisory_xact_lock(session, quota_lock_key(owner.id))
    zone = tz or ZoneInfo("UTC")
    found = check_limits(session, owner=owner, host=host, devices=devices, start=start, end=end,
                         existing=existing, now=now, tz=zone, limits=limits)
    if not found:
        return []
    if actor.is_admin:
        record_audit(session, actor=f"user:{actor.username}",
                     action="rule.override",
                     target=f"reservation:{existing.id}" if existing is not None else f"user:{owner.username}",
                     detail={"reason": override_reason or "(admin, no reason given)", "owner": owner.username, "host": host.name,
                             "start": start.isoformat(), "end": end.isoformat(),
                             "rules": [x.as_dict() for x in found]})
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

