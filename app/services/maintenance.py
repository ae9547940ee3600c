"""Maintenance: an admin's hold of a host's devices (all, or some), possibly open-ended.

A maintenance is a reservation with ``kind = 'maintenance'`` held by the admin who made it,
so the same exclusion constraints, conflict answers, pages and feeds cover it. Open-ended
("until I end it") means it ends at :data:`app.timeutil.MAX_INSTANT`; the admin ends it with
release (``DELETE /api/v1/reservations/{id}``) like any reservation.

Conflicts: without ``override`` the answer is the usual 409 listing every conflicting
reservation. With ``override``, each one is changed under its row lock (id order, through
:func:`app.services.lifecycle.begin`): a reservation that starts before the maintenance is
cut to end at its start; any other (starting inside it, or pending) is cancelled. Each
holder is told why and by whom (:mod:`app.services.holder_notices`), each change is in the
audit log (``reservation.override``, with the maintenance id and reason), and listeners of
freed slots run. Nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.i18n import gettext, use_locale
from app.config import Settings
from app.errors import InvalidInput
from app.models import Device, Reservation, User
from app.services import holder_notices, lifecycle
from app.services.booking_write import add_reservation
from app.services.conflicts import conflict_error, find_conflicts
from app.services.device_refs import resolve_bookable_devices
from app.services.slot_freed import on_slot_freed
from app.timeutil import MAX_INSTANT, fmt_local
from app.services.audit import record_audit


@dataclass
class Overridden:
    """What a maintenance with override did to one reservation: ``cancelled`` or ``shortened``."""

    id: int
    user: str
    action: str
    end: datetime


def create(session: Session, *, actor: User, host_name: str, refs: list[str | int] | None, start: datetime,
           end: datetime | None, reason: str, override: bool, settings: Settings, now: datetime,
           load) -> tuple[Reservation, list[Overridden]]:
    """Hold ``refs`` (default: every whole GPU of the host) for ``[start, end)`` (``end``
    None: open-ended). Returns the maintenance and what it overrode.

    Raises NotFound (host), InvalidInput (devices, times), ReservationConflict (409 listing
    the conflicts) without ``override``."""
    end = end or MAX_INSTANT
    if end <= start:
        raise InvalidInput(f"end: must be after start ({fmt_local(start, settings.tz)})", field="end")
    if refs:
        host, devices = resolve_bookable_devices(session, host_name=host_name, refs=refs, tz=settings.tz,
                                                 allow_quarantined=True)
    else:
        host, _ = resolve_bookable_devices(session, host_name=host_name, refs=[])
        devices = list(session.scalars(select(Device).where(Device.host_id == host.id, Device.parent_id.is_(None),
                                                            Device.retired_at.is_(None)).order_by(Device.index)))
        if not devices:
            raise InvalidInput(f"devices: host {host_name!r} has no devices yet", field="devices")
    found = find_conflicts(session, devices=devices, start=start, end=end)
    if found and not override:
        raise conflict_error(session, devices=devices, start=start, end=end, exclude_id=None, tz=settings.tz,
                             viewer=actor.username, found=found)
    done: list[Overridden] = []
    lifecycle.lock_rows(session, [c.id for c in found])
    for c in sorted(found, key=lambda c: c.id):
        done.append(_override(session, c.id, actor=actor, start=start, reason=reason, settings=settings, now=now,
                              load=load))
    m = add_reservation(session, user=actor, host=host, devices=devices, start=start, end=end,
                        values={"status": "confirmed", "kind": "maintenance", "note": reason, "created_by_id": actor.id,
                                "override_reason": reason if override else None, "created_at": now, "updated_at": now},
                        tz=settings.tz)
    record_audit(session, actor=f"user:{actor.username}", action="maintenance.create", target=f"reservation:{m.id}",
                 detail={"reason": reason, "override": override, "open_ended": end == MAX_INSTANT,
                         "overridden": [vars(o) | {"end": o.end.isoformat()} for o in done]})
    session.flush()
    return m, done


def _override(session: Session, rid: int, *, actor: User, start: datetime, reason: str, settings: Settings,
              now: datetime, load) -> Overridden:
    r, p, after = lifecycle.begin(session, reservation_id=rid, action=lifecycle.Action.OVERRIDE, now=now,
                                  tz=settings.tz, load=load)
    cut = p != lifecycle.Phase.PENDING and r.start_at < start
    old_end = r.end_at
    if cut:
        r.end_at = start
        for i in r.items:
            i.end_at = r.end_at
    else:
        r.status = lifecycle.Status.CANCELLED
        r.cancelled_at = now
        for i in r.items:
            i.active = False
    r.sequence += 1
    r.updated_at = now
    record_audit(session, actor=f"user:{actor.username}", action="reservation.override", target=f"reservation:{r.id}",
                 detail={"result": "shortened" if cut else "cancelled", "from": old_end.isoformat(),
                         "to": r.end_at.isoformat(), "reason": reason})
    with use_locale(r.user.language):  # the owner reads it in the language they chose
        args = {"id": r.id, "host": r.host.name, "start": fmt_local(r.start_at, settings.tz),
                "end": fmt_local(old_end, settings.tz), "actor": actor.username, "reason": reason,
                "new_end": fmt_local(r.end_at, settings.tz)}
        if cut:
            subject = gettext("[gpuroster] reservation %(id)s shortened", **args)
            text = gettext("Your reservation %(id)s on %(host)s (%(start)s – %(end)s) was shortened to end at %(new_end)s "
                     "by %(actor)s for maintenance: %(reason)s", **args)
        else:
            subject = gettext("[gpuroster] reservation %(id)s cancelled", **args)
            text = gettext("Your reservation %(id)s on %(host)s (%(start)s – %(end)s) was cancelled by %(actor)s for "
                     "maintenance: %(reason)s", **args)
    holder_notices.tell(session, user=r.user, reservation_id=r.id, subject=subject, text=text,
                        settings=settings, actor=f"user:{actor.username}")
    session.flush()
    on_slot_freed(session, r)
    return Overridden(r.id, r.user.username, "shortened" if cut else "cancelled", r.end_at)


__all__ = ["Overridden", "create"]
