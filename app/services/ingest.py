"""Ingest of agent snapshots: devices by UUID, latest telemetry and processes, rollups,
findings; idempotent by ``(host, agent instance, seq)``; answers with the host's
reservation table and the service's time.

Time is the service's: a host is "seen" when the service receives its snapshot. A
``collected_at`` more than :data:`CLOCK_FUTURE_TOLERANCE` ahead of receipt, or older than
the idempotency window (``snapshot_seq_retention_days``), is clock trouble: recorded on the
host, and the snapshot is filed under its time of receipt, so one bad date never freezes a
host (its later snapshots would all look older). Devices registered to another host are
refused (:mod:`app.services.device_claims`). Devices in a critical health condition are
quarantined (:mod:`app.services.quarantine`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import TextClause, bindparam, delete, select, text
from sqlalchemy.orm import Session

from agent.schema import Snapshot, SnapshotAck
from app.config import Settings
from app.models import Host, HostSnapshot, UsageRollup, utcnow
from app.services import device_claims
from app.services import findings as findings_service
from app.services import hosts as host_service
from app.services import checkin, ingest_state, occupied, quarantine
from app.services.ingest_ack import build_ack

log = logging.getLogger(__name__)

# collected_at may run ahead of receipt by this much (clock steps, NTP slew) before it is clock trouble
CLOCK_FUTURE_TOLERANCE = timedelta(seconds=60)


def _typed_text(sql: str, table) -> TextClause:  # noqa: ANN001
    """``sql`` with each ``:name`` bound as ``table``'s column of that name (its type's
    conversions apply, e.g. UTC datetimes, JSON)."""
    return text(sql).bindparams(*(bindparam(c.name, type_=c.type) for c in table.columns if f":{c.name}" in sql))


# INSERT ... ON CONFLICT as text, in the syntax SQLite and PostgreSQL share: the dialects'
# insert().on_conflict_*() constructs are not cacheable, and compiling them on every snapshot
# cost more than executing them.
_snaps = HostSnapshot.__table__
_CLAIM = _typed_text(
    "INSERT INTO host_snapshots (host_id, agent_instance, seq, collected_at, received_at) "
    "VALUES (:host_id, :agent_instance, :seq, :collected_at, :received_at) "
    "ON CONFLICT (host_id, agent_instance, seq) DO NOTHING RETURNING id", _snaps)
_rollups = UsageRollup.__table__
_ROLLUP = _typed_text(
    "INSERT INTO usage_rollups (device_id, minute, samples, utilization_sum, utilization_samples, memory_used_sum_mib, "
    "memory_samples, users) VALUES (:device_id, :minute, :samples, :utilization_sum, :utilization_samples, "
    ":memory_used_sum_mib, :memory_samples, :users) "
    "ON CONFLICT (device_id, minute) DO UPDATE SET samples = usage_rollups.samples + excluded.samples, "
    "utilization_sum = usage_rollups.utilization_sum + excluded.utilization_sum, "
    "utilization_samples = usage_rollups.utilization_samples + excluded.utilization_samples, "
    "memory_used_sum_mib = usage_rollups.memory_used_sum_mib + excluded.memory_used_sum_mib, "
    "memory_samples = usage_rollups.memory_samples + excluded.memory_samples, users = excluded.users", _rollups)


def _rollup(snap: Snapshot, devices: dict[str, ingest_state.DeviceRef], at: datetime,
            batch: ingest_state.BatchRows) -> None:
    """Gather the snapshot's healthy devices' per-minute rollups in ``batch``, for
    :func:`write_batch` to add in one upsert with a parameter set per device."""
    if snap.stale:
        return
    minute = at.replace(second=0, microsecond=0)
    users_by_dev: dict[str, set[str]] = {}
    for p in snap.processes:
        if p.unix_user:
            users_by_dev.setdefault(p.device_uuid, set()).add(p.unix_user)
    values = []
    for rep in snap.devices:
        if rep.health != "ok":
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
    batch.rollups.extend(values)


def write_batch(session: Session, batch: ingest_state.BatchRows) -> None:
    """The writes a batch's snapshots gathered (:class:`ingest_state.BatchRows`): once the
    batch's snapshots are ingested, before its commit."""
    if batch.rollups:
        session.execute(_ROLLUP, batch.rollups)
    checkin.mark_checked_in(session, batch.check_ins)


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
    claimed = session.execute(_CLAIM, dict(
        host_id=host.id, agent_instance=instance, seq=snap.seq, collected_at=snap.collected_at, received_at=now,
    )).first()
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


def ingest_snapshot(session: Session, *, host: Host, snap: Snapshot, settings: Settings, now: datetime | None = None,
                    batch: ingest_state.BatchRows | None = None) -> SnapshotAck:
    """Store a snapshot of ``host`` and answer with its reservation table and policy.

    Idempotent by ``(host, agent_instance, seq)``: a replayed key changes nothing and answers
    ``duplicate=true`` (with ``conflict`` set, and an error logged, when the stored snapshot
    under that key is a different one). A snapshot older than the host's latest (spool replay
    after an outage) adds its findings and rollups but does not overwrite the latest state.
    Devices registered to another host are refused for this snapshot.
    ``batch``: the batch this snapshot is ingested in (:func:`ingest_state.batch_rows`), whose
    rows it uses and where its rollups and check-ins are gathered for the batch's
    :func:`write_batch`; without one, the snapshot is a batch of its own, read and written here.
    Either way the rows are read before the snapshot's writes (which change none of them but a
    device's index, see below).
    Raises Forbidden when ``snap.host`` is not the token's host.
    """
    now = now or utcnow()
    host_service.require_same_host(host, snap.host)
    claimed, conflict = _claim(session, host=host, snap=snap, now=now)
    if not claimed:
        return build_ack(session, host=host, seq=snap.seq, duplicate=True, settings=settings, now=now, conflict=conflict,
                         rows=batch.acks[host.id] if batch else None)

    trouble = clock_trouble(snap, now=now, settings=settings)
    at = snap.collected_at
    host_values: dict[str, object] = {}
    if trouble is not None:
        log.warning("host %s: clock trouble: %s; filed under its time of receipt", host.name, trouble)
        host_values.update(clock_trouble=trouble[:512], clock_trouble_at=now)
        at = now
    uuids = ingest_state.snapshot_uuids(snap)
    alone = batch is None
    if alone:
        batch = ingest_state.batch_rows(session, [host.id], uuids, now)
    stored = batch.devices_of(uuids)
    if any(row[2] != host.id for row in stored):
        snap = device_claims.refuse_foreign_devices(session, host=host, snap=snap, now=now)
        stored = [row for row in stored if row[2] == host.id]
    if trouble is not None and snap.collected_at > now:
        # finding times from the same clock would outrank every later report of the finding
        snap = snap.model_copy(update={"findings": [
            f.model_copy(update={"first_seen": min(f.first_seen, now), "last_seen": min(f.last_seen, now)})
            for f in snap.findings]})
    touches = ingest_state.Touches(now=now)
    devices = ingest_state.upsert_devices(session, host, snap, stored, now, touches)
    # Latest by collection time, not seq: a spooled backlog replays older snapshots after newer ones may
    # have been posted, and an agent whose state was wiped restarts its seq.
    is_latest = host.last_collected_at is None or at >= host.last_collected_at
    host_values["last_seen_at"] = now  # the agent is alive: staleness goes by receipt
    if is_latest:
        ingest_state.store_latest(session, host, snap, devices, at, stored, touches, batch.processes[host.id])
        host_values.update(
            last_seq=snap.seq, last_collected_at=at, interval_seconds=snap.interval_seconds,
            agent_version=snap.agent_version, driver_version=snap.driver_version, nvml_version=snap.nvml_version,
            cuda_version=snap.cuda_version, source=snap.source, replay_of=snap.replay_of,
            monitoring_status=snap.monitoring.status, monitoring_message=snap.monitoring.message, stale=snap.stale,
            suspect=snap.suspect, suspect_reasons=snap.suspect_reasons or None, clock_offset_s=snap.clock_offset_s,
        )
    ingest_state.update_host(session, host, host_values, touches)
    if is_latest:
        occupied.record_warnings(session, host=host, snap=snap, devices=devices, now=now)  # type: ignore[arg-type]
        # health quarantine: reads the database only when a device shows a critical condition
        # or the host is already watched, writes only when the health state changes
        quarantine.apply_snapshot(session, host=host, snap=snap, devices=devices, now=now, settings=settings)
        if snap.processes and not snap.stale:
            batch.check_ins.append((host.id, at))
    _rollup(snap, devices, at, batch)
    findings_service.record_findings(session, host=host, reports=snap.findings, now=now, settings=settings)
    if alone:
        write_batch(session, batch)
    # the ack rows were read before this snapshot's writes: read again if it moved a device's index
    fresh = ingest_state.reindexed(snap, stored)
    return build_ack(session, host=host, seq=snap.seq, duplicate=False, settings=settings, now=now,
                     rows=None if fresh else batch.acks[host.id])


def prune(session: Session, *, settings: Settings, now: datetime | None = None) -> None:
    """Drop idempotency keys and rollups older than their retention windows."""
    now = now or utcnow()
    session.execute(delete(HostSnapshot).where(HostSnapshot.received_at < now - timedelta(days=settings.snapshot_seq_retention_days)))
    session.execute(delete(UsageRollup).where(UsageRollup.minute < now - timedelta(days=settings.rollup_retention_days)))

