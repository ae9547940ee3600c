"""The latest state of a host as set-based SQLAlchemy Core statements: devices, telemetry,
processes and the host row, each written only where the snapshot changed it.

Ingest runs for every agent snapshot (a 1,000-host lab posting every 5 s is 200 a second),
so no ORM objects are built here: rows are read as plain tuples, compared with the report
in Python, and the differences written with statements built once per dialect (their
compiled form is cached by SQLAlchemy, so each call only binds parameters).

Columns that change on every snapshot (``devices.last_seen_at``,
``device_telemetry.collected_at``, ``device_processes.seen_at``) are written by one UPDATE
over the unchanged rows, since readers match them against ``hosts.last_collected_at``. Those
"touches" are gathered in :class:`Touches` and written with the host row: on PostgreSQL as
data-modifying CTEs of the host's UPDATE, one statement instead of four (each statement costs
psycopg and SQLAlchemy about 0.3 ms of CPU, more than PostgreSQL spends executing it); on
SQLite, where a statement is cheap and DML in a CTE does not exist, one after the other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ARRAY, Integer, any_, bindparam, delete, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from agent.schema import Snapshot
from app.db import is_sqlite
from app.models import Device, DeviceProcess, DeviceTelemetry, Host
from app.services import ingest_ack

TELEMETRY_FIELDS = (
    "memory_used_mib", "utilization_gpu", "utilization_memory", "temperature_c", "power_draw_w", "power_limit_w",
    "throttle_reasons", "ecc_uncorrected", "retired_pages", "persistence_mode", "compute_mode", "health", "error",
    "processes_status", "processes_error", "memory_reserved_mib", "process_data", "process_data_detail", "last_owner",
)
# Device columns copied from the report; a ``None`` in the report keeps the stored value,
# except for ``mig_mode`` (``None`` there means NVML says MIG is unsupported).
DEVICE_FIELDS = ("index", "name", "pci_bus_id", "memory_total_mib", "mig_profile", "gpu_instance_id",
                 "compute_instance_id", "mig_mode", "link_group")
PROCESS_FIELDS = ("device_id", "pid", "type", "used_memory_mib", "uid", "unix_user", "command", "name", "create_time",
                  "container_id", "owner_status")
HOST_FIELDS = ("last_seq", "last_collected_at", "last_seen_at", "interval_seconds", "agent_version", "driver_version",
               "nvml_version", "cuda_version", "source", "replay_of", "monitoring_status", "monitoring_message", "stale",
               "suspect", "suspect_reasons", "clock_offset_s")
# Written only when a snapshot shows clock trouble (a rare, separate statement).
CLOCK_FIELDS = ("clock_trouble", "clock_trouble_at")

_dev = Device.__table__
_tel = DeviceTelemetry.__table__
_proc = DeviceProcess.__table__
_host = Host.__table__

# The devices with their latest telemetry in one statement (a round trip less per snapshot):
# telemetry columns follow the device's, NULL where the device has no telemetry row yet.
_SELECT_DEVICES = (select(_dev.c.uuid, _dev.c.id, _dev.c.host_id, _dev.c.parent_id, *(_dev.c[f] for f in DEVICE_FIELDS),
                          _tel.c.device_id, *(_tel.c[f] for f in TELEMETRY_FIELDS))
                   .select_from(_dev.outerjoin(_tel, _tel.c.device_id == _dev.c.id))
                   .where(_dev.c.uuid.in_(bindparam("uuids", expanding=True))))
_TEL_AT = 4 + len(DEVICE_FIELDS)  # index of telemetry's device_id in a _SELECT_DEVICES row
_INSERT_DEVICE = insert(_dev).returning(_dev.c.id)
_UPDATE_DEVICE = (update(_dev).where(_dev.c.id == bindparam("_id"))
                  .values({f: bindparam(f) for f in (*DEVICE_FIELDS, "parent_id", "last_seen_at")}))
_TOUCH_DEVICES = (update(_dev).where(_dev.c.id.in_(bindparam("ids", expanding=True)))
                  .values(last_seen_at=bindparam("at")))
_INSERT_TELEMETRY = insert(_tel)
_UPDATE_TELEMETRY = (update(_tel).where(_tel.c.device_id == bindparam("_id"))
                     .values({f: bindparam(f) for f in (*TELEMETRY_FIELDS, "collected_at")}))
_TOUCH_TELEMETRY = (update(_tel).where(_tel.c.device_id.in_(bindparam("ids", expanding=True)))
                    .values(collected_at=bindparam("at")))
_SELECT_HOSTS_PROCESSES = (select(_proc.c.host_id, *(_proc.c[f] for f in PROCESS_FIELDS))
                           .where(_proc.c.host_id.in_(bindparam("host_ids", expanding=True))))
_DELETE_PROCESSES = delete(_proc).where(_proc.c.host_id == bindparam("host_id"))
_INSERT_PROCESS = insert(_proc)
_UPDATE_HOST = (update(_host).where(_host.c.id == bindparam("_id"))
                .values({f: bindparam(f, type_=_host.c[f].type) for f in HOST_FIELDS}))
_TOUCH_PROCESSES = update(_proc).where(_proc.c.host_id == bindparam("_host")).values(seen_at=bindparam("at"))
# PostgreSQL: the three touches ride on the host's UPDATE. An empty id array, or a NULL host,
# matches no row, so one statement serves every combination of touches.
_IDS = ARRAY(Integer)
_UPDATE_HOST_TOUCHING = (
    _UPDATE_HOST
    .add_cte(update(_dev).where(_dev.c.id == any_(bindparam("touch_devices", type_=_IDS)))
             .values(last_seen_at=bindparam("touch_now")).cte("touch_devices"))
    .add_cte(update(_tel).where(_tel.c.device_id == any_(bindparam("touch_telemetry", type_=_IDS)))
             .values(collected_at=bindparam("touch_at")).cte("touch_telemetry"))
    .add_cte(update(_proc).where(_proc.c.host_id == bindparam("touch_processes", type_=Integer))
             .values(seen_at=bindparam("touch_at")).cte("touch_processes"))
)


@dataclass(slots=True)
class Touches:
    """Rows of a host that a snapshot left unchanged, whose "seen" times move to it; written by
    :func:`update_host`. ``now``: receipt (UTC), for ``devices.last_seen_at``; ``at``: the
    snapshot's collection time (UTC), for telemetry and processes."""

    now: datetime
    at: datetime | None = None
    devices: list[int] = field(default_factory=list)
    telemetry: list[int] = field(default_factory=list)
    processes_of: int | None = None  # host id whose process list is unchanged

    def write_apart(self, session: Session) -> None:
        """Each touch as its own statement (SQLite, or a host row with nothing to write)."""
        if self.devices:
            session.execute(_TOUCH_DEVICES, {"ids": self.devices, "at": self.now})
        if self.telemetry:
            session.execute(_TOUCH_TELEMETRY, {"ids": self.telemetry, "at": self.at})
        if self.processes_of is not None:
            session.execute(_TOUCH_PROCESSES, {"_host": self.processes_of, "at": self.at})

    def params(self) -> dict[str, object]:
        """Bind parameters of the touches in :data:`_UPDATE_HOST_TOUCHING`."""
        return {"touch_devices": self.devices, "touch_now": self.now, "touch_telemetry": self.telemetry,
                "touch_at": self.at or self.now, "touch_processes": self.processes_of}


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A stored device as ingest needs it: its id (``devices.id``) and its parent's, if a MIG instance."""

    id: int
    parent_id: int | None


def load_devices(session: Session, uuids: Iterable[str]) -> list[tuple]:
    """Rows ``(uuid, id, host_id, parent_id, *DEVICE_FIELDS, telemetry device_id, *TELEMETRY_FIELDS)``
    of the stored devices among ``uuids`` (telemetry ``None`` where none is stored)."""
    wanted = sorted(set(uuids))
    if not wanted:
        return []
    return list(session.execute(_SELECT_DEVICES, {"uuids": wanted}).all())


def snapshot_uuids(snap: Snapshot) -> set[str]:
    """Every device UUID ``snap`` names: its devices, their MIG parents, and the devices of its
    processes and findings (ingest reads the stored rows of exactly these)."""
    return {*(d.uuid for d in snap.devices), *(d.parent_uuid for d in snap.devices if d.parent_uuid),
            *(p.device_uuid for p in snap.processes), *(f.device_uuid for f in snap.findings)}


@dataclass(frozen=True, slots=True)
class BatchRows:
    """The rows a batch of snapshots reads once and writes once, instead of once per snapshot.

    Read in three statements: devices with telemetry by UUID (:func:`load_devices`' rows),
    each host's process rows (``host id -> rows``, :data:`PROCESS_FIELDS` order) and each
    host's ack rows (``host id -> AckRows``, :func:`ingest_ack.batch_ack_rows`). Gathered for
    one write each when the batch's snapshots are in (``ingest.write_batch``): the per-minute
    rollup rows and the ``(host id, collection time)`` of hosts whose bookings may check in."""

    devices: dict[str, tuple]
    processes: dict[int, list[tuple]]
    acks: dict[int, ingest_ack.AckRows]
    rollups: list[dict] = field(default_factory=list)
    check_ins: list[tuple[int, datetime]] = field(default_factory=list)

    def devices_of(self, uuids: Iterable[str]) -> list[tuple]:
        """:func:`load_devices`' answer for ``uuids``, from the batch's rows."""
        return [self.devices[u] for u in sorted(set(uuids)) if u in self.devices]


def batch_rows(session: Session, host_ids: list[int], uuids: set[str], now: datetime) -> BatchRows:
    """The stored rows for a batch's snapshots: of hosts ``host_ids`` (distinct), naming the
    devices ``uuids`` (:func:`snapshot_uuids`; no device named by two of them, as a batch
    holds no two such, :mod:`app.api.snapshot_batch`, so no snapshot's ingest changes the rows
    read here for another); the acks' rows as of ``now`` (UTC)."""
    if not host_ids:
        return BatchRows({}, {}, {})
    devices = {r[0]: r for r in load_devices(session, uuids)}
    processes: dict[int, list[tuple]] = {host_id: [] for host_id in host_ids}
    for row in session.execute(_SELECT_HOSTS_PROCESSES, {"host_ids": sorted(processes)}):
        processes[row[0]].append(tuple(row[1:]))
    return BatchRows(devices, processes, ingest_ack.batch_ack_rows(session, list(processes), now))


def reindexed(snap: Snapshot, stored: list[tuple]) -> bool:
    """Whether ``snap`` reports a stored device (``stored``: :func:`load_devices`' rows) at
    another index: the ack lists a reservation's devices in index order, so ack rows read
    before :func:`upsert_devices` writes the new index are out of date."""
    index = {r[0]: r[4] for r in stored}  # DEVICE_FIELDS[0] is "index"
    return any(d.uuid in index and d.index is not None and d.index != index[d.uuid] for d in snap.devices)


def upsert_devices(session: Session, host: Host, snap: Snapshot, stored: list[tuple], now: datetime,
                   touches: Touches) -> dict[str, DeviceRef]:
    """Register the snapshot's devices to ``host``: new ones inserted (whole GPUs before their
    MIG instances, so a MIG instance can point at its parent), changed ones updated, the
    rest only get ``last_seen_at = now``, added to ``touches``. ``stored`` is :func:`load_devices`'
    answer, already cleared of other hosts' devices. Returns uuid -> :class:`DeviceRef`."""
    rows = {r[0]: r for r in stored}
    refs = {uuid: DeviceRef(r[1], r[3]) for uuid, r in rows.items()}
    touch = touches.devices
    changed: list[dict] = []
    for rep in sorted(snap.devices, key=lambda d: d.parent_uuid is not None):
        parent = refs.get(rep.parent_uuid) if rep.parent_uuid else None
        row = rows.get(rep.uuid)
        if row is None:
            values = {f: getattr(rep, f) for f in DEVICE_FIELDS}
            values.update(uuid=rep.uuid, host_id=host.id, first_seen_at=now, last_seen_at=now,
                          parent_id=parent.id if parent is not None else None)
            new_id = session.execute(_INSERT_DEVICE, values).scalar_one()
            refs[rep.uuid] = DeviceRef(new_id, values["parent_id"])
            continue
        values = {f: (getattr(rep, f) if getattr(rep, f) is not None or f == "mig_mode" else row[4 + i])
                  for i, f in enumerate(DEVICE_FIELDS)}
        parent_id = parent.id if parent is not None else row[3]
        if parent_id != row[3] or any(values[f] != row[4 + i] for i, f in enumerate(DEVICE_FIELDS)):
            values.update(_id=row[1], parent_id=parent_id, last_seen_at=now)
            changed.append(values)
            refs[rep.uuid] = DeviceRef(row[1], parent_id)
        else:
            touch.append(row[1])
    if changed:
        session.execute(_UPDATE_DEVICE, changed)
    return {rep.uuid: refs[rep.uuid] for rep in snap.devices}


def store_latest(session: Session, host: Host, snap: Snapshot, devices: dict[str, DeviceRef], at: datetime,
                 stored: list[tuple], touches: Touches, processes: list[tuple]) -> None:
    """Latest telemetry (one row per device) and process list of ``host`` as of ``at`` (UTC):
    rows whose values changed are rewritten, the rest only get the new collection time (added
    to ``touches``). ``stored`` is :func:`load_devices`' answer (it carries the stored telemetry);
    ``processes``: the host's stored process rows (:class:`BatchRows`)."""
    touches.at = at
    ids = [devices[d.uuid].id for d in snap.devices]
    if ids:
        current = {r[1]: tuple(r[_TEL_AT + 1:]) for r in stored if r[_TEL_AT] is not None}
        new_rows, changed, touch = [], [], touches.telemetry
        for rep in snap.devices:
            dev_id = devices[rep.uuid].id
            values = tuple(getattr(rep, f) for f in TELEMETRY_FIELDS)
            had = current.get(dev_id)
            if had is None:
                new_rows.append(dict(zip(TELEMETRY_FIELDS, values), device_id=dev_id, collected_at=at))
            elif tuple(had) != values:
                changed.append(dict(zip(TELEMETRY_FIELDS, values), _id=dev_id, collected_at=at))
            else:
                touch.append(dev_id)
        if new_rows:
            session.execute(_INSERT_TELEMETRY, new_rows)
        if changed:
            session.execute(_UPDATE_TELEMETRY, changed)
    procs = []
    for p in snap.processes:
        dev = devices.get(p.device_uuid)
        if dev is not None:
            procs.append((dev.id, p.pid, p.type, p.used_memory_mib, p.uid, p.unix_user, p.command, p.name, p.create_time,
                          p.container_id, p.owner_status))
    if Counter(processes) == Counter(procs):
        if procs:
            touches.processes_of = host.id
        return
    if processes:
        session.execute(_DELETE_PROCESSES, {"host_id": host.id})
    if procs:
        session.execute(_INSERT_PROCESS, [dict(zip(PROCESS_FIELDS, p), host_id=host.id, seen_at=at) for p in procs])


def update_host(session: Session, host: Host, values: dict[str, object], touches: Touches) -> None:
    """Write ``values`` (of :data:`HOST_FIELDS` and :data:`CLOCK_FIELDS`) to ``host``'s row when any differs, in
    one statement built once (the other columns keep the loaded object's values), and set them
    on the loaded object without marking it dirty. ``touches`` are written too: on PostgreSQL in
    the host row's statement, elsewhere (or with no host column to write) one statement each."""
    diff = {k: v for k, v in values.items() if getattr(host, k) != v}
    clock = {k: v for k, v in diff.items() if k in CLOCK_FIELDS}
    if clock:
        session.execute(update(_host).where(_host.c.id == host.id).values(clock))
    if len(clock) < len(diff):
        params = {f: getattr(host, f) for f in HOST_FIELDS}
        params.update({k: v for k, v in diff.items() if k not in CLOCK_FIELDS}, _id=host.id)
        if not is_sqlite(session):  # PostgreSQL: DML in a CTE
            session.execute(_UPDATE_HOST_TOUCHING, {**params, **touches.params()})
        else:
            touches.write_apart(session)
            session.execute(_UPDATE_HOST, params)
    else:
        touches.write_apart(session)
    for k, v in diff.items():
        set_committed_value(host, k, v)
