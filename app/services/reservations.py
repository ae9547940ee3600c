"""Reservations: booking, changes, cancellation and release (the conflict checks they rely
on are :mod:`app.services.conflicts`).

No double booking is decided by the database (see ``app.models.reservation``): on SQLite
the request's transaction was begun with ``BEGIN IMMEDIATE`` before the conflict check
(``app.db.lock_for_write``); on PostgreSQL the exclusion constraints refuse an overlapping
insert even when two app processes passed the check at the same moment, and the
violation is turned into :class:`ReservationConflict` (409) naming the conflicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import Forbidden, InvalidInput, NotFound
from app.models import (
    Device,
    Host,
    Reservation,
    ReservationDevice,
    User,
    utcnow,
)
from app.schemas.reservation import DeviceRef, ReservationCreate, ReservationRead, ReservationUpdate
from app.services import approvals, lifecycle, placement
from app.services import shares as share_service
from app.services import rules as rules_service
from app.services.conflicts import (UTC_ZONE, conflict_error, devices_sorted, find_conflicts,
                                    loaded_options, write_guarded)
from app.services.booking_write import add_reservation
from app.services.device_refs import resolve_bookable_devices
from app.services.intervals import parse_interval, validate_interval
from app.services.slot_freed import on_slot_freed
from app.timeutil import fmt_local, parse_instant
from app.services.audit import record_audit


def reservation_state(r: Reservation, now: datetime) -> str:
    """Displayed state: cancelled / released / upcoming / active / ended (half-open interval);
    see :func:`app.services.lifecycle.phase`."""
    return lifecycle.phase(r, now).value


def get_reservation(session: Session, reservation_id: int) -> Reservation:
    """The reservation with devices, user, host and shares loaded; raises NotFound."""
    r = session.scalar(select(Reservation).where(Reservation.id == reservation_id).options(*loaded_options()))
    if r is None:
        raise NotFound(f"reservation {reservation_id} not found", field="id")
    return r


def cuda_visible_devices(r: Reservation) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the reservation: its device UUIDs in index order."""
    return ",".join(d.uuid for d in devices_sorted(r))


def checkin_question(r: Reservation, now: datetime) -> str | None:
    """What the holder of ``r`` is asked at ``now``: ``"checkin"`` (warned, no check-in yet),
    ``"idle"`` (still using it?) or ``None``. The sweep that asks is :mod:`app.services.checkin_sweep`."""
    if lifecycle.phase(r, now) != lifecycle.Phase.ACTIVE:
        return None
    if r.checkin_warned_at is not None and r.checked_in_at is None and r.checkin_kept_at is None:
        return "checkin"
    if r.idle_asked_at is not None and r.idle_kept_at is None:
        return "idle"
    return None


def share_names(r: Reservation) -> list[str]:
    return sorted(
        (s.user.username if s.user is not None else f"group:{s.group.name}") for s in r.shares if (s.user or s.group)
    )


def to_read(r: Reservation, now: datetime | None = None) -> ReservationRead:
    """The API view of a loaded reservation."""
    now = now or utcnow()
    return ReservationRead(
        id=r.id,
        user=r.user.username,
        host=r.host.name,
        devices=[
            DeviceRef(uuid=d.uuid, index=d.index, name=d.name, pci_bus_id=d.pci_bus_id, mig_profile=d.mig_profile)
            for d in devices_sorted(r)
        ],
        start=r.start_at,
        end=r.end_at,
        state=reservation_state(r, now),  # type: ignore[arg-type]
        status=r.status,
        note=r.note,
        cuda_visible_devices=cuda_visible_devices(r),
        series_id=r.series_id,
        shared_with=share_names(r),
        created_at=r.created_at,
        override_reason=r.override_reason,
        kind=r.kind or "booking",
        checked_in_at=r.checked_in_at,
        question=checkin_question(r, now),
        auto_release=r.auto_release,
    )


# ---------------------------------------------------------------------------- create / change


def resolve_owner(session: Session, *, actor: User, username: str | None, override_reason: str | None) -> User:
    """Who a booking is for: the actor, or (admins only) ``username``.

    Raises Forbidden when a member books for someone else or gives an override reason,
    InvalidInput for an unknown or deactivated owner.
    """
    owner = actor
    if username and username != actor.username:
        if not actor.is_admin:
            raise Forbidden("user: only admins may book for another user", field="user")
        owner = session.scalar(select(User).where(User.username == username))
        if owner is None:
            raise InvalidInput(f"user: no user {username!r}", field="user")
    if not owner.active:
        raise InvalidInput(f"user: {owner.username!r} is deactivated", field="user")
    if override_reason and not actor.is_admin:
        raise Forbidden("override_reason: only admins may override sharing rules", field="override_reason")
    return owner


def create_reservation(
    session: Session, *, actor: User, data: ReservationCreate, settings: Settings, now: datetime | None = None
) -> Reservation:
    """Book devices for ``[start, end)``; returns the loaded reservation.

    Raises InvalidInput (422) for bad times or devices, Forbidden when a member books for
    someone else or a sharing rule refuses, ReservationConflict (409) naming conflicts and
    the earliest free start.
    """
    now = now or utcnow()
    owner = resolve_owner(session, actor=actor, username=data.user, override_reason=data.override_reason)

    interval = parse_interval(data, now=now)
    validate_interval(interval.start, interval.end, now=now, settings=settings)

    if data.count is not None:
        # placement's candidates leave out devices reported lost: no health check needed
        host, devices, interval = placement.place(
            session, data=data, owner=owner, interval=interval, now=now
        )
    else:
        if not data.host:
            raise InvalidInput("host: required when 'devices' are given", field="host")
        host, devices = resolve_bookable_devices(session, host_name=data.host, refs=data.devices or [], tz=settings.tz)

    rules_service.validate_reservation(
        session,
        owner=owner,
        actor=actor,
        host=host,
        devices=devices,
        start=interval.start,
        end=interval.end,
        existing=None,
        override_reason=data.override_reason,
        now=now,
        tz=settings.tz,
    )

    status, approval = approvals.initial_status(session, owner=owner, actor=actor, devices=devices,
                                                start=interval.start, end=interval.end, now=now)
    found = find_conflicts(session, devices=devices, start=interval.start, end=interval.end)
    if found and approvals.expire_due(session, now=now, settings=settings, load=load_locked, ids=[c.id for c in found]):
        found = find_conflicts(session, devices=devices, start=interval.start, end=interval.end)
    if found:
        raise conflict_error(session, devices=devices, start=interval.start, end=interval.end, exclude_id=None, tz=settings.tz,
                             viewer=actor.username, found=found)

    r = add_reservation(
        session, user=owner, host=host, devices=devices, start=interval.start, end=interval.end,
        values={"status": status, "note": data.note, "created_by_id": actor.id,
                "override_reason": data.override_reason, "created_at": now, "updated_at": now},
        shares=share_service.resolve_shares(session, data.share_with or []), tz=settings.tz,
    )
    record_audit(session, actor=f"user:{actor.username}",
                 action="reservation.create",
                 target=f"reservation:{r.id}",
                 detail={"user": owner.username,
                         **({"override_reason": data.override_reason} if data.override_reason else {}),
                         **({"approval": approval} if approval else {})})
    return r


def _flushed(session: Session, r: Reservation) -> Reservation:
    """Flush and return ``r``; its relationships were set or loaded in this session, so the
    API view needs no reload (a full reload with five eager loads cost half a booking)."""
    session.flush()
    return r


def load_locked(session: Session, reservation_id: int) -> Reservation:
    """Like :func:`get_reservation`, but refreshes a copy already in the session: called
    right after the row lock, it must see what the previous writer committed."""
    r = session.scalar(select(Reservation).where(Reservation.id == reservation_id).options(*loaded_options())
                       .execution_options(populate_existing=True))
    if r is None:
        raise NotFound(f"reservation {reservation_id} not found", field="id")
    return r


def _end_action(p: lifecycle.Phase) -> lifecycle.Action:
    """DELETE and release mean cancel before the start (or while pending) and release after it."""
    return lifecycle.Action.CANCEL if p in (lifecycle.Phase.UPCOMING, lifecycle.Phase.PENDING) else lifecycle.Action.RELEASE


def _can_modify(actor: User, r: Reservation) -> Reservation:
    """``r`` if ``actor`` owns it or is an admin; raises Forbidden otherwise."""
    if not actor.is_admin and r.user_id != actor.id:
        raise Forbidden(f"reservation {r.id} belongs to {r.user.username}; only they or an admin may change it")
    return r


def update_reservation(
    session: Session,
    *,
    actor: User,
    reservation_id: int,
    data: ReservationUpdate,
    settings: Settings,
    now: datetime | None = None,
) -> Reservation:
    """Change the end, the note and/or the shares. History (ended, cancelled, released) is
    immutable (409).

    A new end re-checks conflicts (409) and sharing rules through the same validator as
    create (only a longer end can break a rule); note-only and share-only edits check no
    rule. ``share_with`` replaces the list (``[]`` clears it).
    """
    now = now or utcnow()
    action = lifecycle.Action.CHANGE_END if data.end is not None else lifecycle.Action.EDIT
    r, state, _ = lifecycle.begin(session, reservation_id=reservation_id, action=action, now=now, tz=settings.tz,
                                  load=lambda s, rid: _can_modify(actor, load_locked(s, rid)))
    if data.override_reason and not actor.is_admin:
        raise Forbidden("override_reason: only admins may override sharing rules", field="override_reason")
    if data.note is not None:
        r.note = data.note
    if data.share_with is not None:
        share_service.replace_shares(session, r, data.share_with, actor=actor)
    if data.end is not None:
        new_end = parse_instant(data.end, tz=data.tz, field="end", now=now, fold=data.fold)
        if new_end <= r.start_at:
            raise InvalidInput(f"end: must be after start ({fmt_local(r.start_at, settings.tz)})", field="end")
        if new_end <= now and state == "active":
            raise InvalidInput("end: must be in the future; use release to end it now", field="end")
        if new_end != r.end_at:
            devices = [i.device for i in r.items if i.end_at >= r.end_at]  # not those released early
            if new_end > r.end_at and find_conflicts(session, devices=devices, start=r.end_at, end=new_end, exclude_id=r.id):
                raise conflict_error(session, devices=devices, start=r.end_at, end=new_end, exclude_id=r.id, tz=settings.tz,
                                     viewer=actor.username)
            rules_service.validate_reservation(
                session,
                owner=r.user,
                actor=actor,
                host=r.host,
                devices=devices,
                start=r.start_at,
                end=new_end,
                existing=r,
                override_reason=data.override_reason,
                now=now,
                tz=settings.tz,
            )
            old_end = r.end_at

            def extend() -> None:
                for i in r.items:
                    if i.end_at >= r.end_at:  # a device released early stays released
                        i.end_at = new_end
                r.end_at = new_end

            session.flush()
            write_guarded(session, extend, devices=devices, start=old_end, end=new_end, exclude_id=r.id, tz=settings.tz)
            record_audit(session, actor=f"user:{actor.username}",
                         action="reservation.change_end",
                         target=f"reservation:{r.id}",
                         detail={"from": old_end.isoformat(), "to": new_end.isoformat(), "override_reason": data.override_reason})
    r.sequence += 1
    r.updated_at = now
    return _flushed(session, r)


def end_reservation(
    session: Session, *, actor: User, reservation_id: int, now: datetime | None = None, tz: ZoneInfo = UTC_ZONE
) -> Reservation:
    """DELETE semantics: an upcoming reservation is cancelled, an active one released (end = now).

    Takes the reservation's row lock first (:func:`app.services.lifecycle.begin`). Raises
    HistoryImmutable (409) for ended, cancelled or released reservations, naming who got
    there first (times in ``tz``).
    """
    now = now or utcnow()
    r, _, after = lifecycle.begin(session, reservation_id=reservation_id, action=_end_action, now=now, tz=tz,
                                  load=lambda s, rid: _can_modify(actor, load_locked(s, rid)))
    return apply_end(session, r, after, now=now, actor=f"user:{actor.username}")


def apply_end(session: Session, r: Reservation, after: lifecycle.Status, *, now: datetime, actor: str,
              detail: dict | None = None) -> Reservation:
    """Store the end that :func:`app.services.lifecycle.begin` allowed (``after``: cancelled,
    or released with ``end = now``), audited as ``actor`` (``user:<name>`` or ``system``) with
    ``detail``, and tell the slot-freed listeners. The caller holds the row lock."""
    r.status = after
    if after == lifecycle.Status.CANCELLED:
        r.cancelled_at = now
        for i in r.items:
            i.active = False
        action = "reservation.cancel"
    else:
        r.end_at = max(now, r.start_at + timedelta(microseconds=1))
        for i in r.items:
            i.end_at = min(i.end_at, r.end_at)  # devices released earlier keep their earlier end
        action = "reservation.release"
    r.sequence += 1
    r.updated_at = now
    record_audit(session, actor=actor, action=action, target=f"reservation:{r.id}", detail=detail)
    on_slot_freed(session, r)
    return _flushed(session, r)


@dataclass
class ReservationFilter:
    user: str | None = None
    host: str | None = None
    device: str | None = None
    state: str | None = None
    start: datetime | None = None  # overlapping [from, to)
    end: datetime | None = None


def list_reservations(
    session: Session, *, flt: ReservationFilter, limit: int, offset: int, now: datetime | None = None
) -> tuple[list[Reservation], int]:
    """Reservations matching ``flt`` ordered by start, with the total count."""
    now = now or utcnow()
    q = select(Reservation)
    if flt.user:
        q = q.join(User, User.id == Reservation.user_id).where(User.username == flt.user)
    if flt.host:
        q = q.join(Host, Host.id == Reservation.host_id).where(Host.name == flt.host)
    if flt.device:
        sub = (
            select(ReservationDevice.reservation_id)
            .join(Device, Device.id == ReservationDevice.device_id)
            .where(Device.uuid == flt.device)
        )
        q = q.where(Reservation.id.in_(sub))
    if flt.start is not None:
        q = q.where(Reservation.end_at > flt.start)
    if flt.end is not None:
        q = q.where(Reservation.start_at < flt.end)
    if flt.state:
        st = flt.state
        if st == "cancelled":
            q = q.where(Reservation.status == "cancelled")
        elif st in ("released", "pending", "denied", "expired"):
            q = q.where(Reservation.status == st)
        elif st == "upcoming":
            q = q.where(Reservation.status == "confirmed", Reservation.start_at > now)
        elif st == "active":
            q = q.where(Reservation.status == "confirmed", Reservation.start_at <= now, Reservation.end_at > now)
        elif st == "ended":
            q = q.where(Reservation.status == "confirmed", Reservation.end_at <= now)
        else:
            raise InvalidInput(
                "state: one of upcoming, active, ended, cancelled, released, pending, denied, expired", field="state"
            )
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = list(session.scalars(q.options(*loaded_options()).order_by(Reservation.start_at, Reservation.id).limit(limit).offset(offset)))
    return rows, total
