"""Telling people that a device was quarantined: the holders of its current and upcoming
reservations (each offered an equivalent free device where one exists, named in the
notice) and every active admin. Notices go through :mod:`app.services.holder_notices`
(recorded in the audit log, e-mailed after the commit)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.i18n import gettext, use_locale
from app.models import Device, DeviceQuarantine, Host, Reservation, User
from app.services import device_names as naming
from app.services import holder_notices
from app.services.conflicts import holdings
from app.services.health_rule import local_reason
from app.services.placement import Request, candidates
from app.timeutil import MAX_INSTANT, fmt_local


def device_label(session: Session, device: Device, host: Host) -> str:
    """``GPU 1 (GPU-…) of host node-01``, ``GPU 0 · MIG 4 (MIG-…) of host node-01``: how
    notices name a device (the label people read everywhere, its UUID, its host)."""
    parent = session.get(Device, device.parent_id) if device.parent_id is not None else None
    return f"{naming.device_label(device, parent)} ({device.uuid}) of host {host.name}"


def equivalent_free(session: Session, *, device: Device, start: datetime, end: datetime, now: datetime) -> Device | None:
    """A whole GPU of the same model and memory as ``device``, not quarantined, not lost,
    free for all of ``[start, end)``: on the same host if possible, else on another; idle
    ones and low indices first. ``None`` when there is none."""
    found = []
    for c in candidates(session, req=Request(count=1), after=now):
        d = c.device
        if d.id == device.id or d.name != device.name or d.memory_total_mib != device.memory_total_mib:
            continue
        if c.free(start, end):
            found.append((c.host.id != device.host_id, c.busy_rank, c.host.name, c.sort_index, d))
    found.sort(key=lambda t: t[:4])
    return found[0][4] if found else None


def tell_opened(session: Session, *, host: Host, device: Device, quarantine: DeviceQuarantine, now: datetime,
                settings: Settings) -> list[int]:
    """Tell the holders of ``device``'s current and upcoming reservations, and the admins,
    that it is quarantined. Returns the ids of the reservations whose holders were told."""
    tz = settings.tz
    label = device_label(session, device, host)
    seen: dict[int, Reservation] = {}
    for h in holdings(session, devices=[device], start=now, end=MAX_INSTANT).get(device.id, []):
        seen.setdefault(h.reservation.id, h.reservation)
    told: list[str] = []
    for r in sorted(seen.values(), key=lambda r: (r.start_at, r.id)):
        if r.kind == "maintenance":
            continue
        start = max(r.start_at, now)
        other = equivalent_free(session, device=device, start=start, end=r.end_at, now=now)
        with use_locale(r.user.language):  # the holder reads it in the language they chose
            if other is not None:
                other_host = session.get(Host, other.host_id)
                offer = gettext("An equivalent device is free for that time: %(device)s. "
                                "Book it and release this reservation to move.", device=device_label(session, other, other_host))
            else:
                offer = gettext("No equivalent device is free for that time; the admins have been told.")
            subject = gettext("[gpuroster] device of reservation %(id)s quarantined", id=r.id)
            text = gettext("%(device)s was quarantined at %(at)s: %(reason)s. Your reservation %(id)s (%(start)s – %(end)s) "
                           "uses it. %(offer)s", device=label, at=fmt_local(quarantine.started_at, tz),
                           reason=local_reason(quarantine.conditions), id=r.id, start=fmt_local(r.start_at, tz),
                           end=fmt_local(r.end_at, tz), offer=offer)
        holder_notices.tell(session, kind="quarantine", user=r.user, reservation_id=r.id,
                            subject=subject, text=text,
                            settings=settings, actor=f"host:{host.name}")
        told.append(f"{r.user.username} (reservation {r.id})")
    admins = session.scalars(select(User).where(User.role == "admin", User.active.is_(True)).order_by(User.id))
    for admin in admins:
        with use_locale(admin.language):
            holders = ", ".join(told) if told else gettext("no current or upcoming reservation")
            subject = gettext("[gpuroster] %(uuid)s quarantined", uuid=device.uuid)
            text = gettext("%(device)s was quarantined at %(at)s: %(reason)s. Told: %(holders)s. Clear it on the admin page "
                           "or with 'gpuroster admin clear-quarantine %(uuid)s' once the device is repaired.",
                           device=label, at=fmt_local(quarantine.started_at, tz), reason=local_reason(quarantine.conditions),
                           holders=holders, uuid=device.uuid)
        holder_notices.tell(session, kind="quarantine", user=admin, reservation_id=None, subject=subject, text=text,
                            settings=settings, actor=f"host:{host.name}")
    return sorted(seen)


__all__ = ["device_label", "equivalent_free", "tell_opened"]
