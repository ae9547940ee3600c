"""Approval: bookings above a sharing rule's approval threshold wait, ``pending``, for an
admin or a manager of one of the owner's groups.

Thresholds (rule fields, resolved like the numeric limits, see :mod:`app.services.rules`):
``approval_above_devices`` (devices in the booking), ``approval_above_seconds`` (its
length), ``approval_above_ahead_seconds`` (``start - now``) and ``approval_above_gpu_hours``
(devices × hours). A booking strictly above any of them is pending; an admin's own booking
or one an admin makes for someone never is (admins are the approvers).

A pending reservation holds its slot: its ``reservation_devices`` rows are active, so the
exclusion constraints and the conflict check treat it as holding, and nobody may book or
queue an overlapping reservation on those devices until it is denied, cancelled or
expires. It counts against its owner's quotas like a confirmed one. It becomes
``confirmed`` (approve), ``denied`` (deny) or ``cancelled`` (its owner cancels); one still
pending at its start ``expired`` (the sweep, and any booking that meets it in a conflict,
store that and free the devices). Every decision takes the row lock through
:func:`app.services.lifecycle.begin`, so of two deciders, or a decision and a cancel, the
first wins and the other gets a 409 naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.i18n import gettext, use_locale
from app.config import Settings
from app.errors import Forbidden
from app.models import Device, GroupMember, Reservation, ReservationDevice, User
from app.models.reservation import PENDING
from app.services import holder_notices, lifecycle
from app.services.slot_freed import on_slot_freed
from app.timeutil import fmt_duration, fmt_hours, fmt_local
from app.services.audit import record_audit

KEY_LIMITS = "gpuroster.resolved_limits"  # rules.validate_reservation leaves the owner's limits here


def crossed(limits: dict, *, devices: Sequence[Device], start: datetime, end: datetime, now: datetime) -> list[str]:
    """The thresholds of ``limits`` (``limits.resolve_limits`` output) that a booking of
    ``devices`` for ``[start, end)`` exceeds, as sentences; ``[]`` means no approval needed."""
    out: list[str] = []

    def value(name: str):
        lim = limits.get(name)
        return None if lim is None else lim.value

    seconds = (end - start).total_seconds()
    hours = len(devices) * seconds / 3600
    if (v := value("approval_above_devices")) is not None and len(devices) > v:
        out.append(f"{len(devices)} devices is above {v}")
    if (v := value("approval_above_seconds")) is not None and seconds > v:
        out.append(f"a length of {fmt_duration(seconds)} is above {fmt_duration(v)}")
    if (v := value("approval_above_ahead_seconds")) is not None and (start - now).total_seconds() > v:
        out.append(f"starting {fmt_duration((start - now).total_seconds())} ahead is above {fmt_duration(v)}")
    if (v := value("approval_above_gpu_hours")) is not None and hours > v:
        out.append(f"{fmt_hours(hours * 3600)} GPU-hours is above {v:g}")
    return out


def initial_status(session: Session, *, owner: User, actor: User, devices: Sequence[Device], start: datetime,
                   end: datetime, now: datetime) -> tuple[str, list[str]]:
    """``("pending", reasons)`` when the booking needs approval, else ``("confirmed", [])``."""
    if actor.is_admin:
        return "confirmed", []
    limits = session.info.get((KEY_LIMITS, owner.id))
    if limits is None:
        from app.services.limits import resolve_limits

        limits = resolve_limits(session, owner)
    reasons = crossed(limits, devices=devices, start=start, end=end, now=now)
    return ("pending", reasons) if reasons else ("confirmed", [])


def managed_user_ids(session: Session, manager: User):
    """SQL: ids of the members of the groups ``manager`` manages."""
    groups = select(GroupMember.group_id).where(GroupMember.user_id == manager.id, GroupMember.is_manager.is_(True))
    return select(GroupMember.user_id).where(GroupMember.group_id.in_(groups))


def may_decide(session: Session, actor: User, r: Reservation) -> bool:
    """Admins decide every pending reservation; a group manager those of their groups' members."""
    return may_decide_for(session, actor, r.user_id)


def may_decide_for(session: Session, actor: User, user_id: int) -> bool:
    """Whether ``actor`` decides the requests (pending reservations, quota boosts) of user
    ``user_id``: admins always, a group manager for the members of the groups they manage."""
    if actor.is_admin:
        return True
    return session.scalar(managed_user_ids(session, actor).where(GroupMember.user_id == user_id).limit(1)) is not None


def list_pending(session: Session, *, actor: User, now: datetime, load_options: list) -> list[Reservation]:
    """Pending reservations (before their start) ``actor`` may decide, soonest first."""
    q = select(Reservation).where(PENDING, Reservation.start_at > now)
    if not actor.is_admin:
        q = q.where(Reservation.user_id.in_(managed_user_ids(session, actor)))
    return list(session.scalars(q.options(*load_options).order_by(Reservation.start_at, Reservation.id)))


def decide(session: Session, *, actor: User, reservation_id: int, approve: bool, reason: str | None,
           settings: Settings, now: datetime, load) -> Reservation:
    """Approve (``pending -> confirmed``) or deny (``pending -> denied``, devices freed) under
    the row lock; the requester is told either way.

    Raises NotFound, Forbidden (not an admin nor a manager of the owner's group) and
    HistoryImmutable (409) when the reservation is no longer pending, naming who changed it.
    """
    action = lifecycle.Action.APPROVE if approve else lifecycle.Action.DENY

    def locked(s: Session, rid: int) -> Reservation:
        r = load(s, rid)
        if not may_decide(s, actor, r):
            raise Forbidden(f"reservation {r.id}: only an admin or a manager of {r.user.username}'s group may decide it")
        return r

    r, _, after = lifecycle.begin(session, reservation_id=reservation_id, action=action, now=now, tz=settings.tz,
                                  load=locked)
    r.status = after
    r.sequence += 1
    r.updated_at = now
    if not approve:
        r.cancelled_at = now
        for i in r.items:
            i.active = False
    record_audit(session, actor=f"user:{actor.username}", action=f"reservation.{action.value}",
                 target=f"reservation:{r.id}", detail={"reason": reason} if reason else {})
    when = f"{fmt_local(r.start_at, settings.tz)} – {fmt_local(r.end_at, settings.tz)}"
    with use_locale(r.user.language):  # the owner reads it in the language they chose
        args = {"id": r.id, "host": r.host.name, "when": when, "actor": actor.username, "reason": reason}
        if approve:
            subject = gettext("[gpuroster] reservation %(id)s approved", **args)
            text = (gettext("Your reservation %(id)s on %(host)s (%(when)s) was approved by %(actor)s: %(reason)s", **args)
                    if reason else gettext("Your reservation %(id)s on %(host)s (%(when)s) was approved by %(actor)s.", **args))
        else:
            subject = gettext("[gpuroster] reservation %(id)s denied", **args)
            text = (gettext("Your reservation %(id)s on %(host)s (%(when)s) was denied by %(actor)s: %(reason)s", **args)
                    if reason else gettext("Your reservation %(id)s on %(host)s (%(when)s) was denied by %(actor)s.", **args))
    holder_notices.tell(session, kind="approvals", user=r.user, reservation_id=r.id, subject=subject,
                        text=text, settings=settings, actor=f"user:{actor.username}")
    if not approve:
        on_slot_freed(session, r)
    session.flush()
    return r


def expire_due(session: Session, *, now: datetime, settings: Settings, load, ids: Sequence[int] | None = None) -> list[Reservation]:
    """Store ``expired`` for pending reservations at or past their start (all, or those of
    ``ids``), free their devices and tell their owners. Each under its row lock, so an
    approval that got there first wins (it is then no longer pending and is skipped)."""
    q = select(Reservation.id).where(PENDING, Reservation.start_at <= now)
    if ids is not None:
        q = q.where(Reservation.id.in_(list(ids)))
    out = []
    for rid in sorted(session.scalars(q)):
        lifecycle.lock_rows(session, [rid])
        r = load(session, rid)
        if lifecycle.phase(r, now) != lifecycle.Phase.EXPIRED or r.status != "pending":
            continue
        r.status = lifecycle.TRANSITIONS[(lifecycle.Phase.EXPIRED, lifecycle.Action.EXPIRE)]
        r.sequence += 1
        r.updated_at = now
        session.execute(update(ReservationDevice).where(ReservationDevice.reservation_id == r.id).values(active=False)
                        .execution_options(synchronize_session=False))
        for i in r.items:
            i.active = False
        record_audit(session, actor="system", action="reservation.expire", target=f"reservation:{r.id}",
                     detail={"start": r.start_at.isoformat()})
        with use_locale(r.user.language):
            subject = gettext("[gpuroster] reservation %(id)s expired", id=r.id)
            text = gettext("Your reservation %(id)s on %(host)s reached its start %(start)s without approval and expired.",
                     id=r.id, host=r.host.name, start=fmt_local(r.start_at, settings.tz))
        holder_notices.tell(session, kind="approvals", user=r.user, reservation_id=r.id, subject=subject, text=text,
                            settings=settings, actor="system")
        on_slot_freed(session, r)
        out.append(r)
    session.flush()
    return out


__all__ = ["crossed", "decide", "expire_due", "initial_status", "list_pending", "may_decide", "may_decide_for"]
