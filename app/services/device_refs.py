"""The devices a booking names: UUIDs or whole-GPU indices of one host resolved to devices
(unknown, duplicate, retired or overlapping references refused, naming the reference), and
the health gate every booking passes (lost or quarantined devices refused). What the devices
must not overlap is :mod:`app.services.conflicts`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from zoneinfo import ZoneInfo

from sqlalchemy import and_, bindparam, or_, select
from sqlalchemy.orm import Session

from app.errors import Conflict, InvalidInput, NotFound
from app.models import Device, DeviceQuarantine, DeviceTelemetry, Host
from app.services.quarantined import refuse_quarantined
from app.timeutil import fmt_local

UTC_ZONE = ZoneInfo("UTC")


# The non-retired devices that references may name: by UUID (``texts``) or, for whole GPUs,
# by index (``indices``); :func:`_ref_params` gives both. Statements are built once: every
# booking reads them, and building one anew cost more CPU than running it.
_NAMED = and_(
    Device.retired_at.is_(None),
    or_(Device.uuid.in_(bindparam("texts", expanding=True)),
        and_(Device.parent_id.is_(None), Device.index.in_(bindparam("indices", expanding=True)))),
)
_DEVICES_NAMED = select(Device).where(Device.host_id == bindparam("host_id"), _NAMED)
# The host ``host_name`` with its devices named, their health and open quarantines (a MIG
# slice's own and its GPU's).
_BOOKABLE = (
    select(Host, Device, DeviceTelemetry.health, DeviceQuarantine.started_at, DeviceQuarantine.reason)
    .select_from(Host)
    .outerjoin(Device, and_(Device.host_id == Host.id, _NAMED))
    .outerjoin(DeviceTelemetry, DeviceTelemetry.device_id == Device.id)
    .outerjoin(DeviceQuarantine, and_(
        or_(DeviceQuarantine.device_id == Device.id, DeviceQuarantine.device_id == Device.parent_id),
        DeviceQuarantine.cleared_at.is_(None),
    ))
    .where(Host.name == bindparam("host_name"))
)


def _ref_params(refs: Sequence[str | int]) -> dict[str, list]:
    """The ``texts`` and ``indices`` parameters of :data:`_NAMED` for ``refs``."""
    texts = [str(r).strip() for r in refs]
    return {"texts": texts, "indices": [int(t) for t in texts if t.isdigit() and int(t) < 2**31]}


def resolve_devices(session: Session, *, host: Host, refs: Sequence[str | int]) -> list[Device]:
    """Map UUIDs or indices of ``host`` to devices (index = whole GPUs only, MIG by UUID).

    Raises InvalidInput naming the reference for unknown, duplicate or retired devices.
    """
    devices = list(session.scalars(_DEVICES_NAMED, {"host_id": host.id, **_ref_params(refs)}))
    return _match_refs(session, host, refs, devices)


def _match_refs(session: Session, host: Host, refs: Sequence[str | int], devices: Sequence[Device]) -> list[Device]:
    """``refs`` mapped onto ``devices`` of ``host``; raises InvalidInput as
    :func:`resolve_devices` does (reading the host's devices only to hint at a MIG slice's
    UUID when a reference is unknown)."""
    by_uuid = {d.uuid: d for d in devices}
    by_index = {d.index: d for d in devices if d.parent_id is None and d.index is not None}
    out: list[Device] = []
    for ref in refs:
        text = str(ref).strip()
        dev = by_uuid.get(text)
        if dev is None and (isinstance(ref, int) or text.isdigit()):
            dev = by_index.get(int(text))
        if dev is None:
            raise InvalidInput(f"devices: {text!r} is not a device of host {host.name!r}{_slice_hint(session, host, text)}",
                               field="devices")
        if dev in out:
            raise InvalidInput(f"devices: {text!r} is listed twice", field="devices")
        out.append(dev)
    ids = {d.id for d in out}
    for d in out:
        if d.parent_id is not None and d.parent_id in ids:
            raise InvalidInput(
                f"devices: MIG instance {d.uuid} is part of a whole GPU also requested; ask for one or the other",
                field="devices",
            )
    return out


def resolve_bookable_devices(session: Session, *, host_name: str, refs: Sequence[str | int], tz: ZoneInfo = UTC_ZONE,
                             allow_quarantined: bool = False) -> tuple[Host, list[Device]]:
    """The host named ``host_name`` and its devices named by ``refs``, refused when reported
    lost or quarantined (a MIG instance too when its GPU is), read in one statement (host,
    devices, their health and open quarantines joined). ``allow_quarantined``: an admin's
    maintenance may hold a quarantined device (to repair it).

    Raises NotFound (404, field ``host``), InvalidInput (422, field ``devices``) as
    :func:`resolve_devices`, Conflict (409, field ``devices``) as :func:`check_health`.
    """
    rows = session.execute(_BOOKABLE, {"host_name": host_name, **_ref_params(refs)}).all()
    if not rows:
        raise NotFound(f"host {host_name!r} not found", field="host")
    host = rows[0][0]
    listed = list({d.id: d for _h, d, _health, _since, _why in rows if d is not None}.values())
    devices = _match_refs(session, host, refs, listed)
    lost = {d.id for _h, d, health, _since, _why in rows if d is not None and health == "lost"}
    if lost:
        names = ", ".join(d.uuid for d in devices if d.id in lost)
        raise Conflict(f"devices: {names} reported lost by the host agent; not bookable until it is back", field="devices")
    # an open quarantine of the device (or of its GPU): since when, and why
    held = {d.id: (since, why) for _h, d, _health, since, why in rows if d is not None and since is not None}
    if held and not allow_quarantined:
        parts = [f"{d.uuid} is quarantined since {fmt_local(held[d.id][0], tz)}: {held[d.id][1]}"
                 for d in devices if d.id in held]
        raise Conflict("devices: " + "; ".join(parts) + "; not bookable until the quarantine is cleared", field="devices")
    return host, devices


def _slice_hint(session: Session, host: Host, text: str) -> str:
    """For a MIG slice named the way people read it (``GPU 0 · MIG 4``, ``0/4``), the UUID to
    book it by: a slice is booked by its MIG UUID only, which survives re-indexing."""
    want = text.lower().replace("gpu", "").replace("mig", "/").replace("·", "").replace(" ", "")
    want = want.replace("//", "/")
    devices = list(session.scalars(select(Device).where(Device.host_id == host.id, Device.retired_at.is_(None))))
    by_id = {d.id: d for d in devices}
    for d in devices:
        parent = by_id.get(d.parent_id) if d.parent_id else None
        if parent is not None and f"{parent.index}/{d.gpu_instance_id}" == want:
            return f"; book a MIG slice by its UUID: {d.uuid}"
    return ""


def check_health(session: Session, devices: Iterable[Device], *, tz: ZoneInfo = UTC_ZONE) -> None:
    """Raise Conflict (409, field ``devices``) when any of ``devices`` is reported lost or is
    quarantined (:func:`app.services.quarantined.refuse_quarantined`)."""
    devices = list(devices)
    ids = [d.id for d in devices]
    lost = session.execute(
        select(Device.uuid, DeviceTelemetry.error)
        .join(DeviceTelemetry, DeviceTelemetry.device_id == Device.id)
        .where(Device.id.in_(ids), DeviceTelemetry.health == "lost")
    ).all()
    if lost:
        names = ", ".join(u for u, _ in lost)
        raise Conflict(f"devices: {names} reported lost by the host agent; not bookable until it is back", field="devices")
    refuse_quarantined(session, devices, tz=tz)


__all__ = ["check_health", "resolve_bookable_devices", "resolve_devices"]
