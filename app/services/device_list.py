"""The device list of the API as plain rows: one read per table, no ORM objects.

``GET /api/v1/devices`` of a large lab (thousands of devices, several processes each) spent
nearly all its time building ORM objects and validating response models, not in SQL. This
module reads the same state with column selects (plain tuples), builds the JSON-ready dicts
of :class:`app.schemas.host.DeviceRead` directly and serialises them with pydantic-core,
so the answer is the one :func:`app.services.devices.list_devices` gives (a test compares
them), at a fraction of the cost. The status rules are shared with it
(:func:`app.services.devices.device_status`, :func:`app.services.devices.host_state`).

A device's document has two parts: what only a snapshot of its host, an admin's change to a
device or a user's Unix uid changes (:func:`read_base`, reused between snapshots by
:mod:`app.services.device_list_cache`), and what bookings, quarantines and the clock change
(:func:`live_part`). :func:`device_list` puts them together uncached.
"""

from __future__ import annotations

from collections import defaultdict, namedtuple
from datetime import datetime
from typing import Any, NamedTuple

from pydantic_core import to_json
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Device, DeviceProcess, DeviceTelemetry, Finding, Host, User
from app.models.states import LIVE_FINDING_STATES
from app.services.conflicts import HeldBy
from app.services.device_names import slice_label
from app.services.devices import device_status, host_state, owner_label, process_occupies
from app.services.lab_holds import FOREVER, now_and_next
from app.services.plain_holdings import CHUNK, plain_holdings
from app.services.quarantined import open_by_device, quarantine_of

_TELEMETRY = (
    "collected_at", "memory_used_mib", "utilization_gpu", "utilization_memory", "temperature_c", "power_draw_w",
    "power_limit_w", "throttle_reasons", "ecc_uncorrected", "retired_pages", "health", "error", "processes_status",
    "processes_error", "memory_reserved_mib", "process_data", "process_data_detail", "last_owner",
)
_PROCESS = ("pid", "type", "used_memory_mib", "unix_user", "uid", "command", "name", "container_id", "owner_status")
_HOST = ("id", "name", "last_seen_at", "last_seq", "last_collected_at", "interval_seconds", "monitoring_status")

HostRow = namedtuple("HostRow", _HOST)
"""A host's columns the list reads (instants UTC, ``interval_seconds`` seconds)."""


def host_version(h: HostRow) -> tuple:
    """What every snapshot of ``h`` rewrites (as :func:`app.services.now_state.read_hosts`
    keys the Now page), with its name: the key its devices' base is reused under."""
    return (h.name, h.last_seen_at, h.last_seq, h.last_collected_at)


class DeviceBase(NamedTuple):
    """A device between two snapshots of its host: ``doc``, its document up to ``processes``
    (the keys of ``DeviceRead`` in order); what its status needs besides holders and the
    host's state; ``findings``, its live findings' (pid, kind) by finding id."""

    id: int
    parent_id: int | None
    doc: dict[str, Any]
    lost: bool
    computing: bool
    process_data: str
    findings: tuple[tuple[int, str], ...]


def read_hosts(session: Session, *, host: str | None = None) -> list[HostRow]:
    """Every host (or the one named ``host``) by name."""
    q = select(*(getattr(Host, c) for c in _HOST)).order_by(Host.name)
    if host:
        q = q.where(Host.name == host)
    return [HostRow._make(r) for r in session.execute(q)]


def live_findings(session: Session) -> dict[int, tuple[tuple[int, str], ...]]:
    """Device id -> (pid, kind) of its live findings that name a process, by finding id:
    the lab's, in one statement (walks ``ix_findings_state``; the live ones are few)."""
    out: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for dev_id, pid, kind in session.execute(
        select(Finding.device_id, Finding.pid, Finding.kind)
        .where(Finding.state.in_(LIVE_FINDING_STATES), Finding.pid.is_not(None), Finding.device_id.is_not(None))
        .order_by(Finding.id)
    ):
        out[dev_id].append((pid, kind))
    return {k: tuple(v) for k, v in out.items()}


def open_quarantines(session: Session) -> dict[int, dict[str, Any]]:
    """Device id -> its open health quarantine as the list shows it (``reason``, ``since``
    UTC, ``self_clearing``): the lab's, in one statement (open ones are few)."""
    return {dev_id: {"reason": q.reason, "since": q.started_at, "self_clearing": q.self_clearing}
            for dev_id, q in open_by_device(session).items()}


def read_base(session: Session, hosts: list[HostRow]) -> dict[int, list[DeviceBase]]:
    """Host id -> the :class:`DeviceBase` of its non-retired devices, by index (MIG
    instances after their GPU, then by id), for ``hosts``. Five statements up to 4,000
    devices (findings, reservations and parents by explicit ids, in chunks under SQLite's
    bound-parameter limit, so the planner walks the device indexes)."""
    names = {h.id: h.name for h in hosts}
    devices = []
    for i in range(0, len(hosts), CHUNK):
        devices += session.execute(
            select(Device.id, Device.uuid, Device.index, Device.name, Device.pci_bus_id, Device.memory_total_mib,
                   Device.parent_id, Device.mig_profile, Device.is_open, Device.last_seen_at, Device.gpu_instance_id,
                   Device.host_id)
            .where(Device.host_id.in_([h.id for h in hosts[i : i + CHUNK]]), Device.retired_at.is_(None))
            .order_by(Device.id)
        ).all()
    if not devices:
        return {}
    dev_ids = [d[0] for d in devices]
    tele: dict[int, dict[str, Any]] = {}
    procs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    findings: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for i in range(0, len(dev_ids), CHUNK):
        chunk = dev_ids[i : i + CHUNK]
        for row in session.execute(select(DeviceTelemetry.device_id, *(getattr(DeviceTelemetry, c) for c in _TELEMETRY))
                                   .where(DeviceTelemetry.device_id.in_(chunk))):
            tele[row[0]] = dict(zip(_TELEMETRY, row[1:], strict=True))
        for row in session.execute(select(DeviceProcess.device_id, *(getattr(DeviceProcess, c) for c in _PROCESS))
                                   .where(DeviceProcess.device_id.in_(chunk)).order_by(DeviceProcess.pid)):
            procs[row[0]].append(dict(zip(_PROCESS, row[1:], strict=True)))
        for dev_id, pid, kind in session.execute(
            select(Finding.device_id, Finding.pid, Finding.kind)
            .where(Finding.device_id.in_(chunk), Finding.state.in_(LIVE_FINDING_STATES), Finding.pid.is_not(None))
            .order_by(Finding.id)
        ):
            findings[dev_id].append((pid, kind))
    bare_uids = {p["uid"] for plist in procs.values() for p in plist if p["owner_status"] == "uid_only" and p["uid"] is not None}
    uid_names = dict(session.execute(select(User.unix_uid, User.username).where(User.unix_uid.in_(bare_uids))).all()) \
        if bare_uids else {}
    uuids = {d[0]: d[1] for d in devices}
    indices = {d[0]: d[2] for d in devices}
    missing = {d[6] for d in devices if d[6] is not None and d[6] not in uuids}
    if missing:
        for pid_, puuid, pindex in session.execute(select(Device.id, Device.uuid, Device.index).where(Device.id.in_(missing))):
            uuids[pid_], indices[pid_] = puuid, pindex
    out: dict[int, list[tuple[tuple, DeviceBase]]] = defaultdict(list)
    for dev_id, uuid, index, name, pci, mem, parent_id, mig_profile, is_open, last_seen, gi, host_id in devices:
        t = tele.get(dev_id)
        found = dict(findings.get(dev_id, ()))  # a later finding of the same pid wins
        plist = procs.get(dev_id, [])
        for p in plist:
            p["owner"] = owner_label(p["unix_user"], p["owner_status"], p["uid"], uid_names)
            p["finding"] = found.get(p["pid"])
        doc = {
            "uuid": uuid, "host": names[host_id], "index": index,
            "label": slice_label(index, parent_id, gi, uuid, indices.get(parent_id) if parent_id else None), "name": name,
            "pci_bus_id": pci, "memory_total_mib": mem, "parent_uuid": uuids.get(parent_id) if parent_id else None,
            "mig_profile": mig_profile, "is_open": is_open, "retired": False, "last_seen_at": last_seen, "telemetry": t,
            "processes": plist,
        }
        key = (index if index is not None else 1 << 30, parent_id or 0, gi or 0, dev_id)
        out[host_id].append((key, DeviceBase(
            id=dev_id, parent_id=parent_id, doc=doc, lost=t is not None and t["health"] == "lost",
            computing=any(process_occupies(p["unix_user"], p["owner_status"], p["type"]) for p in plist),
            process_data=(t or {}).get("process_data") or "ok", findings=tuple(findings.get(dev_id, ())),
        )))
    return {hid: [b for _k, b in sorted(rows, key=lambda x: x[0])] for hid, rows in out.items()}


def host_status(h: HostRow, now: datetime) -> str:
    """``h``'s :class:`~app.models.states.HostStatus` at ``now`` (UTC)."""
    return host_state(h.last_seen_at, h.interval_seconds, h.monitoring_status, now)[0]


def live_part(d: DeviceBase, *, state: str, holder: HeldBy | None, upcoming: HeldBy | None,
              quarantine: dict[str, Any] | None) -> dict[str, Any]:
    """The rest of ``d``'s document (``holder``, ``next_reservation``, ``status``,
    ``quarantine``): ``state``, its host's status; ``quarantine``, the open one keeping it
    from booking (its own, or its GPU's for a MIG instance)."""
    return {
        "holder": _holder_dict(holder) if holder is not None else None,
        "next_reservation": _holder_dict(upcoming) if upcoming is not None else None,
        "status": device_status(retired=False, lost=d.lost, host_state=state, has_finding=bool(d.findings),
                                computing=d.computing, held=holder is not None, process_data=d.process_data),
        "quarantine": quarantine,
    }


def device_list(session: Session, *, now: datetime, host: str | None = None) -> list[dict[str, Any]]:
    """Non-retired devices (all, or of ``host``) as ``DeviceRead``-shaped dicts, ordered by
    host name and index (MIG instances after their GPU); ``now`` (UTC) decides holders and
    staleness. Uncached: the reference the cached list (:mod:`app.services.device_list_cache`)
    is tested against."""
    hosts = read_hosts(session, host=host)
    base = read_base(session, hosts)
    every = [d for ds in base.values() for d in ds]
    holds = now_and_next(plain_holdings(session, devices=every, start=now, end=FOREVER), now, valid_until=now)
    listed = {d.id for d in every}
    quarantines = {k: v for k, v in open_quarantines(session).items() if k in listed}
    out = []
    for h in hosts:
        state = host_status(h, now)
        for d in base.get(h.id, ()):
            out.append({**d.doc, **live_part(d, state=state, holder=holds.current.get(d.id),
                                             upcoming=holds.upcoming.get(d.id), quarantine=quarantine_of(quarantines, d))})
    return out


def _holder_dict(r: HeldBy) -> dict[str, Any]:
    return {"reservation_id": r.id, "user": r.user.username, "start": r.start_at, "end": r.end_at}


def to_json_bytes(items: list[dict[str, Any]]) -> bytes:
    """``items`` as JSON, serialised by pydantic-core (the same encoder, and so the same
    datetime and number formats, as the API's response models)."""
    return to_json(items)
