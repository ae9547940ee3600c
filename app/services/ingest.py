"""Ingest of agent snapshots: devices by UUID, latest telemetry and processes, rollups,
findings; idempotent by ``(host, agent instance, seq)``; answers with the host's
reservation table and the service's time.

Time is the service's: a host is "seen" when the service receives its snapshot. A
``collected_at`` more than :data:`CLOCK_FUTURE_TOLERANCE` ahead of receipt, or older than
the idempotency window (``snapshot_seq_retention_days``), is clock trouble: recorded on the
host, and the snapshot is filed under its time of receipt, so one bad date never freezes a
host (its later snapshots would all look older). Devices registered to another host are
refused (:mod:`app.services.device_claims`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import delete, select, union_all
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from agent.schema import HostPolicy, ReservationEntry, Snapshot, SnapshotAck
from app.config import Settings
from app.models import (
    Device,
    DeviceProcess,
    DeviceTelemetry,
    GroupMember,
    Host,
    HostSnapshot,
    Reservation,
    ReservationDevice,
    ReservationShare,
    UsageRollup,
    User,
    utcnow,
)
from app.services import device_claims
from app.services import findings as findings_service
from app.services import hosts as host_service
from app.services import occupied

log = logging.getLogger(__name__)

# collected_at may run ahead of receipt by this much (clock steps, NTP slew) before it is clock trouble
CLOCK_FUTURE_TOLERANCE = timedelta(seconds=60)

# The window of the host's reservation table sent to the agent.
TABLE_AHEAD = timedelta(hours=48)
TABLE_BEHIND = timedelta(hours=6)

TELEMETRY_FIELDS = (
    "memory_used_mib", "utilization_gpu", "utilization_memory", "temperature_c", "power_draw_w", "power_limit_w",
    "throttle_reasons", "ecc_uncorrected", "retired_pages", "persistence_mode", "compute_mode", "health", "error",
    "processes_status", "processes_error", "memory_reserved_mib", "process_data", "process_data_detail", "last_owner",
)


def host_policy(host: Host) -> HostPolicy:
    """The host's enforcement settings as the agent receives them."""
    kwargs: dict[str, object] = dict(
        policy=host.policy,
        grace_seconds=host.grace_seconds,
        kill_timeout_seconds=host.kill_timeout_seconds,
        notice_interval_seconds=host.notice_interval_seconds,
        min_uid=host.min_uid,
        exempt_users=list(host.exempt_users or []),
        idle_minutes=host.idle_minutes,
    )
    if host.exempt_process_names is not None:
        kwargs["exempt_process_names"] = list(host.exempt_process_names)
    return HostPolicy(**kwargs)  # type: ignore[arg-type]


def reservation_table(session: Session, *, host: Host, now: datetime) -> list[ReservationEntry]:
    """Active, upcoming (48 h) and recently ended (6 h) reservations of ``host`` for the agent.

    Two plain queries (reservations with their devices; shares resolved to Unix names, groups
    expanded), since this runs on every snapshot.
    """
    rows = session.execute(
        select(Reservation.id, Reservation.start_at, Reservation.end_at, User.username, User.unix_name, Device.uuid,
               User.unix_uid)
        .join(User, User.id == Reservation.user_id)
        .join(ReservationDevice, ReservationDevice.reservation_id == Reservation.id)
        .join(Device, Device.id == ReservationDevice.device_id)
        .where(
            Reservation.host_id == host.id,
            Reservation.status != "cancelled",
            Reservation.end_at > now - TABLE_BEHIND,
            Reservation.start_at < now + TABLE_AHEAD,
        )
        .order_by(Reservation.start_at, Reservation.id, Device.index)
    ).all()
    if not rows:
        return []
    entries: dict[int, ReservationEntry] = {}
    for rid, start, end, username, unix_name, uuid, unix_uid in rows:
        e = entries.get(rid)
        if e is None:
            e = entries[rid] = ReservationEntry(id=rid, user=username, unix_name=unix_name, unix_uid=unix_uid,
                                                device_uuids=[], start=start, end=end)
        e.device_uuids.append(uuid)
    ids = list(entries)
    direct = (
        select(ReservationShare.reservation_id, User.unix_name, User.unix_uid)
        .join(User, User.id == ReservationShare.user_id)
        .where(ReservationShare.reservation_id.in_(ids))
    )
    via_group = (
        select(ReservationShare.reservation_id, User.unix_name, User.unix_uid)
        .join(GroupMember, GroupMember.group_id == ReservationShare.group_id)
        .join(User, User.id == GroupMember.user_id)
        .where(ReservationShare.reservation_id.in_(ids))
    )
    shared: dict[int, set[str]] = {}
    shared_uids: dict[int, set[int]] = {}
    for rid, unix, uid in session.execute(union_all(direct, via_group)):
        shared.setdefault(rid, set()).add(unix)
        if uid is not None:
            shared_uids.setdefault(rid, set()).add(uid)
    for rid, names in shared.items():
        entries[rid].shared_with = sorted(names)
        entries[rid].shared_uids = sorted(shared_uids.get(rid, ()))
    return list(entries.values())


def uid_table(session: Session) -> dict[int, str]:
    """Unix uid -> unix_name of every active user with a uid: the agent judges a process whose
    uid has no passwd entry on the host (directory users) by this table."""
    rows = session.execute(select(User.unix_uid, User.unix_name).where(User.unix_uid.is_not(None), User.active.is_(True)))
    return {uid: name for uid, name in rows}


def build_ack(session: Session, *, host: Host, seq: int, duplicate: bool, settings: Settings, now: datetime,
              conflict: str | None = None) -> SnapshotAck:
    open_devices = list(session.scalars(select(Device.uuid).where(Device.host_id == host.id, Device.is_open.is_(True))))
    return SnapshotAck(
        accepted=True,
        duplicate=duplicate,
        conflict=conflict,
        seq=seq,
        server_time=now,
        policy=host_policy(host),
        reservations=reservation_table(session, host=host, now=now),
        open_devices=open_devices,
        unix_uids=uid_table(session),
        booking_url=settings.base_url.rstrip("/") + "/book",
    )


def _upsert_devices(session: Session, host: Host, snap: Snapshot, now: datetime) -> dict[str, Device]:
    uuids = [d.uuid for d in snap.devices] + [d.parent_uuid for d in snap.devices if d.parent_uuid]
    known = {d.uuid: d for d in session.scalars(select(Device).where(Device.uuid.in_(uuids)))} if uuids else {}
    # parents (whole GPUs) first so MIG instances can point at them
    for rep in sorted(snap.devices, key=lambda d: d.parent_uuid is not None):
        dev = known.get(rep.uuid)
        if dev is None:
            dev = Device(uuid=rep.uuid, host_id=host.id, first_seen_at=now)
            session.add(dev)
            known[rep.uuid] = dev
        dev.host_id = host.id
        dev.last_seen_at = now
        for f in ("index", "name", "pci_bus_id", "memory_total_mib", "mig_profile", "gpu_instance_id", "compute_instance_id", "mig_mode", "link_group"):
            val = getattr(rep, f)
            if val is not None or f in ("mig_mode",):
                setattr(dev, f, val)
        if rep.parent_uuid:
            parent = known.get(rep.parent_uuid)
            if parent is not None:
                if parent.id is None:
                    session.flush()
                dev.parent_id = parent.id
    session.flush()
    return known


def _store_latest(session: Session, host: Host, snap: Snapshot, devices: dict[str, Device], at: datetime) -> None:
    dev_ids = [devices[d.uuid].id for d in snap.devices]
    current = {t.device_id: t for t in session.scalars(select(DeviceTelemetry).where(DeviceTelemetry.device_id.in_(dev_ids)))} if dev_ids else {}
    for rep in snap.devices:
        dev = devices[rep.uuid]
        t = current.get(dev.id)
        if t is None:
            t = DeviceTelemetry(device_id=dev.id)
            session.add(t)
        t.collected_at = at
        for f in TELEMETRY_FIELDS:
            setattr(t, f, getattr(rep, f))
    session.execute(delete(DeviceProcess).where(DeviceProcess.host_id == host.id))
    rows = []
    for p in snap.processes:
        dev = devices.get(p.device_uuid)
        if dev is None:
            continue
        rows.append(
            dict(
                host_id=host.id, device_id=dev.id, pid=p.pid, type=p.type, used_memory_mib=p.used_memory_mib, uid=p.uid,
                unix_user=p.unix_user, command=p.command, name=p.name, create_time=p.create_time,
                container_id=p.container_id, owner_status=p.owner_status, seen_at=at,
            )
        )
    if rows:
        session.execute(DeviceProcess.__table__.insert(), rows)


def _insert_for(session: Session):
    """The dialect's INSERT construct (both offer ON CONFLICT)."""
    return pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert


def _rollup(session: Session, snap: Snapshot, devices: dict[str, Device], at: datetime) -> None:
    minute = at.replace(second=0, microsecond=0)
    users_by_dev: dict[str, set[str]] = {}
    for p in snap.processes:
        if p.unix_user:
            users_by_dev.setdefault(p.device_uuid, set()).add(p.unix_user)
    ins = _insert_for(session)
    values = []
    for rep in snap.devices:
        if rep.health != "ok" or snap.stale:
            continue
        values.append(
            dict(
                device_id=devices[rep.uuid].id,
                minute=minute,
                samples=1,
                utilization_sum=rep.utilization_gpu or 0.0,
                utilization_samples=1 if rep.utilization_gpu is not None else 0,
                memory_used_sum_mib=rep.memory_used_mib or 0.0,
                memory_samples=1 if rep.memory_used_mib is not None else 0,
                users=sorted(users_by_dev.get(rep.uuid, ())),
            )
        )
    if not values:
        return
    # One cached statement executed with many parameter sets (insertmanyvalues: one round trip);
    # a multi-row .values() literal was recompiled on every snapshot.
    table = UsageRollup.__table__
    stmt = ins(table)
    ex = stmt.excluded
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.c.device_id, table.c.minute],
        set_=dict(
            samples=table.c.samples + ex.samples,
            utilization_sum=table.c.utilization_sum + ex.utilization_sum,
            utilization_samples=table.c.utilization_samples + ex.utilization_samples,
            memory_used_sum_mib=table.c.memory_used_sum_mib + ex.memory_used_sum_mib,
            memory_samples=table.c.memory_samples + ex.memory_samples,
            users=ex.users,
        ),
    )
    session.execute(stmt, values)


def clock_trouble(snap: Snapshot, *, now: datetime, settings: Settings) -> str | None:
    """Why ``snap.collected_at`` cannot be trusted against receipt at ``now``, or ``None``."""
    ahead = (snap.collected_at - now).total_seconds()
    if ahead > CLOCK_FUTURE_TOLERANCE.total_seconds():
        return f"snapshot seq {snap.seq} dated {snap.collected_at.isoformat()}, {ahead:.0f} s after it was received"
    if -ahead > settings.snapshot_seq_retention_days * 86400:
        return (f"snapshot seq {snap.seq} dated {snap.collected_at.isoformat()}, older than the "
                f"{settings.snapshot_seq_retention_days}-day replay window when received")
    return None


def _claim(session: Session, *, host: Host, snap: Snapshot, now: datetime) -> tuple[bool, str | None]:
    """Claim ``(host, agent instance, seq)``: (claimed, conflict). ``conflict`` says why an
    already-claimed seq belongs to a different snapshot (its collected_at differs)."""
    instance = snap.agent_instance or ""
    # One statement claims the key: a replayed or concurrently posted seq inserts nothing.
    ins = _insert_for(session)(HostSnapshot).values(
        host_id=host.id, agent_instance=instance, seq=snap.seq, collected_at=snap.collected_at, received_at=now
    )
    claimed = session.execute(
        ins.on_conflict_do_nothing(
            index_elements=[HostSnapshot.host_id, HostSnapshot.agent_instance, HostSnapshot.seq]
        ).returning(HostSnapshot.id)
    ).first()
    if claimed is not None:
        return True, None
    had = session.scalar(select(HostSnapshot.collected_at).where(
        HostSnapshot.host_id == host.id, HostSnapshot.agent_instance == instance, HostSnapshot.seq == snap.seq))
    if had is not None and abs((had - snap.collected_at).total_seconds()) > 0.001:
        conflict = (f"seq {snap.seq} of host {host.name} was already used by a snapshot collected at {had.isoformat()}; "
                    f"this one was collected at {snap.collected_at.isoformat()} (an agent that lost its state "
                    "directory and sends no agent_instance?)")
        log.error("snapshot dropped as a duplicate the service never had: %s", conflict)
        return False, conflict
    return False, None


def ingest_snapshot(session: Session, *, host: Host, snap: Snapshot, settings: Settings, now: datetime | None = None) -> SnapshotAck:
    """Store a snapshot of ``host`` and answer with its reservation table and policy.

    Idempotent by ``(host, agent_instance, seq)``: a replayed key changes nothing and answers
    ``duplicate=true`` (with ``conflict`` set, and an error logged, when the stored snapshot
    under that key is a different one). A snapshot older than the host's latest (spool replay
    after an outage) adds its findings and rollups but does not overwrite the latest state.
    Devices registered to another host are refused for this snapshot.
    Raises Forbidden when ``snap.host`` is not the token's host.
    """
    now = now or utcnow()
    host_service.require_same_host(host, snap.host)
    claimed, conflict = _claim(session, host=host, snap=snap, now=now)
    if not claimed:
        return build_ack(session, host=host, seq=snap.seq, duplicate=True, settings=settings, now=now, conflict=conflict)

    trouble = clock_trouble(snap, now=now, settings=settings)
    at = snap.collected_at
    if trouble is not None:
        log.warning("host %s: clock trouble: %s; filed under its time of receipt", host.name, trouble)
        host.clock_trouble, host.clock_trouble_at = trouble[:512], now
        at = now
    snap = device_claims.refuse_foreign_devices(session, host=host, snap=snap, now=now)
    if trouble is not None and snap.collected_at > now:
        # finding times from the same clock would outrank every later report of the finding
        snap = snap.model_copy(update={"findings": [
            f.model_copy(update={"first_seen": min(f.first_seen, now), "last_seen": min(f.last_seen, now)})
            for f in snap.findings]})
    devices = _upsert_devices(session, host, snap, now)
    # Latest by collection time, not seq: a spooled backlog replays older snapshots after newer ones may
    # have been posted, and an agent whose state was wiped restarts its seq.
    is_latest = host.last_collected_at is None or at >= host.last_collected_at
    if is_latest:
        _store_latest(session, host, snap, devices, at)
        host.last_seq = snap.seq
        host.last_collected_at = at
        host.last_seen_at = now
        host.interval_seconds = snap.interval_seconds
        host.agent_version = snap.agent_version
        host.driver_version = snap.driver_version
        host.nvml_version = snap.nvml_version
        host.cuda_version = snap.cuda_version
        host.source = snap.source
        host.replay_of = snap.replay_of
        host.monitoring_status = snap.monitoring.status
        host.monitoring_message = snap.monitoring.message
        host.stale = snap.stale
        host.suspect = snap.suspect
        host.suspect_reasons = snap.suspect_reasons or None
        host.clock_offset_s = snap.clock_offset_s
        occupied.record_warnings(session, host=host, snap=snap, devices=devices, now=now)
    else:
        host.last_seen_at = now  # the agent is alive: staleness goes by receipt
    _rollup(session, snap, devices, at)
    findings_service.record_findings(session, host=host, reports=snap.findings, now=now, settings=settings)
    session.flush()
    return build_ack(session, host=host, seq=snap.seq, duplicate=False, settings=settings, now=now)


def prune(session: Session, *, settings: Settings, now: datetime | None = None) -> None:
    """Drop idempotency keys and rollups older than their retention windows."""
    now = now or utcnow()
    session.execute(delete(HostSnapshot).where(HostSnapshot.received_at < now - timedelta(days=settings.snapshot_seq_retention_days)))
    session.execute(delete(UsageRollup).where(UsageRollup.minute < now - timedelta(days=settings.rollup_retention_days)))

