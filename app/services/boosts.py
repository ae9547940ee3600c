"""Quota boosts ("deadline mode"): a member asks for a temporary raise of one numeric limit
with a reason and an end; an admin, or a manager of one of the member's groups
(:func:`app.services.approvals.may_decide_for`), approves or denies it.

An approved boost raises the limit (:func:`app.services.boost_limits.apply_boosts`, applied
where limits are resolved) for requests made before its end that end by then; it expires by
itself, by time, with nothing stored. A boost still pending at its end can no longer be
decided. The member is told of the decision (:func:`app.services.holder_notices.tell`:
audit row and e-mail), and the request and the decision are in the audit log
(``boost.ask``, ``boost.approve``, ``boost.deny``).

States (:func:`state`): ``pending``, ``active`` (approved, before its end), ``expired``
(its end passed, approved or not) and ``denied``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.i18n import gettext, use_locale
from app.config import Settings
from app.errors import Conflict, Forbidden, InvalidInput, NotFound
from app.models import QuotaBoost, User
from app.services import holder_notices
from app.services.approvals import managed_user_ids, may_decide_for
from app.services.boost_limits import INT_LIMITS
from app.services.limits import NUMERIC_LIMITS, resolve_limits
from app.services.quotas import fmt_hours
from app.timeutil import fmt_duration, fmt_local
from app.services.audit import record_audit

#: the limits a boost may raise
BOOSTABLE = NUMERIC_LIMITS
#: how far ahead a boost may end
MAX_BOOST = timedelta(days=366)
STATES = ("pending", "active", "expired", "denied")
_UNITS = {"max_devices": "devices", "max_concurrent_reservations": "reservations"}


def state(b: QuotaBoost, now: datetime) -> str:
    """``pending``, ``active``, ``expired`` or ``denied``, by ``now`` (never stored)."""
    if b.status == "denied":
        return "denied"
    if b.ends_at <= now:
        return "expired"
    return "active" if b.status == "approved" else "pending"


def unit(limit_name: str) -> str:
    """The unit of a limit's value: devices, reservations, seconds or GPU-hours."""
    if limit_name in _UNITS:
        return _UNITS[limit_name]
    return "seconds" if limit_name.endswith("_seconds") else "GPU-hours"


def fmt_value(limit_name: str, value: float) -> str:
    """A limit's value for people: ``4 devices``, ``12h``, ``80 GPU-hours`` (in the current
    locale, :mod:`app.i18n`; English outside a page)."""
    u = unit(limit_name)
    if u == "seconds":
        return fmt_duration(value)
    if u == "GPU-hours":
        return gettext("%(n)s GPU-hours", n=fmt_hours(value))
    if u == "devices":
        return gettext("%(n)s devices", n=int(value))
    if u == "reservations":
        return gettext("%(n)s reservations", n=int(value))
    return f"{int(value)} {u}"


def ask(session: Session, *, user: User, limit_name: str, value: float, reason: str, ends_at: datetime,
        now: datetime) -> QuotaBoost:
    """Record ``user``'s request to raise ``limit_name`` to ``value`` (the limit's unit) until
    ``ends_at``. Raises InvalidInput (422) naming the field: an unknown limit, a limit that
    is unlimited for the user, a value not above the current one (or not whole for a count or
    seconds), an empty reason, an end not in the future or more than 366 days ahead."""
    if limit_name not in BOOSTABLE:
        raise InvalidInput(f"limit: {limit_name!r} cannot be boosted; one of {', '.join(BOOSTABLE)}", field="limit")
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("reason: say why you need more (it is shown to whoever decides)", field="reason")
    if ends_at <= now:
        raise InvalidInput("end: a boost ends in the future", field="end")
    if ends_at > now + MAX_BOOST:
        raise InvalidInput(f"end: a boost lasts at most {MAX_BOOST.days} days", field="end")
    if limit_name in INT_LIMITS and value != int(value):
        raise InvalidInput(f"value: {limit_name} is counted in whole {unit(limit_name)}", field="value")
    current = resolve_limits(session, user, now=now)[limit_name]
    if current.value is None:
        raise InvalidInput(f"limit: {limit_name} is unlimited for you; there is nothing to raise", field="limit")
    if value <= current.value:
        raise InvalidInput(f"value: {fmt_value(limit_name, value)} is not above your current "
                           f"{limit_name} of {fmt_value(limit_name, current.value)}", field="value")
    b = QuotaBoost(user_id=user.id, limit_name=limit_name, value=float(value), reason=reason[:1024], ends_at=ends_at,
                   status="pending", created_at=now)
    session.add(b)
    session.flush()
    record_audit(session, actor=f"user:{user.username}", action="boost.ask", target=f"boost:{b.id}",
                 detail={"user": user.username, "limit": limit_name, "value": float(value),
                         "from": current.value, "end": ends_at.isoformat(), "reason": b.reason})
    return b


def visible(session: Session, *, actor: User, state_filter: str | None, now: datetime) -> list[QuotaBoost]:
    """Boosts ``actor`` may see, newest first: their own and those they may decide (admins:
    all; group managers: their groups' members'), optionally only those in ``state_filter``."""
    q = select(QuotaBoost)
    if not actor.is_admin:
        q = q.where(or_(QuotaBoost.user_id == actor.id, QuotaBoost.user_id.in_(managed_user_ids(session, actor))))
    if state_filter is not None:
        if state_filter not in STATES:
            raise InvalidInput(f"state: one of {', '.join(STATES)}", field="state")
        if state_filter == "denied":
            q = q.where(QuotaBoost.status == "denied")
        elif state_filter == "expired":
            q = q.where(QuotaBoost.status != "denied", QuotaBoost.ends_at <= now)
        else:
            q = q.where(QuotaBoost.status == ("approved" if state_filter == "active" else "pending"),
                        QuotaBoost.ends_at > now)
    return list(session.scalars(q.order_by(QuotaBoost.id.desc()).limit(500)))


def to_decide(session: Session, *, actor: User, now: datetime) -> list[QuotaBoost]:
    """Pending boosts (before their end) that ``actor`` may decide, oldest first; never their own
    unless they are an admin."""
    q = select(QuotaBoost).where(QuotaBoost.status == "pending", QuotaBoost.ends_at > now)
    if not actor.is_admin:
        q = q.where(QuotaBoost.user_id.in_(managed_user_ids(session, actor)), QuotaBoost.user_id != actor.id)
    return list(session.scalars(q.order_by(QuotaBoost.id)))


def of_user(session: Session, *, user: User, now: datetime) -> list[QuotaBoost]:
    """``user``'s boosts that are pending or active at ``now``, soonest end first."""
    q = select(QuotaBoost).where(QuotaBoost.user_id == user.id, QuotaBoost.status != "denied", QuotaBoost.ends_at > now)
    return list(session.scalars(q.order_by(QuotaBoost.ends_at, QuotaBoost.id)))


def decide(session: Session, *, actor: User, boost_id: int, approve: bool, reason: str | None, settings: Settings,
           now: datetime) -> QuotaBoost:
    """Approve or deny a pending boost under its row lock; the member is told either way.

    Raises NotFound (404); Forbidden (403) unless ``actor`` is an admin or manages one of the
    member's groups (a manager never decides their own); Conflict (409) when it was already
    decided (naming by whom and when) or its end has passed.
    """
    # lock the row first, then read it and its decider afresh: a read that waited for the lock
    # sees the winner's committed row (PostgreSQL re-reads only the locked table's columns)
    locked = session.scalar(select(QuotaBoost.id).where(QuotaBoost.id == boost_id).with_for_update())
    b = session.get(QuotaBoost, boost_id, populate_existing=True) if locked is not None else None
    if b is None:
        raise NotFound(f"boost {boost_id} not found", field="id")
    if not may_decide_for(session, actor, b.user_id) or (b.user_id == actor.id and not actor.is_admin):
        raise Forbidden(f"boost {b.id}: only an admin or a manager of {b.user.username}'s group may decide it")
    tz: ZoneInfo = settings.tz
    if b.status != "pending":
        who = b.decided_by.username if b.decided_by else "a deleted user"
        raise Conflict(f"boost {b.id} was already {b.status} by {who} at {fmt_local(b.decided_at or now, tz)}",
                       field="id", decided_by=who, status_now=b.status)
    if b.ends_at <= now:
        raise Conflict(f"boost {b.id} ended {fmt_local(b.ends_at, tz)} without a decision", field="id")
    b.status = "approved" if approve else "denied"
    b.decided_by = actor
    b.decided_at = now
    b.decision_reason = (reason or "").strip()[:1024] or None
    if approve and (b.user.boost_until is None or b.user.boost_until < b.ends_at):
        b.user.boost_until = b.ends_at
    record_audit(session, actor=f"user:{actor.username}", action=f"boost.{'approve' if approve else 'deny'}",
                 target=f"boost:{b.id}", detail={"user": b.user.username, "limit": b.limit_name,
                                                 "value": b.value, "reason": b.decision_reason})
    with use_locale(b.user.language):  # the member reads it in the language they chose
        args = {"id": b.id, "actor": actor.username, "reason": b.decision_reason,
                "what": gettext("%(limit)s to %(value)s until %(end)s", limit=b.limit_name,
                                value=fmt_value(b.limit_name, b.value), end=fmt_local(b.ends_at, tz))}
        if approve:
            subject = gettext("[gpuroster] quota boost %(id)s approved", **args)
            text = (gettext("Your quota boost %(id)s (%(what)s) was approved by %(actor)s: %(reason)s", **args)
                    if b.decision_reason else gettext("Your quota boost %(id)s (%(what)s) was approved by %(actor)s.", **args))
        else:
            subject = gettext("[gpuroster] quota boost %(id)s denied", **args)
            text = (gettext("Your quota boost %(id)s (%(what)s) was denied by %(actor)s: %(reason)s", **args)
                    if b.decision_reason else gettext("Your quota boost %(id)s (%(what)s) was denied by %(actor)s.", **args))
    holder_notices.tell(session, kind="approvals", user=b.user, reservation_id=None, boost_id=b.id,
                        subject=subject, text=text, settings=settings,
                        actor=f"user:{actor.username}")
    session.flush()
    return b


__all__ = ["BOOSTABLE", "STATES", "ask", "decide", "fmt_value", "of_user", "state", "to_decide", "unit", "visible"]
