"""Devices occupied by an unlisted or defunct process: warning the holder of the next
reservation before it starts.

The agent marks a device ``unlisted`` (memory in use, no process listed) or ``defunct``
(memory held by a zombie); nothing is signalled on such evidence, and whoever booked the
device next would find its memory taken. On ingest, :func:`record_warnings` writes one
``reservation.occupied_warning`` audit row per (reservation, device) for reservations
starting within :data:`WARN_AHEAD`; :func:`warnings_for` gives the holder's pages the
current warning for each of their reservations, for as long as the device stays occupied.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from agent.schema import Snapshot
from app.models import AuditLog, Device, DeviceTelemetry, Host, Reservation, ReservationDevice
from app.services.audit import record_audit

log = logging.getLogger(__name__)

WARN_AHEAD = timedelta(hours=24)
OCCUPIED = ("unlisted", "defunct")
ACTION = "reservation.occupied_warning"


def describe(uuid: str, state: str, last_owner: str | None, detail: str | None) -> str:
    """The warning line for one occupied device."""
    what = "a defunct (zombie) process" if state == "defunct" else "a process NVML does not list"
    owner = f" (last seen: {last_owner})" if last_owner else ""
    return f"{uuid} is occupied by {what}{owner}{': ' + detail if detail else ''}"


def record_warnings(session: Session, *, host: Host, snap: Snapshot, devices: dict[str, Device], now: datetime) -> int:
    """Audit one warning per upcoming reservation (starting within :data:`WARN_AHEAD`) on each
    occupied device of ``snap``; returns how many were written."""
    flagged = {devices[d.uuid].id: d for d in snap.devices if d.process_data in OCCUPIED and d.uuid in devices}
    if not flagged:
        return 0
    rows = session.execute(
        select(ReservationDevice.device_id, Reservation)
        .join(Reservation, Reservation.id == ReservationDevice.reservation_id)
        .options(selectinload(Reservation.user))
        .where(ReservationDevice.device_id.in_(flagged), Reservation.status == "confirmed",
               Reservation.start_at > now, Reservation.start_at <= now + WARN_AHEAD)
        .order_by(Reservation.start_at)
    ).all()
    nxt: dict[int, Reservation] = {}
    for dev_id, r in rows:
        nxt.setdefault(dev_id, r)
    if not nxt:
        return 0
    targets = {f"reservation:{r.id}/device:{flagged[dev_id].uuid}": (dev_id, r) for dev_id, r in nxt.items()}
    done = set(session.scalars(select(AuditLog.target).where(AuditLog.action == ACTION, AuditLog.target.in_(targets))))
    written = 0
    for target, (dev_id, r) in targets.items():
        if target in done:
            continue
        d = flagged[dev_id]
        line = describe(d.uuid, d.process_data, d.last_owner, d.process_data_detail)
        record_audit(session, actor=f"host:{host.name}", action=ACTION, target=target,
                     detail={"user": r.user.username, "starts": r.start_at.isoformat(), "message": line})
        log.warning("reservation %d of %s (starts %s): %s", r.id, r.user.username, r.start_at.isoformat(), line)
        written += 1
    return written


def warnings_for(session: Session, reservations: Sequence[Reservation]) -> dict[int, list[str]]:
    """Reservation id -> warning lines for its devices that are occupied right now."""
    ids = [r.id for r in reservations]
    if not ids:
        return {}
    rows = session.execute(
        select(ReservationDevice.reservation_id, Device.uuid, DeviceTelemetry.process_data, DeviceTelemetry.last_owner,
               DeviceTelemetry.process_data_detail)
        .join(Device, Device.id == ReservationDevice.device_id)
        .join(DeviceTelemetry, DeviceTelemetry.device_id == Device.id)
        .where(ReservationDevice.reservation_id.in_(ids), DeviceTelemetry.process_data.in_(OCCUPIED))
    ).all()
    out: dict[int, list[str]] = {}
    for rid, uuid, state, owner, detail in rows:
        out.setdefault(rid, []).append(describe(uuid, state, owner, detail))
    return out
