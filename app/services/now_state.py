"""The lab's current state for the Now page, read as plain rows and reused between snapshots.

Building the page from ORM objects and response models cost seconds for 1,000 hosts x 8
GPUs. Here every table is read with column selects (tuples), devices become small named
tuples, and what a host's devices look like (telemetry, processes, owners, findings) is
kept per host in a :class:`NowCache` under the host's *snapshot version*: the columns that
every ingest rewrites (``last_seen_at``, ``last_seq``, ``last_collected_at``), plus one
lab-wide key for what changes without an ingest (a device retired, opened or moved, a
user's Unix uid). Only hosts whose version moved since the last view are read again.

What depends on the clock, on bookings or on an admin is never cached: the host rows
(status, staleness), the holders, read on every view with
:func:`app.services.plain_holdings.plain_holdings` (the one holder rule), and the open health
quarantines (:func:`app.services.quarantined.open_plain`: a quarantine opened or cleared
shows on the next view, and is part of the key the drawing of a device is reused under). The status of a device is :func:`app.services.devices.device_status`,
as for the API.
"""

from __future__ import annotations

import threading
from collections import defaultdict, namedtuple
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select, true
from sqlalchemy.orm import Session

from app.models import Device, DeviceProcess, DeviceTelemetry, Finding, Host, User
from app.models.states import LIVE_FINDING_STATES
from app.services.device_names import slice_label
from app.services.devices import CLOCK_TROUBLE_SHOWN, device_status, host_state, owner_label, process_occupies
from app.services.lab_holds import FOREVER, LabHolds, now_and_next
from app.services.plain_holdings import CHUNK, HeldBy, plain_holdings
from app.services.quarantined import QuarantineNow, open_plain, quarantine_of

_DEVICE = ("id", "uuid", "index", "name", "pci_bus_id", "memory_total_mib", "parent_id", "mig_profile",
           "gpu_instance_id")
_TELEMETRY = ("memory_used_mib", "utilization_gpu", "temperature_c", "power_draw_w", "power_limit_w", "health",
              "error", "processes_status", "processes_error", "process_data", "process_data_detail", "last_owner")
_PROCESS = ("pid", "type", "used_memory_mib", "unix_user", "uid", "command", "name", "container_id", "owner_status")
_HOST = ("id", "name", "policy", "last_seen_at", "last_seq", "last_collected_at", "interval_seconds",
         "monitoring_status", "monitoring_message", "source", "replay_of", "driver_version", "cuda_version", "suspect",
         "suspect_reasons", "clock_offset_s", "clock_trouble", "clock_trouble_at")

DeviceInfo = namedtuple("DeviceInfo", _DEVICE)
Telemetry = namedtuple("Telemetry", _TELEMETRY)
class Process(namedtuple("Process", (*_PROCESS, "uid_name"))):
    """A listed process; ``uid_name``: the gpuroster user whose Unix uid a bare uid is (or ``None``)."""

    __slots__ = ()

    @property
    def owner(self) -> str:
        """Who the page names (:func:`~app.services.devices.owner_label`), in the current
        locale: worked out when drawn, so a cached process serves readers of any language."""
        return owner_label(self.unix_user, self.owner_status, self.uid, {self.uid: self.uid_name} if self.uid_name else {})


@dataclass(frozen=True, slots=True)
class HostNow:
    """One host as the page shows it (``status``: a :class:`~app.models.states.HostStatus`
    at the time of the view; instants UTC; ``clock_offset_s`` seconds)."""

    id: int
    name: str
    policy: str
    status: str
    last_seen_at: datetime | None
    monitoring_message: str | None
    source: str | None
    replay_of: list[str] | None
    driver_version: str | None
    cuda_version: str | None
    suspect: bool
    suspect_reasons: list[str] | None
    clock_offset_s: float | None
    clock_trouble: str | None
    version: tuple = field(repr=False)  # the snapshot version its devices are cached under


@dataclass(frozen=True, slots=True, eq=False)
class DeviceNow:
    """What a device looks like between two snapshots of its host (cached): its columns,
    its name for people (``GPU 0 · MIG 4``), telemetry (``None``: never reported),
    processes by pid, and the pids of its live findings with their kind. Compared by
    identity: a new snapshot of its host builds a new one. ``drawn`` holds what pages drew
    from it (their key -> HTML), so it goes when the state goes."""

    device: DeviceInfo
    label: str
    telemetry: Telemetry | None
    processes: tuple[Process, ...]
    finding_pids: dict[int, str]
    computing: bool  # a listed process makes it "in use" (devices.process_occupies)
    drawn: dict = field(default_factory=dict, repr=False)


@dataclass(slots=True)
class DeviceRowNow:
    """A device at the time of the view: its cached state, status, holders and the open
    health quarantine keeping it from booking (its own, or its GPU's for a MIG instance)."""

    state: DeviceNow
    status: str
    holder: HeldBy | None
    next_reservation: HeldBy | None
    quarantine: QuarantineNow | None = None


class NowCache:
    """Per process, per application: host id -> (snapshot version, its devices). Bounded by
    the number of hosts (entries of hosts no longer listed are dropped). Thread-safe: the
    page runs in a thread pool; two views building the same host at once both build it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lab_key: tuple | None = None
        self._hosts: dict[int, tuple[tuple, list[DeviceNow]]] = {}
        self._drawn: dict[int, dict] = {}
        self.hits = 0
        self.misses = 0

    def devices(self, session: Session, hosts: list[HostNow], lab_key: tuple) -> dict[int, list[DeviceNow]]:
        """The devices of ``hosts``, read again only for hosts whose version moved."""
        with self._lock:
            if lab_key != self._lab_key:
                self._hosts, self._drawn, self._lab_key = {}, {}, lab_key
            cached = {h.id: self._hosts.get(h.id) for h in hosts}
        out = {h.id: got[1] for h in hosts if (got := cached[h.id]) is not None and got[0] == h.version}
        stale = [h for h in hosts if h.id not in out]
        self.hits += len(out)
        self.misses += len(stale)
        if stale:
            fresh = read_devices(session, [h.id for h in stale])
            with self._lock:
                if lab_key == self._lab_key:
                    for h in stale:
                        self._hosts[h.id] = (h.version, fresh.get(h.id, []))
            out.update({h.id: fresh.get(h.id, []) for h in stale})
        return out

    def prune(self, host_ids: Iterable[int]) -> None:
        """Forget hosts not in ``host_ids`` (deleted hosts)."""
        keep = set(host_ids)
        with self._lock:
            for hid in [h for h in self._hosts if h not in keep]:
                del self._hosts[hid]
            for hid in [h for h in self._drawn if h not in keep]:
                del self._drawn[hid]

    def drawn(self, host_id: int) -> dict:
        """What pages drew of host ``host_id`` (their key -> HTML), kept while the host is
        listed and the lab's look (``lab_key``) stays the same; the pages' keys say what else
        the drawing depends on."""
        with self._lock:
            return self._drawn.setdefault(host_id, {})


def lab_key(session: Session) -> tuple:
    """What changes the devices' look without an ingest, in one statement: devices counted,
    retired, open, and summed by host and parent (retire, open, move), and users with Unix
    uids (who a bare uid is). Scans devices and users only (thousands of rows)."""
    dev = select(func.count(), func.count(Device.retired_at), func.sum(case((Device.is_open, 1), else_=0)),
                 func.sum(Device.host_id), func.sum(func.coalesce(Device.parent_id, 0)), func.max(Device.id)).subquery()
    usr = select(func.count(), func.max(User.id), func.sum(func.coalesce(User.unix_uid, 0))).subquery()
    return tuple(session.execute(select(dev, usr).select_from(dev.join(usr, true()))).one())


def read_hosts(session: Session, *, now: datetime) -> list[HostNow]:
    """Every host by name, with its status at ``now`` (UTC)."""
    out = []
    for row in session.execute(select(*(getattr(Host, c) for c in _HOST)).order_by(Host.name)):
        r = dict(zip(_HOST, row, strict=True))
        status = host_state(r["last_seen_at"], r["interval_seconds"], r["monitoring_status"], now)[0]
        trouble_at = r["clock_trouble_at"]
        out.append(HostNow(
            id=r["id"], name=r["name"], policy=r["policy"], status=status, last_seen_at=r["last_seen_at"],
            monitoring_message=r["monitoring_message"], source=r["source"], replay_of=r["replay_of"],
            driver_version=r["driver_version"], cuda_version=r["cuda_version"], suspect=r["suspect"],
            suspect_reasons=r["suspect_reasons"], clock_offset_s=r["clock_offset_s"],
            clock_trouble=r["clock_trouble"] if trouble_at and now - trouble_at < CLOCK_TROUBLE_SHOWN else None,
            version=(r["last_seen_at"], r["last_seq"], r["last_collected_at"]),
        ))
    return out


def read_devices(session: Session, host_ids: list[int]) -> dict[int, list[DeviceNow]]:
    """Host id -> its non-retired devices (MIG instances after their GPU), from one read per
    table; device ids go to the database in chunks, walking its device indexes. Core, not
    the ORM: plain rows for tens of thousands of them (the ORM's row handling was a third
    of a cold read)."""
    conn = session.connection()
    per_host: dict[int, list[tuple]] = defaultdict(list)
    devices: dict[int, DeviceInfo] = {}
    for i in range(0, len(host_ids), CHUNK):
        for row in conn.execute(
            select(Device.host_id, *(getattr(Device, c) for c in _DEVICE))
            .where(Device.host_id.in_(host_ids[i : i + CHUNK]), Device.retired_at.is_(None))
        ):
            info = DeviceInfo._make(row[1:])
            devices[info.id] = info
            per_host[row[0]].append(info)
    if not devices:
        return {}
    ids = list(devices)
    tele: dict[int, Telemetry] = {}
    procs: dict[int, list[tuple]] = defaultdict(list)
    findings: dict[int, dict[int, str]] = defaultdict(dict)
    for i in range(0, len(ids), CHUNK):
        chunk = ids[i : i + CHUNK]
        for row in conn.execute(select(DeviceTelemetry.device_id, *(getattr(DeviceTelemetry, c) for c in _TELEMETRY))
                                   .where(DeviceTelemetry.device_id.in_(chunk))):
            tele[row[0]] = Telemetry._make(row[1:])
        for row in conn.execute(select(DeviceProcess.device_id, *(getattr(DeviceProcess, c) for c in _PROCESS))
                                   .where(DeviceProcess.device_id.in_(chunk))):
            procs[row[0]].append(tuple(row[1:]))
        for dev_id, pid, kind in conn.execute(
            select(Finding.device_id, Finding.pid, Finding.kind)
            .where(Finding.device_id.in_(chunk), Finding.state.in_(LIVE_FINDING_STATES), Finding.pid.is_not(None))
            .order_by(Finding.id)
        ):
            findings[dev_id][pid] = kind
    bare = {p[4] for plist in procs.values() for p in plist if p[8] == "uid_only" and p[4] is not None}
    uid_names = dict(conn.execute(select(User.unix_uid, User.username).where(User.unix_uid.in_(bare))).all()) \
        if bare else {}
    missing = {d.parent_id for d in devices.values() if d.parent_id is not None and d.parent_id not in devices}
    parent_index = {d.id: d.index for d in devices.values()}
    if missing:
        parent_index.update(conn.execute(select(Device.id, Device.index).where(Device.id.in_(missing))).all())
    out: dict[int, list[DeviceNow]] = {}
    for host_id, infos in per_host.items():
        rows = []
        for d in sorted(infos, key=_order):
            plist = tuple(Process._make((*p, uid_names.get(p[4]))) for p in sorted(procs.get(d.id, ()), key=_pid))
            t, found = tele.get(d.id), findings.get(d.id, {})
            label = slice_label(d.index, d.parent_id, d.gpu_instance_id, d.uuid, parent_index.get(d.parent_id))
            rows.append(DeviceNow(
                device=d, label=label, telemetry=t, processes=plist, finding_pids=found,
                computing=any(process_occupies(p.unix_user, p.owner_status, p.type) for p in plist),
            ))
        out[host_id] = rows
    return out


def _order(d: DeviceInfo) -> tuple:
    return (d.index if d.index is not None else 1 << 30, d.parent_id or 0, d.gpu_instance_id or 0)


def _pid(p: tuple) -> Any:
    return p[0]


def device_rows(session: Session, *, devices: list[DeviceNow], host_status: dict[int, str], host_of: dict[int, int],
                now: datetime, holds: LabHolds | None = None) -> list[DeviceRowNow]:
    """``devices`` at ``now`` (UTC): holders and the next reservation read now (the holder rule),
    the open quarantines read now, and the status (:func:`~app.services.devices.device_status`); ``host_status``: host id ->
    status, ``host_of``: device id -> host id. ``holds``: the whole lab's holders at ``now``
    as :class:`~app.services.lab_holds.HoldsCache` read them on this request (``None``: read
    for ``devices`` alone)."""
    if holds is None:
        holds = _holds_of(session, devices, now)
    quarantines = open_plain(session, {i for d in devices for i in (d.device.id, d.device.parent_id)})
    out = []
    for d in devices:
        current = holds.current.get(d.device.id)
        upcoming = holds.upcoming.get(d.device.id)
        t = d.telemetry
        status = device_status(
            retired=False, lost=t is not None and t.health == "lost", host_state=host_status[host_of[d.device.id]],
            has_finding=bool(d.finding_pids), computing=d.computing, held=current is not None,
            process_data=(t.process_data if t is not None else None) or "ok",
        )
        out.append(DeviceRowNow(state=d, status=status, holder=current, next_reservation=upcoming,
                                quarantine=quarantine_of(quarantines, d.device)))
    return out


def _holds_of(session: Session, devices: list[DeviceNow], now: datetime) -> LabHolds:
    """The holders at ``now`` and the next reservations of ``devices`` alone, read for them."""
    held = plain_holdings(session, devices=[d.device for d in devices], start=now, end=FOREVER)
    return now_and_next(held, now, valid_until=now)
