"""A reservation's states and the one table of legal transitions; every transition locks first.

Stored status (:class:`Status`) plus time give the phase people see (:class:`Phase`):
a ``confirmed`` reservation is ``upcoming``, ``active`` or ``ended`` depending on now.
:data:`TRANSITIONS` says, for each action, from which phases it is legal and which status it
leaves. Anything not in the table is refused with 409.

Serialisation: every state change (cancel, release, change of end, edit of note or shares,
a series' cancel) calls :func:`begin`, which takes the reservation's row lock *before*
reading its state: ``SELECT … FOR UPDATE`` on PostgreSQL, so a second writer waits for the
first to commit and then sees its result; on SQLite the request's transaction already
holds the database write lock (``BEGIN IMMEDIATE``, see :func:`app.db.lock_for_write`).
The loser of a race is refused with 409 naming what the winner did, who, and when (from
the audit log). New states (approval, waitlist, maintenance) are added to :class:`Status`,
:class:`Action` and :data:`TRANSITIONS`; the lock and the refusal stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from enum import StrEnum
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import HistoryImmutable
from app.models import AuditLog, Reservation
from app.models.reservation import ReservationStatus
from app.timeutil import fmt_local


Status = ReservationStatus  # what is stored in ``reservations.status``


class Phase(StrEnum):
    """What people see: the stored status, with ``confirmed`` split by time (half-open interval)."""

    UPCOMING = "upcoming"
    ACTIVE = "active"
    ENDED = "ended"
    CANCELLED = "cancelled"
    RELEASED = "released"
    PENDING = "pending"  # awaiting approval, before its start
    DENIED = "denied"
    EXPIRED = "expired"  # a pending at or after its start, approved by nobody


class Action(StrEnum):
    """A state change someone asks for; the audit log records ``reservation.<action>``."""

    CANCEL = "cancel"
    RELEASE = "release"
    CHANGE_END = "change_end"
    EDIT = "edit"
    APPROVE = "approve"
    DENY = "deny"
    EXPIRE = "expire"  # the sweep storing that a pending reached its start unapproved
    OVERRIDE = "override"  # a maintenance with override cancelling or shortening the reservation
    RELEASE_DEVICES = "release_devices"  # some devices of an active reservation freed now, the rest kept


# (phase before, action) -> stored status after. The only legal transitions.
TRANSITIONS: dict[tuple[Phase, Action], Status] = {
    (Phase.UPCOMING, Action.CANCEL): Status.CANCELLED,
    (Phase.ACTIVE, Action.RELEASE): Status.RELEASED,
    (Phase.UPCOMING, Action.CHANGE_END): Status.CONFIRMED,
    (Phase.ACTIVE, Action.CHANGE_END): Status.CONFIRMED,
    (Phase.UPCOMING, Action.EDIT): Status.CONFIRMED,
    (Phase.ACTIVE, Action.EDIT): Status.CONFIRMED,
    (Phase.PENDING, Action.APPROVE): Status.CONFIRMED,
    (Phase.PENDING, Action.DENY): Status.DENIED,
    (Phase.PENDING, Action.CANCEL): Status.CANCELLED,
    (Phase.PENDING, Action.EDIT): Status.PENDING,
    (Phase.EXPIRED, Action.EXPIRE): Status.EXPIRED,
    # maintenance with override: one that starts inside the maintenance is cancelled, one that
    # started before it is cut at the maintenance's start (its status stays)
    (Phase.PENDING, Action.OVERRIDE): Status.CANCELLED,
    (Phase.UPCOMING, Action.OVERRIDE): Status.CONFIRMED,
    (Phase.ACTIVE, Action.OVERRIDE): Status.CONFIRMED,
    (Phase.ACTIVE, Action.RELEASE_DEVICES): Status.CONFIRMED,
}

# Audit actions that mark a state change of a reservation (what a refused loser is told about).
_CHANGE_ACTIONS = tuple(f"reservation.{a}" for a in ("cancel", "release", "change_end", "share", "edit", "approve",
                                                     "deny", "expire", "override",
                                                     "release_devices"))
_HISTORY = (Phase.ENDED, Phase.CANCELLED, Phase.RELEASED, Phase.DENIED, Phase.EXPIRED)


def phase(r: Reservation, now: datetime) -> Phase:
    """The reservation's phase at ``now`` (``[start, end)`` half-open)."""
    if r.status == Status.CANCELLED:
        return Phase.CANCELLED
    if r.status == Status.RELEASED:
        return Phase.RELEASED
    if r.status == Status.DENIED:
        return Phase.DENIED
    if r.status == Status.EXPIRED:
        return Phase.EXPIRED
    if r.status == Status.PENDING:
        return Phase.PENDING if now < r.start_at else Phase.EXPIRED
    if now < r.start_at:
        return Phase.UPCOMING
    if now < r.end_at:
        return Phase.ACTIVE
    return Phase.ENDED


def legal_actions(p: Phase) -> list[Action]:
    """The actions :data:`TRANSITIONS` allows from phase ``p``."""
    return [a for (ph, a) in TRANSITIONS if ph == p]


def lock_rows(session: Session, ids: Sequence[int]) -> None:
    """Take the row locks of reservations ``ids`` in id order (one order for every writer, so
    two writers never deadlock). PostgreSQL ``SELECT … FOR UPDATE``; on SQLite the write
    transaction already excludes every other writer, so nothing to do."""
    if not ids or session.get_bind().dialect.name == "sqlite":
        return
    session.execute(select(Reservation.id).where(Reservation.id.in_(sorted(set(ids)))).order_by(Reservation.id)
                    .with_for_update())


def last_change(session: Session, reservation_id: int) -> AuditLog | None:
    """The latest audit entry that changed the reservation's state, end or note."""
    return session.scalar(
        select(AuditLog).where(AuditLog.target == f"reservation:{reservation_id}", AuditLog.action.in_(_CHANGE_ACTIONS))
        .order_by(AuditLog.id.desc()).limit(1)
    )


def refusal(session: Session, r: Reservation, action: Action, p: Phase, *, tz: ZoneInfo) -> HistoryImmutable:
    """The 409 for ``action`` on ``r`` in phase ``p``: names who changed it last and when, or when it ended."""
    last = last_change(session, r.id)
    extra: dict[str, object] = {"state": p.value, "action": action.value}
    decided = action in (Action.APPROVE, Action.DENY) and last is not None
    if (p in (Phase.CANCELLED, Phase.RELEASED, Phase.DENIED) or decided) and last is not None:
        who = last.actor.removeprefix("user:")
        done = last.action.removeprefix("reservation.")
        when = fmt_local(last.at, tz)
        extra.update(changed_by=who, changed_action=done, changed_at=last.at.isoformat())
        if p in _HISTORY:
            detail = f"reservation {r.id} was {p.value} by {who} at {when}; history cannot be changed"
        else:
            detail = (f"reservation {r.id} is {p.value}, no longer pending: {done} by {who} at {when}; "
                      f"cannot {action.value} it")
    elif p == Phase.EXPIRED:
        detail = (f"reservation {r.id} expired unapproved at its start {fmt_local(r.start_at, tz)}; "
                  "history cannot be changed")
    elif p in _HISTORY:
        detail = f"reservation {r.id} {p.value} at {fmt_local(r.end_at, tz)}; history cannot be changed"
    else:
        allowed = ", ".join(a.value for a in legal_actions(p)) or "nothing"
        detail = f"reservation {r.id} is {p.value}: cannot {action.value.replace('_', ' ')} it (allowed: {allowed})"
    return HistoryImmutable(detail, **extra)


def begin(
    session: Session, *, reservation_id: int, action: Action | Callable[[Phase], Action], now: datetime,
    tz: ZoneInfo, load: Callable[[Session, int], Reservation],
) -> tuple[Reservation, Phase, Status]:
    """Lock the reservation, then check that ``action`` is legal in its current phase.

    ``action`` may be a function of the phase (DELETE cancels an upcoming reservation and
    releases an active one: which one is only known once the lock is held).
    ``load(session, id)`` loads the reservation (with what the caller needs) after the lock,
    so it sees the state the previous writer committed. Returns the reservation, its phase
    and the status the action leaves. Raises NotFound (from ``load``) and HistoryImmutable
    (409, naming the change that got there first) for an illegal transition.
    """
    lock_rows(session, [reservation_id])
    r = load(session, reservation_id)
    p = phase(r, now)
    if not isinstance(action, Action):
        action = action(p)
    after = TRANSITIONS.get((p, action))
    if after is None:
        raise refusal(session, r, action, p, tz=tz)
    return r, p, after


__all__ = ["Action", "Phase", "Status", "TRANSITIONS", "begin", "last_change", "legal_actions", "lock_rows", "phase"]
