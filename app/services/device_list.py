"""The device list of the API as plain rows: one read per table, no ORM objects.

``GET /api/v1/devices`` of a large lab (thousands of devices, several processes each) spent
nearly all its time building ORM objects and validating response models, not in SQL. This
module reads the same state with column selects (plain tuples), builds the JSON-ready dicts
of :class:`app.schemas.host.DeviceRead` directly and serialises them with pydantic-core,
so the answer is the one :func:`app.services.devices.list_devices` gives (a test compares
them), at a fraction of the cost. The status rules are shared with it
(:func:`app.services.devices.device_status`, :func:`app.services.devices.host_state`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from pydantic_core import to_json
from sqlalchemy import and_, select
from sqlalchemy.orm import Session

from app.models import Device, DeviceProcess, DeviceQuarantine, DeviceTelemetry, Finding, Host, Reservation, User
from app.services.conflicts import HeldBy, holder_at
from app.services.devices import device_status, host_state, owner_label, process_occupies, slice_label
from app.services.plain_holdings import plain_holdings

_TELEMETRY = (
    "collected_at", "memory_used_mib", "utilization_gpu", "utilization_memory", "temperature_c", "power_draw_w",
    "power_limit_w", "throttle_reasons", "ecc_uncorrected", "retired_pages", "health", "error", "processes_status",
    "processes_error", "memory_reserved_mib", "process_data", "process_data_detail", "last_owner",
)
_PROCESS = ("pid", "type", "used_memory_mib", "unix_user", "uid", "command", "name", "container_id", "owner_status")


def device_list(session: Session, *, now: datetime, host: str | None = None) -> list[dict[str, Any]]:
    """Non-retired devices (all, or of ``host``) as ``DeviceRead``-shaped dicts, ordered by
    host name and index (MIG instances after their GPU); ``now`` (UTC) decides holders and
    staleness. Five statements up to 5,000 devices (two more per further 5,000)."""
    ids = select(Device.id).where(Device.retired_at.is_(None))
    if host:
        ids = ids.join(Host, Host.id == Device.host_id).where(Host.name == host)
    devices = session.execute(
        select(Device.id, Device.uuid, Device.index, Device.name, Device.pci_bus_id, Device.memory_total_mib,
               Device.parent_id, Device.mig_profile, Device.is_open, Device.last_seen_at, Device.gpu_instance_id,
               Host.name, Host.last_seen_at, Host.interval_seconds, Host.monitoring_status,
               DeviceQuarantine.reason, DeviceQuarantine.started_at, DeviceQuarantine.self_clearing)
        .join(Host, Host.id == Device.host_id)
        # the open health quarantine, in the same statement (at most one per device)
        .outerjoin(DeviceQuarantine, and_(DeviceQuarantine.device_id == Device.id, DeviceQuarantine.cleared_at.is_(None)))
        .where(Device.id.in_(ids))
        .order_by(Device.id)
    ).all()
    if not devices:
        return []
    tele = {row[0]: dict(zip(_TELEMETRY, row[1:], strict=True)) for row in session.execute(
        select(DeviceTelemetry.device_id, *(getattr(DeviceTelemetry, c) for c in _TELEMETRY))
        .where(DeviceTelemetry.device_id.in_(ids)))}
    procs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in session.execute(
        select(DeviceProcess.device_id, *(getattr(DeviceProcess, c) for c in _PROCESS))
        .where(DeviceProcess.device_id.in_(ids)).order_by(DeviceProcess.pid)
    ):
        procs[row[0]].append(dict(zip(_PROCESS, row[1:], strict=True)))
    bare_uids = {p["uid"] for plist in procs.values() for p in plist if p["owner_status"] == "uid_only" and p["uid"] is not None}
    uid_names = dict(session.execute(select(User.unix_uid, User.username).where(User.unix_uid.in_(bare_uids))).all()) \
        if bare_uids else {}
    # Findings and reservations grow with history: look them up by explicit device ids (in
    # chunks, under SQLite's bound-parameter limit) so the planner walks their device
    # indexes; with a subquery PostgreSQL scanned the whole table.
    dev_ids = [d[0] for d in devices]
    findings: dict[int, dict[int, str]] = defaultdict(dict)
    for chunk in _chunks(dev_ids):
        for dev_id, pid, kind in session.execute(
            select(Finding.device_id, Finding.pid, Finding.kind)
            .where(Finding.device_id.in_(chunk), Finding.state.in_(("open", "notified")), Finding.pid.is_not(None))
            .order_by(Finding.id)
        ):
            findings[dev_id][pid] = kind

    # current holder and next reservation: the one holder rule (a whole GPU and its MIG
    # slices hold each other), applied to plain rows
    _forever = datetime.max.replace(tzinfo=UTC)
    held = plain_holdings(session, devices=devices, start=now, end=_forever)

    uuids = {d[0]: d[1] for d in devices}
    indices = {d[0]: d[2] for d in devices}
    missing = {d[6] for d in devices if d[6] is not None and d[6] not in uuids}
    if missing:
        for pid_, puuid, pindex in session.execute(select(Device.id, Device.uuid, Device.index).where(Device.id.in_(missing))):
            uuids[pid_], indices[pid_] = puuid, pindex
    states: dict[str, str] = {}
    out: list[tuple[tuple, dict[str, Any]]] = []
    quarantined = {row[0]: {"reason": row[15], "since": row[16], "self_clearing": row[17]}
                   for row in devices if row[15] is not None}
    for (dev_id, uuid, index, name, pci, mem, parent_id, mig_profile, is_open, last_seen, gi,
         host_name, h_seen, h_interval, h_status, *_quarantine) in devices:
        state = states.get(host_name)
        if state is None:
            state = states[host_name] = host_state(h_seen, h_interval, h_status, now)[0]
        found_h = held.get(dev_id, [])
        current = holder_at(found_h, now)
        upcoming = next((h for h in found_h if h.reservation.start_at > now), None)
        holder = _holder_dict(current.reservation) if current is not None else None
        nxt = _holder_dict(upcoming.reservation) if upcoming is not None else None
        t = tele.get(dev_id)
        found = findings.get(dev_id, {})
        plist = procs.get(dev_id, [])
        for p in plist:
            p["owner"] = owner_label(p["unix_user"], p["owner_status"], p["uid"], uid_names)
            p["finding"] = found.get(p["pid"])
        status = device_status(
            retired=False, lost=t is not None and t["health"] == "lost", host_state=state, has_finding=bool(found),
            computing=any(process_occupies(p["unix_user"], p["owner_status"], p["type"]) for p in plist),
            held=holder is not None, process_data=(t or {}).get("process_data") or "ok",
        )
        key = (host_name, index if index is not None else 1 << 30, parent_id or 0, gi or 0)
        out.append((key, {
            "uuid": uuid, "host": host_name, "index": index,
            "label": slice_label(index, parent_id, gi, uuid, indices.get(parent_id) if parent_id else None), "name": name, "pci_bus_id": pci, "memory_total_mib": mem,
            "parent_uuid": uuids.get(parent_id) if parent_id else None, "mig_profile": mig_profile,
            "is_open": is_open, "retired": False, "last_seen_at": last_seen, "telemetry": t, "processes": plist,
            "holder": holder, "next_reservation": nxt, "status": status,
            "quarantine": quarantined.get(dev_id) or (quarantined.get(parent_id) if parent_id else None),
        }))
    out.sort(key=lambda x: x[0])
    return [d for _k, d in out]


def _holder_dict(r: Reservation | HeldBy) -> dict[str, Any]:
    return {"reservation_id": r.id, "user": r.user.username, "start": r.start_at, "end": r.end_at}


def _chunks(ids: list[int], size: int = 5000) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def to_json_bytes(items: list[dict[str, Any]]) -> bytes:
    """``items`` as JSON, serialised by pydantic-core (the same encoder, and so the same
    datetime and number formats, as the API's response models)."""
    return to_json(items)
