"""Waitlist: "tell me, or book for me, when ``count`` devices matching these constraints are
free for ``seconds`` within ``[window_start, window_end)``".

An entry is either auto-book (``book``) or notify-only. Entries are served first come,
first served (``created_at``, then ``id``) by :mod:`app.services.waitlist_serving` whenever
a reservation frees devices (cancel, release, deny, expiry of an unapproved pending, a
maintenance override, a series cancel), and once when the entry is made. This module
makes, lists and cancels entries and says what state each is in.

States (:class:`app.models.states.WaitlistStatus`): ``waiting`` until served; ``booked``
(a reservation was made through the normal booking path, ``reservation_id``); ``notified``
(the owner was told the slot is free); ``cancelled`` by its owner or an admin; ``expired``
once its window ends (shown as expired from then on, stored as such by the minutely sweep
of :func:`app.services.waitlist_serving.expire_ended`). Rows are never deleted, so the owner sees what became of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from app.config import Settings
from app.errors import Conflict, Forbidden, InvalidInput, NotFound
from app.models import User, WaitlistEntry, utcnow
from app.models.states import WaitlistStatus
from app.schemas.reservation import PlacementConstraints
from app.schemas.waitlist import WaitlistRead
from app.services import placement
from app.services.intervals import PAST_SLACK
from app.timeutil import fmt_duration, fmt_local, parse_instant
from app.services.audit import record_audit

#: The longest window an entry may wait in (a standing request for longer is a reservation).
MAX_WINDOW = timedelta(days=366)


@dataclass(frozen=True)
class WaitRequest:
    """What someone asks to wait for (already parsed): ``count`` devices for ``length``
    within ``[start, end)`` (UTC), optionally on ``host``, of a model containing ``model``,
    with at least ``min_memory_mib`` per device; ``book`` true books it, false tells."""

    count: int
    length: timedelta
    start: datetime
    end: datetime
    book: bool = False
    host: str | None = None
    model: str | None = None
    min_memory_mib: float | None = None
    note: str | None = None


def parse_window(*, start: str | None, end: str | None, within: timedelta | None, tz: str | None, fold: int | None,
                 now: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` in UTC from API input: ``start`` (default now) and either ``end`` or
    ``within`` (a length from the start). Raises InvalidInput naming the field."""
    begin = parse_instant(start, tz=tz, field="start", now=now, fold=fold) if start else now
    if (end is None) == (within is None):
        raise InvalidInput("within: give exactly one of 'end' or 'within' (how long to wait)", field="within")
    if within is not None:
        if within <= timedelta(0):
            raise InvalidInput("within: must be positive", field="within")
        if within > MAX_WINDOW:
            raise InvalidInput(f"within: a waitlist entry waits at most {MAX_WINDOW.days} days", field="within")
        try:
            return begin, begin + within
        except OverflowError:
            raise InvalidInput("start: too far in the future", field="start") from None
    assert end is not None
    return begin, parse_instant(end, tz=tz, field="end", now=now, fold=fold)


def validate(session: Session, req: WaitRequest, *, owner: User, now: datetime, settings: Settings) -> None:
    """Refuse what can never be served: a past start, an end not after the start, a window
    shorter than the length (or over :data:`MAX_WINDOW`), a length under the minimum
    reservation, an unknown host, constraints no host meets for ``owner``. Raises
    InvalidInput (422) / NotFound naming the field."""
    tz = settings.tz
    if req.length <= timedelta(0):
        raise InvalidInput("duration: must be positive", field="duration")
    if req.length > MAX_WINDOW:
        raise InvalidInput(f"duration: at most the longest window, {MAX_WINDOW.days} days", field="duration")
    if req.start < now - PAST_SLACK:
        raise InvalidInput(f"start: {fmt_local(req.start, tz)} is in the past", field="start")
    if req.end <= req.start:
        raise InvalidInput(f"end: must be after start ({fmt_local(req.end, tz)} is not after "
                           f"{fmt_local(req.start, tz)})", field="end")
    if req.end - req.start > MAX_WINDOW:
        raise InvalidInput(f"within: a waitlist entry waits at most {MAX_WINDOW.days} days", field="within")
    if req.length.total_seconds() < settings.min_reservation_seconds:
        raise InvalidInput(f"duration: a reservation lasts at least {settings.min_reservation_seconds} s",
                           field="duration")
    if req.start > now + MAX_WINDOW:
        raise InvalidInput(f"start: at most {MAX_WINDOW.days} days ahead", field="start")
    if max(req.start, now) + req.length > req.end:
        raise InvalidInput(f"within: the window {fmt_local(req.start, tz)} – {fmt_local(req.end, tz)} is shorter "
                           f"than the {fmt_duration(req.length.total_seconds())} wanted", field="within")
    # constraints no host can ever meet (too many devices, unknown model or host, hosts the
    # owner's rules exclude) are refused now rather than waiting forever
    wanted = placement.request_for(session, count=req.count, host=req.host, owner=owner, override=False,
                                   constraints=PlacementConstraints(model=req.model, min_memory_mib=req.min_memory_mib))
    try:
        placement.earliest_slot(session, req=wanted, after=max(req.start, now), length=req.length, now=now)
    except Conflict:  # every match is held open-ended today: that may end, so it may wait
        pass


def create_entry(session: Session, *, actor: User, req: WaitRequest, settings: Settings,
                 now: datetime | None = None) -> WaitlistEntry:
    """Store a ``waiting`` entry for ``actor`` (validated, see :func:`validate`) and audit it.
    The caller serves it once right away (:func:`app.services.waitlist_serving.serve`)."""
    now = now or utcnow()
    if not actor.active:
        raise Forbidden("user: a deactivated account cannot wait for devices", field="user")
    validate(session, req, owner=actor, now=now, settings=settings)
    e = WaitlistEntry(user=actor, count=req.count, seconds=int(req.length.total_seconds()),
                      window_start=max(req.start, now), window_end=req.end, host=req.host or None,
                      model=req.model or None, min_memory_mib=req.min_memory_mib, book=req.book, note=req.note,
                      status=WaitlistStatus.WAITING, created_at=now, updated_at=now)
    session.add(e)
    session.flush()
    record_audit(session, actor=f"user:{actor.username}", action="waitlist.create", target=f"waitlist:{e.id}",
                 detail={"count": e.count, "seconds": e.seconds, "book": e.book, "host": e.host,
                         "window_end": e.window_end.isoformat()})
    return e


def state(e: WaitlistEntry, now: datetime) -> str:
    """What people see: the stored status, except that a ``waiting`` entry whose window
    has ended is ``expired``."""
    if e.status == WaitlistStatus.WAITING and now >= e.window_end:
        return WaitlistStatus.EXPIRED.value
    return str(e.status)


def to_read(e: WaitlistEntry, now: datetime, position: int | None = None) -> WaitlistRead:
    """The API view of an entry (owner loaded)."""
    return WaitlistRead(id=e.id, user=e.user.username, count=e.count, duration_seconds=e.seconds,
                        window_start=e.window_start, window_end=e.window_end, host=e.host, model=e.model,
                        min_memory_mib=e.min_memory_mib, book=e.book, note=e.note, state=state(e, now),  # type: ignore[arg-type]
                        position=position, reservation_id=e.reservation_id, last_refusal=e.last_refusal,
                        created_at=e.created_at, served_at=e.served_at)


def get_entry(session: Session, entry_id: int) -> WaitlistEntry:
    """The entry with its owner loaded; raises NotFound."""
    e = session.scalar(select(WaitlistEntry).where(WaitlistEntry.id == entry_id)
                       .options(selectinload(WaitlistEntry.user)))
    if e is None:
        raise NotFound(f"waitlist entry {entry_id} not found", field="id")
    return e


def list_entries(session: Session, *, actor: User, username: str | None = None,
                 status: str | None = None) -> list[WaitlistEntry]:
    """The actor's entries (admins: everyone's, or ``username``'s), oldest first. A member
    naming someone else gets Forbidden. ``status`` filters on :func:`state`."""
    if username and username != actor.username and not actor.is_admin:
        raise Forbidden("user: only admins may list other users' waitlist entries", field="user")
    q = select(WaitlistEntry).options(selectinload(WaitlistEntry.user))
    if username:
        q = q.join(User, User.id == WaitlistEntry.user_id).where(User.username == username)
    elif not actor.is_admin:
        q = q.where(WaitlistEntry.user_id == actor.id)
    rows = list(session.scalars(q.order_by(WaitlistEntry.created_at, WaitlistEntry.id)))
    if status:
        now = utcnow()
        rows = [e for e in rows if state(e, now) == status]
    return rows


def positions(session: Session, entries: list[WaitlistEntry], now: datetime) -> dict[int, int]:
    """entry id -> its place in the queue (1 is served first) for the waiting ones."""
    waiting = [e for e in entries if state(e, now) == WaitlistStatus.WAITING]
    if not waiting:
        return {}
    first = min(e.created_at for e in waiting)
    ahead = list(session.execute(
        select(WaitlistEntry.id, WaitlistEntry.created_at)
        .where(WaitlistEntry.status == WaitlistStatus.WAITING, WaitlistEntry.window_end > now,
               WaitlistEntry.created_at >= first)
        .order_by(WaitlistEntry.created_at, WaitlistEntry.id)))
    before = session.scalar(select(func.count()).select_from(WaitlistEntry).where(
        WaitlistEntry.status == WaitlistStatus.WAITING, WaitlistEntry.window_end > now,
        WaitlistEntry.created_at < first)) or 0
    order = {eid: before + i + 1 for i, (eid, _) in enumerate(ahead)}
    return {e.id: order[e.id] for e in waiting if e.id in order}


def lock_entries(session: Session, ids: list[int], *, skip_locked: bool = False) -> list[int]:
    """Row locks of the entries ``ids`` in id order (PostgreSQL ``FOR UPDATE``; SQLite's write
    transaction already excludes other writers), so two writers never serve or cancel one
    entry twice. Returns the ids locked: with ``skip_locked``, entries another transaction
    holds are left out instead of waited for (that transaction is serving them)."""
    if not ids:
        return []
    if session.get_bind().dialect.name == "sqlite":
        return sorted(set(ids))
    return list(session.scalars(select(WaitlistEntry.id).where(WaitlistEntry.id.in_(sorted(set(ids))))
                                .order_by(WaitlistEntry.id).with_for_update(skip_locked=skip_locked)))


def cancel_entry(session: Session, *, actor: User, entry_id: int, now: datetime | None = None,
                 settings: Settings) -> WaitlistEntry:
    """Withdraw a waiting entry (its owner or an admin). Raises NotFound, Forbidden, and
    Conflict (409) when it is no longer waiting, naming what became of it."""
    now = now or utcnow()
    lock_entries(session, [entry_id])
    e = get_entry(session, entry_id)
    session.refresh(e)
    if not actor.is_admin and e.user_id != actor.id:
        raise Forbidden(f"waitlist entry {entry_id} belongs to {e.user.username}; only they or an admin may cancel it")
    st = state(e, now)
    if st != WaitlistStatus.WAITING:
        what = {"booked": f"booked reservation {e.reservation_id}", "notified": "told its owner the slot was free",
                "expired": f"expired at {fmt_local(e.window_end, settings.tz)}"}.get(st, st)
        raise Conflict(f"waitlist entry {entry_id} is {st} ({what}); only a waiting entry can be cancelled",
                       field="id", state=st)
    e.status = WaitlistStatus.CANCELLED
    e.updated_at = now
    record_audit(session, actor=f"user:{actor.username}", action="waitlist.cancel", target=f"waitlist:{e.id}")
    session.flush()
    return e


__all__ = ["MAX_WINDOW", "WaitRequest", "cancel_entry", "create_entry", "get_entry", "list_entries", "lock_entries",
           "parse_window", "positions", "state", "to_read", "validate"]
