"""Serving the waitlist: when devices are freed, the waiting entries are tried in order.

When
    :func:`on_slot_freed` is subscribed to :mod:`app.services.slot_freed`, so cancel,
    release, deny, the expiry of an unapproved pending, a maintenance override and a series
    cancel all reach it. It only notes that something was freed; the entries are served just
    before that transaction commits (``before_commit``), after the change that freed the
    slot is complete: a maintenance with override first cuts the reservations in its way
    and then inserts itself, so serving earlier would hand its window to a waiting entry.
    What serving books or tells commits with the change that freed the slot, or not at all.
    The app's sweep (every :data:`EXPIRE_PERIOD_S` seconds) serves the waiting entries too:
    a refusal by a rolling quota can pass later, and an entry another process was serving
    (skipped, see Order) gets its turn.

Order
    Waiting entries are locked (id order; on PostgreSQL those another transaction holds are
    skipped, never waited for) and tried oldest first (``created_at``, ``id``):
    the first that fits gets the slot. Each try asks placement for the earliest ``count``
    matching devices free for the length at or after ``max(now, window_start)``; it fits
    when that slot ends by ``window_end``.

Auto-book
    The booking goes through :func:`app.services.reservations.create_reservation` as the
    entry's owner, so sharing rules, quotas, approval thresholds and conflicts apply. It runs
    inside a savepoint: a refusal rolls back only the attempt, stores why on the entry
    (``last_refusal``) and leaves it waiting, and the freeing transaction goes on intact.
    The owner is told what was booked (:mod:`app.services.holder_notices`: audit log and
    e-mail through :mod:`app.services.notices`) unless they turned the ``waitlist``
    notice kind off.

Notify-only
    The owner is told the slot is free, with a link to book it; the entry is ``notified``.
    Telling holds nothing: an auto-book entry behind it may still book the same devices.

Expiry
    An entry whose window can no longer hold its length is stored ``expired`` when met,
    and one whose window has ended by the app's sweep (:func:`expire_ended`, every minute).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from urllib.parse import urlencode

from sqlalchemy import Engine, event, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from app.config import Settings
from app.errors import AppError
from app.i18n import gettext, use_locale
from app.models import Reservation, WaitlistEntry, utcnow
from app.models.states import WaitlistStatus
from app.schemas.reservation import PlacementConstraints, ReservationCreate
from app.services import holder_notices, placement
from app.services import reservations as reservation_service
from app.services import slot_freed
from app.services.waitlist import lock_entries
from app.timeutil import fmt_duration, fmt_local
from app.services.audit import record_audit

log = logging.getLogger(__name__)

_FREED = "gpuroster.waitlist.freed"
_HOOKED = "gpuroster.waitlist.hooked"
_settings_by_engine: weakref.WeakKeyDictionary[Engine, Settings] = weakref.WeakKeyDictionary()


def bind_settings(engine: Engine, settings: Settings) -> None:
    """Serve the waitlist of ``engine``'s database with ``settings`` (the lab's zone, rules'
    inputs, the base URL of links). Called by :func:`install` when the app starts."""
    _settings_by_engine[engine] = settings


def on_slot_freed(session: Session, reservation: Reservation) -> None:
    """The :mod:`app.services.slot_freed` listener: note the freed slot and serve the
    waitlist before this transaction commits (see the module docstring for why then)."""
    session.info.setdefault(_FREED, []).append(reservation.id)
    if session.info.get(_HOOKED):
        return
    session.info[_HOOKED] = True
    event.listen(session, "before_commit", _before_commit)
    event.listen(session, "after_transaction_end", _forget)


def _forget(session: Session, transaction) -> None:
    # only when the outermost transaction ends: a savepoint rolled back inside it (a refused
    # booking attempt) does not undo the change that freed the slot
    if transaction.parent is None:
        session.info.pop(_FREED, None)


def _before_commit(session: Session) -> None:
    freed = session.info.pop(_FREED, None)
    if not freed:
        return
    # a session bound to a connection (not the engine) serves with the settings of that connection's engine
    settings = _settings_by_engine.get(session.get_bind().engine)
    if settings is None:
        log.warning("waitlist not served: no settings bound to this database (call waitlist_serving.bind_settings)")
        return
    served = serve(session, settings=settings, now=utcnow())
    if served:
        log.info("waitlist: served entries %s after reservations %s freed devices", [e.id for e in served], freed)


EXPIRE_PERIOD_S = 60.0  # how often ended entries are stored as expired and waiting ones served again


def expire_ended(session: Session, *, now: datetime, settings: Settings) -> int:
    """Store ``expired`` for waiting entries whose window has ended (each under its row
    lock, audited); returns how many."""
    ids = list(session.scalars(select(WaitlistEntry.id).where(WaitlistEntry.status == WaitlistStatus.WAITING,
                                                              WaitlistEntry.window_end <= now)))
    lock_entries(session, ids)
    ended = list(session.scalars(select(WaitlistEntry).where(WaitlistEntry.id.in_(ids),
                                                             WaitlistEntry.status == WaitlistStatus.WAITING)
                                 .execution_options(populate_existing=True))) if ids else []
    for e in ended:
        _expire(session, e, now=now, settings=settings)
    session.flush()
    return len(ended)


def serve_round(app) -> int:
    """One periodic round in its own transaction: store ended entries as expired, then serve
    the waiting ones again (entries a busy server skipped, or that a rule refused earlier: a
    rolling quota frees up with time). Returns how many expired."""
    from app.db import run_in_transaction

    def work(s: Session) -> int:
        now = utcnow()
        n = expire_ended(s, now=now, settings=app.state.settings)
        serve(s, settings=app.state.settings, now=now)
        return n
    return run_in_transaction(app.state.session_factory, work)


def _report(n: int) -> None:
    if n:
        log.info("%d waitlist entr(y/ies) expired with their window", n)


def install(app) -> None:
    """Subscribe :func:`on_slot_freed`, bind the app's settings to its engine once the
    lifespan has built it, and every :data:`EXPIRE_PERIOD_S` seconds while the app runs
    run :func:`serve_round`."""
    from app.periodic import run_periodically

    slot_freed.subscribe(on_slot_freed)
    run_periodically(app, name="gpuroster-waitlist-round", what="the waitlist round", work=serve_round,
                     period=EXPIRE_PERIOD_S, report=_report,
                     on_start=lambda a: bind_settings(a.state.engine, a.state.settings))


# ------------------------------------------------------------------------------------------ serving


def _waiting(session: Session, only: list[int] | None) -> list[WaitlistEntry]:
    q = select(WaitlistEntry.id).where(WaitlistEntry.status == WaitlistStatus.WAITING)
    if only is not None:
        q = q.where(WaitlistEntry.id.in_(only))
    ids = list(session.scalars(q))
    if not ids:
        return []
    # Serving runs inside transactions that may already hold GPU write locks (a maintenance
    # override, a booking that expired a pending); waiting here for entries another server is
    # serving, while that server waits for those GPUs, would deadlock. Skip them instead: the
    # other server serves them, and the periodic round retries whatever is still waiting.
    ids = lock_entries(session, ids, skip_locked=True)
    if not ids:
        return []
    return list(session.scalars(
        select(WaitlistEntry).where(WaitlistEntry.id.in_(ids), WaitlistEntry.status == WaitlistStatus.WAITING)
        .options(selectinload(WaitlistEntry.user)).order_by(WaitlistEntry.created_at, WaitlistEntry.id)
        .execution_options(populate_existing=True)))


def serve(session: Session, *, settings: Settings, now: datetime, only: list[int] | None = None) -> list[WaitlistEntry]:
    """Try every waiting entry (or those of ``only``), oldest first; book or tell those that
    fit now, store ``expired`` for those that never can. Returns the entries booked or told."""
    done: list[WaitlistEntry] = []
    loaded = _Loaded()
    for e in _waiting(session, only):
        length = timedelta(seconds=e.seconds)
        if max(now, e.window_start) + length > e.window_end:
            _expire(session, e, now=now, settings=settings)
            continue
        if not e.user.active:  # a deactivated owner is neither booked for nor told; re-activation resumes it
            continue
        slot = _free_slot(session, e, now=now, loaded=loaded)
        if slot is None:
            continue
        if e.book:
            if _book(session, e, slot, settings=settings, now=now):
                loaded.candidates.clear()  # the booking changed who holds what
                done.append(e)
        else:
            _notify(session, e, slot, settings=settings, now=now)
            done.append(e)
    session.flush()
    return done


@dataclass
class _Loaded:
    """What one serving round loads once: each owner's placement request (their rules) per
    constraints, and the matching devices with their busy intervals per request (dropped
    after a booking)."""

    requests: dict[tuple, placement.Request] = field(default_factory=dict)
    candidates: dict[tuple, list[placement.Candidate]] = field(default_factory=dict)


def _free_slot(session: Session, e: WaitlistEntry, *, now: datetime, loaded: _Loaded) -> placement.Slot | None:
    """The earliest slot for the entry inside its window, or None."""
    try:
        key = (e.user_id, e.host, e.model, e.min_memory_mib)
        if key not in loaded.requests:
            loaded.requests[key] = placement.request_for(session, count=1, host=e.host, constraints=_constraints(e),
                                                         owner=e.user, override=False)
        req = replace(loaded.requests[key], count=e.count)
        same = (req.host, req.model, req.min_memory_mib, _frozen(req.allowed_hosts), _frozen(req.allowed_models))
        if same not in loaded.candidates:
            loaded.candidates[same] = placement.candidates(session, req=req, after=now)
        slot = placement.earliest_among(loaded.candidates[same], req=req, after=max(now, e.window_start),
                                        length=timedelta(seconds=e.seconds), now=now)
    except AppError:  # nothing matches (any more), or held open-ended: keep waiting
        return None
    return slot if slot.end <= e.window_end else None


def _frozen(values) -> tuple | None:
    return None if values is None else tuple(values)


def _constraints(e: WaitlistEntry) -> PlacementConstraints:
    return PlacementConstraints(model=e.model, min_memory_mib=e.min_memory_mib)


def _book(session: Session, e: WaitlistEntry, slot: placement.Slot, *, settings: Settings, now: datetime) -> bool:
    """Book ``slot`` for the entry's owner through the normal path inside a savepoint; True
    when booked. A refusal (rules, quotas, a conflict) leaves the entry waiting."""
    data = ReservationCreate(count=e.count, host=slot.host.name, constraints=_constraints(e),
                             start=slot.start.isoformat(), duration=timedelta(seconds=e.seconds),
                             note=e.note or f"from waitlist entry {e.id}")
    savepoint = session.begin_nested()
    try:
        r = reservation_service.create_reservation(session, actor=e.user, data=data, settings=settings, now=now)
        if r.end_at > e.window_end:
            raise _OutsideWindow(f"the earliest slot ends {fmt_local(r.end_at, settings.tz)}, after the window")
        savepoint.commit()
    except (AppError, _OutsideWindow, IntegrityError) as err:
        savepoint.rollback()
        e.last_refusal = (getattr(err, "detail", None) or str(err))[:1024]
        e.updated_at = now
        record_audit(session, actor="system", action="waitlist.refused", target=f"waitlist:{e.id}",
                     detail={"reason": e.last_refusal})
        return False
    e.status = WaitlistStatus.BOOKED
    e.reservation_id = r.id
    e.served_at = e.updated_at = now
    e.last_refusal = None
    record_audit(session, actor="system", action="waitlist.book", target=f"waitlist:{e.id}",
                 detail={"reservation": r.id})
    when = f"{fmt_local(r.start_at, settings.tz)} – {fmt_local(r.end_at, settings.tz)}"
    with use_locale(e.user.language):  # the member reads it in the language they chose
        pending = gettext(" It awaits approval.") if r.status == "pending" else ""
        subject = gettext("[gpuroster] waitlist: reservation %(id)s booked", id=r.id)
        text = gettext("Your waitlist entry %(entry)s booked reservation %(id)s: %(n)s device(s) on %(host)s, %(when)s.",
                       entry=e.id, id=r.id, n=len(r.items), host=r.host.name, when=when)
    holder_notices.tell(
        session, kind="waitlist", user=e.user, reservation_id=r.id, subject=subject,
        text=f"{text}{pending} CUDA_VISIBLE_DEVICES={reservation_service.cuda_visible_devices(r)}",
        settings=settings, actor="system")
    return True


class _OutsideWindow(Exception):
    """The booking the normal path made does not end inside the entry's window."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def book_link(e: WaitlistEntry, slot: placement.Slot, settings: Settings) -> str:
    """The Book page prefilled for the slot: any ``count`` devices of the slot's host from its
    start for the entry's length (hours), times in the lab's zone."""
    query = urlencode({"mode": "count", "count": e.count, "host": slot.host.name, "when": "at",
                       "start": slot.start.astimezone(settings.tz).strftime("%Y-%m-%dT%H:%M"),
                       "length": f"{e.seconds / 3600:g}"})
    return f"{settings.base_url.rstrip('/')}/book?{query}"


def _notify(session: Session, e: WaitlistEntry, slot: placement.Slot, *, settings: Settings, now: datetime) -> None:
    e.status = WaitlistStatus.NOTIFIED
    e.served_at = e.updated_at = now
    record_audit(session, actor="system", action="waitlist.notify", target=f"waitlist:{e.id}",
                 detail={"host": slot.host.name, "start": slot.start.isoformat()})
    with use_locale(e.user.language):
        subject = gettext("[gpuroster] waitlist: %(n)s device(s) free", n=e.count)
        text = gettext("Your waitlist entry %(entry)s: %(n)s device(s) on %(host)s are free for %(length)s from %(start)s. "
                       "Nothing is held for you; book it: %(link)s", entry=e.id, n=e.count, host=slot.host.name,
                       length=fmt_duration(e.seconds), start=fmt_local(slot.start, settings.tz),
                       link=book_link(e, slot, settings))
    holder_notices.tell(session, kind="waitlist", user=e.user, reservation_id=None, subject=subject, text=text,
                        settings=settings, actor="system")


def _expire(session: Session, e: WaitlistEntry, *, now: datetime, settings: Settings) -> None:
    e.status = WaitlistStatus.EXPIRED
    e.updated_at = now
    record_audit(session, actor="system", action="waitlist.expire", target=f"waitlist:{e.id}",
                 detail={"window_end": e.window_end.isoformat()})


__all__ = ["bind_settings", "book_link", "expire_ended", "install", "on_slot_freed", "serve"]
