"""Health quarantine: a device in a critical condition is taken out of booking until cleared.

From ingest (:func:`apply_snapshot`): every device report of the host's latest, fresh
snapshot goes through the one rule (:func:`app.services.health_rule.critical_conditions`).
A device with a critical condition that no admin has acknowledged gets an open
:class:`~app.models.DeviceQuarantine`; its holders and the admins are told
(:mod:`app.services.quarantine_notices`); the opening is audited. A quarantine whose
conditions all end by themselves (thermal/power slowdown) is cleared by the service once the
device has reported without them for ``settings.health_self_clear_seconds``; any other is
cleared by an admin (:func:`clear`), which acknowledges the conditions still showing, so the
device is not quarantined again for them until they change (a higher ECC count) or go.

Cost per snapshot: the rule runs in Python over the reports; the database is read only when
a device shows a critical condition or the host is watched (``hosts.health_watch``: some
device has an open quarantine or an acknowledgement), and written only when the health
state changes. A stale snapshot, or one from a host whose monitoring is down, changes nothing.

Quarantined devices are refused for booking (:mod:`app.services.conflicts`) and skipped by
placement (:mod:`app.services.placement`); pages show the reason; those queries live in
:mod:`app.services.quarantined`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from agent.schema import Snapshot
from app.config import Settings
from app.errors import Conflict, InvalidInput, NotFound
from app.models import Device, DeviceQuarantine, Host
from app.schemas.quarantine import QuarantineRead
from app.services import quarantine_notices
from app.services.health_rule import Condition, critical_conditions, describe
from app.services.audit import record_audit


def _set_watch(session: Session, host: Host, watch: bool) -> None:
    if host.health_watch != watch:
        session.execute(update(Host.__table__).where(Host.__table__.c.id == host.id).values(health_watch=watch))
        set_committed_value(host, "health_watch", watch)


def _set_ack(session: Session, device_id: int, keys: list[str] | None) -> None:
    session.execute(update(Device.__table__).where(Device.__table__.c.id == device_id)
                    .values(health_ack=sorted(keys) if keys else None))


def apply_snapshot(session: Session, *, host: Host, snap: Snapshot, devices: dict, now: datetime,
                   settings: Settings) -> list[DeviceQuarantine]:
    """Open, update or self-clear quarantines from ``snap`` (the host's latest snapshot;
    ``devices``: uuid -> a ref with ``.id``, as ingest has them). Returns the quarantines
    opened by this snapshot."""
    if snap.stale or snap.monitoring.status in ("down", "no_driver", "misconfigured"):
        return []
    found: dict[int, list[Condition]] = {}
    for rep in snap.devices:
        conds = critical_conditions(rep)
        if conds and rep.uuid in devices:
            found[devices[rep.uuid].id] = conds
    if not found and not host.health_watch:
        return []
    reported = {devices[r.uuid].id for r in snap.devices if r.uuid in devices}
    open_rows = {q.device_id: q for q in session.scalars(
        select(DeviceQuarantine).where(DeviceQuarantine.host_id == host.id, DeviceQuarantine.cleared_at.is_(None)))}
    acks = {i: set(a) for i, a in session.execute(
        select(Device.id, Device.health_ack).where(Device.host_id == host.id, Device.health_ack.is_not(None))) if a}
    opened: list[DeviceQuarantine] = []
    for dev_id, conds in found.items():
        keys = {c.key for c in conds}
        ack = acks.get(dev_id, set())
        if ack - keys:  # an acknowledged condition that is gone is forgotten
            ack = ack & keys
            _set_ack(session, dev_id, list(ack))
            acks[dev_id] = ack
        new = [c for c in conds if c.key not in ack]
        q = open_rows.get(dev_id)
        if q is None:
            if new:
                opened.append(_open(session, host=host, device_id=dev_id, conds=new, now=now, settings=settings))
            continue
        had = {c["key"] for c in q.conditions}
        added = [c.as_dict() for c in new if c.key not in had]
        if added:
            q.conditions = [*q.conditions, *added]
            q.reason = describe(q.conditions)
            q.self_clearing = all(c["self_clearing"] for c in q.conditions)
        if q.condition_gone_at is not None and had & keys:
            q.condition_gone_at = None
    hold = timedelta(seconds=settings.health_self_clear_seconds)
    for dev_id, q in list(open_rows.items()):
        showing = {c.key for c in found.get(dev_id, [])} & {c["key"] for c in q.conditions}
        if dev_id not in reported or showing or not q.self_clearing:
            continue
        if q.condition_gone_at is None:
            q.condition_gone_at = now
        if now - q.condition_gone_at >= hold:
            _close(session, q, actor="system", note="condition gone", now=now)
            del open_rows[dev_id]
    for dev_id in [i for i in acks if i in reported and i not in found]:
        _set_ack(session, dev_id, None)
        del acks[dev_id]
    session.flush()
    _set_watch(session, host, bool(open_rows or opened or any(acks.values())))
    return opened


def _open(session: Session, *, host: Host, device_id: int, conds: list[Condition], now: datetime,
          settings: Settings) -> DeviceQuarantine:
    q = DeviceQuarantine(device_id=device_id, host_id=host.id, reason=describe(conds),
                         conditions=[c.as_dict() for c in conds], self_clearing=all(c.self_clearing for c in conds),
                         started_at=now)
    session.add(q)
    session.flush()
    device = session.get(Device, device_id)
    record_audit(session, actor=f"host:{host.name}", action="quarantine.open", target=f"device:{device.uuid}",
                 detail={"quarantine": q.id, "reason": q.reason, "conditions": q.conditions})
    quarantine_notices.tell_opened(session, host=host, device=device, quarantine=q, now=now, settings=settings)
    return q


def _close(session: Session, q: DeviceQuarantine, *, actor: str, note: str | None, now: datetime) -> None:
    q.cleared_at = now
    q.cleared_by = actor
    q.clear_note = (note or None) and note[:512]
    uuid = session.scalar(select(Device.uuid).where(Device.id == q.device_id))
    record_audit(session, actor=actor, action="quarantine.clear", target=f"device:{uuid}",
                 detail={"quarantine": q.id, "reason": q.reason, "note": q.clear_note,
                         "since": q.started_at.isoformat()})


def clear(session: Session, *, actor: str, uuid: str, note: str | None, now: datetime) -> DeviceQuarantine:
    """An admin (``actor``: ``user:<name>`` or ``cli``) lifts the open quarantine of device ``uuid``; the conditions it was opened
    for are acknowledged (they quarantine the device again only once they change or go and
    come back). Audited. Raises NotFound (field ``uuid``), Conflict when the device is not
    quarantined, InvalidInput for a note over 512 characters."""
    if note is not None and len(note) > 512:
        raise InvalidInput("note: at most 512 characters", field="note")
    device = session.scalar(select(Device).where(Device.uuid == uuid.strip()))
    if device is None:
        raise NotFound(f"device {uuid!r} not found", field="uuid")
    q = session.scalar(select(DeviceQuarantine).where(DeviceQuarantine.device_id == device.id,
                                                      DeviceQuarantine.cleared_at.is_(None)).with_for_update())
    if q is None:
        raise Conflict(f"device {device.uuid} is not quarantined", field="uuid")
    _close(session, q, actor=actor, note=note, now=now)
    keys = set(device.health_ack or []) | {c["key"] for c in q.conditions if not c["key"].startswith("xid:")}
    _set_ack(session, device.id, list(keys))
    session.flush()
    return q


def history(session: Session, *, include_cleared: bool = True, limit: int = 50) -> list[tuple[DeviceQuarantine, Device, Host]]:
    """Open quarantines first (newest first), then the latest cleared ones, with their device and host."""
    q = (select(DeviceQuarantine, Device, Host).join(Device, Device.id == DeviceQuarantine.device_id)
         .join(Host, Host.id == DeviceQuarantine.host_id))
    if not include_cleared:
        q = q.where(DeviceQuarantine.cleared_at.is_(None))
    rows = session.execute(q.order_by(DeviceQuarantine.cleared_at.is_not(None), DeviceQuarantine.id.desc()).limit(limit))
    return [(r[0], r[1], r[2]) for r in rows]


def _read(q: DeviceQuarantine, device: Device, host: Host) -> QuarantineRead:
    return QuarantineRead(id=q.id, device=device.uuid, host=host.name, index=device.index, reason=q.reason,
                          conditions=q.conditions, self_clearing=q.self_clearing, started_at=q.started_at,
                          condition_gone_at=q.condition_gone_at, cleared_at=q.cleared_at, cleared_by=q.cleared_by,
                          clear_note=q.clear_note)


def read_list(session: Session, *, include_cleared: bool, limit: int) -> list[QuarantineRead]:
    """:func:`history` as API objects."""
    return [_read(*row) for row in history(session, include_cleared=include_cleared, limit=limit)]


def to_read(session: Session, q: DeviceQuarantine) -> QuarantineRead:
    """One quarantine as the API shows it."""
    device = session.get(Device, q.device_id)
    return _read(q, device, session.get(Host, q.host_id))  # type: ignore[arg-type]


__all__ = ["apply_snapshot", "clear", "history", "read_list", "to_read"]
