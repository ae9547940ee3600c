"""Which host a device belongs to: a host token speaks only for its own host's devices.

A snapshot that names a device (by UUID) registered to another host is refused for that
device: the other host keeps it, the attempt is audited and kept as a
:class:`~app.models.DeviceConflict` for admins. Moving a GPU between hosts (it was really
moved, or a host was re-registered under a new name) is an admin action,
:func:`move_device`, which also clears the conflicts.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from agent.schema import Snapshot
from app.errors import Conflict, InvalidInput, NotFound
from app.models import Device, DeviceConflict, Host, Reservation, ReservationDevice, User, utcnow
from app.schemas.host import DeviceConflictRead
from app.services import hosts as host_service
from app.services.audit import record_audit

log = logging.getLogger(__name__)


def refuse_foreign_devices(session: Session, *, host: Host, snap: Snapshot, now: datetime) -> Snapshot:
    """``snap`` without the devices registered to another host (and MIG instances of them,
    and processes and findings on them); each refusal audited and counted once per snapshot.

    Returns ``snap`` itself when nothing was refused, else a copy.
    """
    uuids = {d.uuid for d in snap.devices} | {d.parent_uuid for d in snap.devices if d.parent_uuid}
    uuids |= {p.device_uuid for p in snap.processes} | {f.device_uuid for f in snap.findings}
    if not uuids:
        return snap
    foreign = {
        d.uuid: d
        for d in session.scalars(select(Device).where(Device.uuid.in_(uuids), Device.host_id != host.id))
    }
    if not foreign:
        return snap
    refused = set(foreign)
    refused |= {d.uuid for d in snap.devices if d.parent_uuid in foreign}
    owners = dict(session.execute(select(Host.id, Host.name).where(Host.id.in_({d.host_id for d in foreign.values()}))).all())
    existing = {
        c.device_id: c
        for c in session.scalars(select(DeviceConflict).where(
            DeviceConflict.device_id.in_([d.id for d in foreign.values()]), DeviceConflict.claimed_by_host_id == host.id))
    }
    for uuid, dev in sorted(foreign.items()):
        conflict = existing.get(dev.id)
        if conflict is None:
            session.add(DeviceConflict(device_id=dev.id, claimed_by_host_id=host.id, first_at=now, last_at=now, count=1))
            record_audit(session, actor=f"host:{host.name}", action="device.claim_refused", target=f"device:{uuid}",
                         detail={"owner_host": owners.get(dev.host_id), "claimed_by": host.name, "seq": snap.seq})
            log.warning("host %s reported device %s, which belongs to host %s: refused", host.name, uuid,
                        owners.get(dev.host_id))
        else:
            conflict.last_at = now
            conflict.count += 1
    return snap.model_copy(update={
        "devices": [d for d in snap.devices if d.uuid not in refused],
        "processes": [p for p in snap.processes if p.device_uuid not in refused],
        "findings": [f for f in snap.findings if f.device_uuid not in refused],
    })


def list_conflicts(session: Session) -> list[DeviceConflictRead]:
    """Every open conflict, newest first (times UTC)."""
    owner = Host.__table__.alias("owner")
    claimer = Host.__table__.alias("claimer")
    rows = session.execute(
        select(Device.uuid, Device.name, owner.c.name, claimer.c.name, DeviceConflict.first_at, DeviceConflict.last_at,
               DeviceConflict.count)
        .join(Device, Device.id == DeviceConflict.device_id)
        .join(owner, owner.c.id == Device.host_id)
        .join(claimer, claimer.c.id == DeviceConflict.claimed_by_host_id)
        .order_by(DeviceConflict.last_at.desc(), DeviceConflict.id.desc())
    ).all()
    fields = list(DeviceConflictRead.model_fields)
    return [DeviceConflictRead(**dict(zip(fields, r, strict=True))) for r in rows]


def move_device(session: Session, *, actor: User, uuid: str, to_host: str) -> Device:
    """Register device ``uuid`` (and its MIG instances) to host ``to_host``; audited.

    Clears the device's conflicts. Raises NotFound (device or host), InvalidInput when the
    device is a MIG instance (move its GPU instead) and Conflict while a reservation that has
    not ended holds it (a reservation is for devices of one host).
    """
    dev = session.scalar(select(Device).where(Device.uuid == uuid.strip()))
    if dev is None:
        raise NotFound(f"device {uuid!r} not found", field="uuid")
    if dev.parent_id is not None:
        raise InvalidInput("uuid: a MIG instance moves with its GPU; move the GPU's UUID", field="uuid")
    target = host_service.get_host(session, to_host)
    source = session.get(Host, dev.host_id)
    children = list(session.scalars(select(Device).where(Device.parent_id == dev.id)))
    ids = [d.id for d in (dev, *children)]
    now = utcnow()
    held = session.scalar(
        # the device's reserved rows that have not ended (its index on (device_id, end_at)), not
        # its whole history, each checked against its reservation
        select(Reservation.id).join(ReservationDevice, ReservationDevice.reservation_id == Reservation.id)
        .where(ReservationDevice.device_id.in_(ids), ReservationDevice.active.is_(True), ReservationDevice.end_at > now,
               Reservation.status == "confirmed", Reservation.end_at > now)
        .limit(1)
    )
    if held is not None:
        raise Conflict(f"uuid: reservation {held} holds this device; cancel or move it first", field="uuid")
    for d in (dev, *children):
        d.host_id = target.id
    session.execute(delete(DeviceConflict).where(DeviceConflict.device_id.in_(ids)))
    record_audit(session, actor=f"user:{actor.username}", action="device.move", target=f"device:{dev.uuid}",
                 detail={"from": source.name if source else None, "to": target.name})
    session.flush()
    return dev
