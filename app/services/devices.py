"""The lab's current state: hosts and devices with telemetry, processes, holders."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from app.i18n import gettext
from app.errors import NotFound
from app.models import (
    Device, DeviceProcess, DeviceQuarantine, DeviceTelemetry, Finding, Host, Reservation, User,
)
from app.models.states import LIVE_FINDING_STATES, DeviceStatus, HostStatus
from app.schemas.host import DeviceRead, HolderRead, HostRead, ProcessRead, QuarantineRef, TelemetryRead
from app.services.conflicts import holder_at, holdings
from app.services.device_names import device_label
from app.services.quarantined import open_by_device, quarantine_of
from app.services.audit import record_audit

STALE_INTERVALS = 3  # no snapshot for three intervals: the agent is stale
CLOCK_TROUBLE_SHOWN = timedelta(days=1)  # an implausible collected_at stays on the host this long


def host_status(host: Host, now: datetime) -> tuple[str, float | None]:
    """(status, seconds since the last snapshot): never / stale / the agent's monitoring status."""
    return host_state(host.last_seen_at, host.interval_seconds, host.monitoring_status, now)


def host_state(last_seen_at: datetime | None, interval_seconds: float | None, monitoring_status: str | None,
               now: datetime) -> tuple[str, float | None]:
    """:func:`host_status` from the host's columns (UTC instants, seconds)."""
    if last_seen_at is None:
        return HostStatus.NEVER, None
    age = (now - last_seen_at).total_seconds()
    if age > STALE_INTERVALS * (interval_seconds or 5.0) + 5:
        return HostStatus.STALE, age
    return (monitoring_status or "ok"), age


def agent_quiet(last_seen_at: datetime | None, interval_seconds: float | None, monitoring_status: str | None,
                now: datetime) -> bool:
    """True when the host's agent has never reported or has gone stale (:func:`host_state`):
    its last telemetry says nothing of now, and the host may be down."""
    return host_state(last_seen_at, interval_seconds, monitoring_status, now)[0] in (HostStatus.NEVER, HostStatus.STALE)


def host_read(host: Host, *, now: datetime, device_count: int) -> HostRead:
    status, age = host_status(host, now)
    return HostRead(
        name=host.name, policy=host.policy, grace_seconds=host.grace_seconds,
        kill_timeout_seconds=host.kill_timeout_seconds, notice_interval_seconds=host.notice_interval_seconds,
        min_uid=host.min_uid, exempt_users=list(host.exempt_users or []),
        exempt_process_names=list(host.exempt_process_names) if host.exempt_process_names is not None else None,
        idle_minutes=host.idle_minutes, last_seen_at=host.last_seen_at, seconds_since_snapshot=age, status=status,
        monitoring_message=host.monitoring_message, source=host.source, replay_of=host.replay_of,
        agent_version=host.agent_version, driver_version=host.driver_version, cuda_version=host.cuda_version,
        suspect=host.suspect, suspect_reasons=host.suspect_reasons, device_count=device_count,
        clock_offset_s=host.clock_offset_s,
        clock_trouble=host.clock_trouble if host.clock_trouble_at and now - host.clock_trouble_at < CLOCK_TROUBLE_SHOWN else None,
    )


def get_host_read(session: Session, *, name: str, now: datetime) -> HostRead:
    """One host's view; raises NotFound."""
    host = session.scalar(select(Host).where(Host.name == name))
    if host is None:
        raise NotFound(f"host {name!r} not found", field="host")
    n = session.scalar(select(func.count()).select_from(Device).where(Device.host_id == host.id, Device.retired_at.is_(None)))
    return host_read(host, now=now, device_count=n or 0)


def list_hosts(session: Session, *, now: datetime) -> list[HostRead]:
    hosts = list(session.scalars(select(Host).order_by(Host.name)))
    counts: dict[int, int] = defaultdict(int)
    for hid in session.scalars(select(Device.host_id).where(Device.retired_at.is_(None))):
        counts[hid] += 1
    return [host_read(h, now=now, device_count=counts[h.id]) for h in hosts]


@dataclass
class DeviceView:
    """Everything a page or the API shows about one device right now."""

    device: Device
    host: Host
    telemetry: DeviceTelemetry | None
    processes: list[DeviceProcess] = field(default_factory=list)
    holder: Reservation | None = None
    next_reservation: Reservation | None = None
    finding_pids: dict[int, str] = field(default_factory=dict)
    status: str = DeviceStatus.FREE
    uid_names: dict[int, str] = field(default_factory=dict)
    # the open health quarantine keeping it from booking (its own, or its GPU's for a MIG instance)
    quarantine: DeviceQuarantine | None = None

    def owner_label(self, p: DeviceProcess) -> str:
        """Who ``p`` is shown as (see :func:`owner_label`)."""
        return owner_label(p.unix_user, p.owner_status, p.uid, self.uid_names)


def owner_label(unix_user: str | None, owner_status: str | None, uid: int | None, uid_names: dict[int, str]) -> str:
    """Who a process is shown as: its user; a uid without a passwd entry on the host through the
    users' Unix uids (``uid_names``: uid -> username); or the state of an owner nobody can name.
    In the current locale (:mod:`app.i18n`; English outside a page)."""
    if owner_status == "uid_only":
        name = uid_names.get(uid) if uid is not None else None
        return f"{name} (uid {uid})" if name else gettext("uid %(uid)s, unknown to gpuroster", uid=uid)
    if owner_status == "unattributed":
        return gettext("unattributed container")
    return unix_user or gettext("unknown")


def _device_status(v: DeviceView, host_state: str) -> str:
    return device_status(
        retired=v.device.retired_at is not None,
        lost=v.telemetry is not None and v.telemetry.health == "lost",
        host_state=host_state,
        has_finding=bool(v.finding_pids),
        computing=any(process_occupies(p.unix_user, p.owner_status, p.type) for p in v.processes),
        held=v.holder is not None,
        process_data=v.telemetry.process_data if v.telemetry is not None else "ok",
    )


def process_occupies(unix_user: str | None, owner_status: str | None, type_: str | None) -> bool:
    """Whether a listed process makes its device "in use": a compute process of a known user,
    or one whose owner nobody can name (a uid without a user, an unattributed container)."""
    return type_ != "G" and (bool(unix_user) or owner_status in ("uid_only", "unattributed"))


def device_status(*, retired: bool, lost: bool, host_state: str, has_finding: bool, computing: bool, held: bool,
                  process_data: str = "ok") -> str:
    """A device's status for pages and the API, first match wins: retired, lost, stale
    (host never seen or stale), monitoring-down, occupied-unlisted (memory held by a process
    NVML does not list, or a defunct one: never "free"), unreliable (the process list
    disagrees with the memory figures), finding, in-use (a compute process, also one whose
    owner nobody can name), reserved-idle, free."""
    if retired:
        return DeviceStatus.RETIRED
    if lost:
        return DeviceStatus.LOST
    if host_state in (HostStatus.STALE, HostStatus.NEVER):
        return DeviceStatus.STALE
    if host_state in (HostStatus.DOWN, HostStatus.MISCONFIGURED):
        return DeviceStatus.MONITORING_DOWN
    if process_data in ("unlisted", "defunct"):
        return DeviceStatus.OCCUPIED_UNLISTED  # memory in use by a process NVML does not list: never "free"
    if process_data == "unreliable":
        return DeviceStatus.UNRELIABLE
    if has_finding:
        return DeviceStatus.FINDING
    if computing:
        return DeviceStatus.IN_USE
    if held:
        return DeviceStatus.RESERVED_IDLE
    return DeviceStatus.FREE


def device_views(
    session: Session, *, now: datetime, host_names: list[str] | None = None, uuids: list[str] | None = None
) -> list[DeviceView]:
    """Non-retired devices (all, of ``host_names``, or the given ``uuids`` retired or not) with
    their latest state, ordered by host and index."""
    q = select(Device).options(selectinload(Device.host))
    if uuids is not None:
        q = q.where(Device.uuid.in_(uuids))
    else:
        q = q.where(Device.retired_at.is_(None))
    if host_names:
        q = q.join(Host, Host.id == Device.host_id).where(Host.name.in_(host_names))
    devices = list(session.scalars(q))
    if not devices:
        return []
    ids = [d.id for d in devices]
    tele = {t.device_id: t for t in session.scalars(select(DeviceTelemetry).where(DeviceTelemetry.device_id.in_(ids)))}
    procs: dict[int, list[DeviceProcess]] = defaultdict(list)
    for p in session.scalars(select(DeviceProcess).where(DeviceProcess.device_id.in_(ids)).order_by(DeviceProcess.pid)):
        procs[p.device_id].append(p)
    bare_uids = {p.uid for ps in procs.values() for p in ps if p.owner_status == "uid_only" and p.uid is not None}
    uid_names = dict(session.execute(select(User.unix_uid, User.username).where(User.unix_uid.in_(bare_uids))).all()) \
        if bare_uids else {}
    # the rule the booking check applies: a whole GPU and its MIG slices hold each other
    held = holdings(session, devices=devices, start=now, end=datetime.max.replace(tzinfo=UTC))
    open_findings: dict[int, dict[int, str]] = defaultdict(dict)
    for f in session.scalars(select(Finding).where(Finding.device_id.in_(ids), Finding.state.in_(LIVE_FINDING_STATES))):
        if f.pid is not None:
            open_findings[f.device_id][f.pid] = f.kind
    quarantines = open_by_device(session, set(ids) | {d.parent_id for d in devices})
    out = []
    for d in devices:
        v = DeviceView(device=d, host=d.host, telemetry=tele.get(d.id), processes=procs.get(d.id, []),
                       finding_pids=open_findings.get(d.id, {}), uid_names=uid_names,
                       quarantine=quarantine_of(quarantines, d))
        found = held.get(d.id, [])
        current = holder_at(found, now)
        v.holder = current.reservation if current is not None else None
        v.next_reservation = next((h.reservation for h in found if h.reservation.start_at > now), None)
        v.status = _device_status(v, host_status(d.host, now)[0])
        out.append(v)
    out.sort(key=lambda v: (v.host.name, v.device.index if v.device.index is not None else 1 << 30, v.device.parent_id or 0, v.device.gpu_instance_id or 0))
    return out


def _holder(r: Reservation | None) -> HolderRead | None:
    if r is None:
        return None
    return HolderRead(reservation_id=r.id, user=r.user.username, start=r.start_at, end=r.end_at)


def to_device_read(v: DeviceView, parents: dict[int, Device]) -> DeviceRead:
    """The API's view of one device; ``parents``: whole GPUs by id (for a MIG slice's name)."""
    t = v.telemetry
    parent = parents.get(v.device.parent_id) if v.device.parent_id else None
    return DeviceRead(
        uuid=v.device.uuid, host=v.host.name, index=v.device.index, label=device_label(v.device, parent),
        name=v.device.name, pci_bus_id=v.device.pci_bus_id,
        memory_total_mib=v.device.memory_total_mib, parent_uuid=parent.uuid if parent is not None else None,
        mig_profile=v.device.mig_profile, is_open=v.device.is_open, retired=v.device.retired_at is not None,
        quarantine=QuarantineRef(reason=v.quarantine.reason, since=v.quarantine.started_at,
                                 self_clearing=v.quarantine.self_clearing) if v.quarantine is not None else None,
        last_seen_at=v.device.last_seen_at,
        telemetry=TelemetryRead.model_validate(t, from_attributes=True) if t is not None else None,
        processes=[
            ProcessRead(pid=p.pid, type=p.type, used_memory_mib=p.used_memory_mib, unix_user=p.unix_user, uid=p.uid,
                        command=p.command, name=p.name, container_id=p.container_id, owner_status=p.owner_status,
                        owner=v.owner_label(p), finding=v.finding_pids.get(p.pid))
            for p in v.processes
        ],
        holder=_holder(v.holder), next_reservation=_holder(v.next_reservation), status=v.status,
    )


def list_devices(session: Session, *, now: datetime, host: str | None = None) -> list[DeviceRead]:
    return _reads(session, device_views(session, now=now, host_names=[host] if host else None))


def _reads(session: Session, views: list[DeviceView]) -> list[DeviceRead]:
    parents = {v.device.id: v.device for v in views}
    missing = {v.device.parent_id for v in views if v.device.parent_id and v.device.parent_id not in parents}
    if missing:
        parents.update({d.id: d for d in session.scalars(select(Device).where(Device.id.in_(missing)))})
    return [to_device_read(v, parents) for v in views]


def get_device_read(session: Session, *, uuid: str, now: datetime) -> DeviceRead:
    """One device's view (retired ones too); raises NotFound."""
    views = device_views(session, now=now, uuids=[uuid])
    if not views:
        raise NotFound(f"device {uuid!r} not found", field="uuid")
    return _reads(session, views)[0]


def update_device(session: Session, *, uuid: str, retired: bool | None, is_open: bool | None, actor: str, now: datetime) -> Device:
    dev = session.scalar(select(Device).where(Device.uuid == uuid))
    if dev is None:
        raise NotFound(f"device {uuid!r} not found", field="uuid")
    if retired is not None:
        dev.retired_at = now if retired else None
    if is_open is not None:
        dev.is_open = is_open
    record_audit(session, actor=actor, action="device.update", target=f"device:{uuid}", detail={"retired": retired, "is_open": is_open})
    return dev
