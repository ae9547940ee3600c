"""Prometheus metrics built from the database at scrape time.

Nothing here lives in a process's memory: every scrape reads the latest state that ingest
stored (hosts, devices, ``device_telemetry``, ``device_processes``) and counts rows for the
counters, so any app process (of any number of workers or replicas) answers the same, and
a device or process that vanished from its host's latest snapshot has no series at all
(never a stale last value). Devices of a host whose agent went stale (no snapshot for
``STALE_INTERVALS`` intervals) are left out too; ``gpuroster_host_up`` and
``gpuroster_host_seconds_since_snapshot`` say why.

Units follow Prometheus conventions: bytes, seconds, degrees Celsius, watts, percent (0-100
as NVML reports it). A value NVML could not give (``None``) has no sample; it is never 0.

Counters are row counts: ``reservations`` (rows are never deleted: cancelling changes a
row's state), ``findings``, ``notices``, and booking conflicts, which leave no reservation
row behind and so are recorded as ``audit_log`` rows with action
:data:`CONFLICT_ACTION` (see :func:`record_conflict`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString
from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from app.models import (
    AuditLog,
    Device,
    DeviceProcess,
    DeviceTelemetry,
    Finding,
    Host,
    Notice,
    Reservation,
)
from app.models.states import LIVE_FINDING_STATES, HostStatus
from app.services.audit import record_audit
from app.services.conflicts import holders_at
from app.services.devices import host_status
from app.services.quarantined import open_by_device

MIB = 1024 * 1024
CONFLICT_ACTION = "reservation.conflict"
DEVICE_LABELS = ("host", "index", "uuid", "model", "holder")
PROCESS_LABELS = ("host", "uuid", "pid", "user", "name")
NOT_UP = (HostStatus.STALE, HostStatus.NEVER, HostStatus.DOWN, HostStatus.MISCONFIGURED)


def record_conflict(session: Session, *, path: str, conflicts: list[int], detail: str) -> None:
    """Record one refused booking (a 409 reservation conflict) as an ``audit_log`` row.

    Called in a transaction of its own after the request's transaction was rolled back, so
    the count survives the refusal. ``conflicts``: ids of the reservations in the way.
    """
    record_audit(session, actor="system", action=CONFLICT_ACTION, target=path[:256],
                 detail={"conflicts": conflicts, "detail": detail[:512]})


def device_index_label(device: Device | Row, parents: dict[int, Device | Row]) -> str:
    """The ``index`` label: NVML index of a whole GPU (``"0"``); for a MIG instance the
    parent's index and the GPU-instance id (``"0/3"``). Takes devices or rows of their
    columns (``parent_id``, ``index``, ``gpu_instance_id``)."""
    if device.parent_id is None:
        return "" if device.index is None else str(device.index)
    parent = parents.get(device.parent_id)
    p = "" if parent is None or parent.index is None else str(parent.index)
    gi = device.gpu_instance_id if device.gpu_instance_id is not None else device.index
    return f"{p}/{'' if gi is None else gi}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


class TextGauge:
    """A gauge family written straight in the text exposition format, for the per-device and
    per-process families of a large lab (tens of thousands of samples).

    prometheus_client validates and builds a ``Sample`` per ``add_metric`` and formats each
    sample again at exposition; for 8,000 devices that was most of a scrape. The lines are
    the ones ``generate_latest`` writes (same escaping, same number format: the library's
    ``floatToGoString``); :meth:`DatabaseCollector.exposition` puts them in order.
    """

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        # the exposition lists labels sorted by name
        self._order = sorted(range(len(labels)), key=lambda i: labels[i])
        self._prefixes = [f'{labels[i]}="' for i in self._order]
        self._lines: list[str] = []

    def add_metric(self, labels: tuple[str, ...], value: float) -> None:
        """One sample: label values in the order of ``labels``, the value as a float."""
        if len(labels) != len(self._order):
            raise ValueError(f"{self.name}: {len(self._order)} label values expected, got {len(labels)}")
        pairs = ",".join(p + _escape(labels[i]) + '"' for p, i in zip(self._prefixes, self._order, strict=True))
        self._lines.append(f"{self.name}{{{pairs}}} {floatToGoString(value)}\n")

    def text(self) -> str:
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        return f"# HELP {self.name} {doc}\n# TYPE {self.name} gauge\n" + "".join(self._lines)


class _Families:
    """The registry protocol (``collect()``) over given families, for ``generate_latest``."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


DEVICE_FAMILIES = (
    ("gpuroster_device_utilization_percent", "GPU utilization, percent (0-100)"),
    ("gpuroster_device_memory_used_bytes", "device memory in use, bytes"),
    ("gpuroster_device_memory_total_bytes", "device memory, bytes"),
    ("gpuroster_device_temperature_celsius", "GPU temperature, degrees Celsius"),
    ("gpuroster_device_power_watts", "power draw, watts"),
)
"""(name, help) of the per-device gauge families, in exposition order."""


def host_families(hosts: list, up: set[int], now: datetime) -> list[TextGauge]:
    """``gpuroster_host_up``, ``..._seconds_since_snapshot`` and ``..._clock_offset_seconds``
    of ``hosts`` (anything with ``id``, ``name``, ``source``, ``last_seen_at``,
    ``clock_offset_s``) by name; ``up``: the ids of hosts that are up at ``now`` (UTC)."""
    host_up = TextGauge("gpuroster_host_up", "1 when the host's agent reports within its stale window "
                        "and NVML works, else 0", ("host", "source"))
    host_age = TextGauge("gpuroster_host_seconds_since_snapshot",
                         "seconds since the service last received a snapshot from the host", ("host",))
    host_clock = TextGauge("gpuroster_host_clock_offset_seconds",
                           "the service's clock minus the host's, as the agent measured it", ("host",))
    for h in sorted(hosts, key=lambda h: h.name):
        host_up.add_metric((h.name, h.source or ""), 1.0 if h.id in up else 0.0)
        if h.last_seen_at is not None:
            host_age.add_metric((h.name,), max(0.0, (now - h.last_seen_at).total_seconds()))
        if h.clock_offset_s is not None:
            host_clock.add_metric((h.name,), h.clock_offset_s)
    return [host_up, host_age, host_clock]


def counter_families(s: Session, hosts: dict) -> list[Metric]:
    """The row-count counters (reservations, refused bookings, findings by kind, notices by
    channel) and the open findings per host (``hosts``: id -> anything with ``name``).
    Five statements; the refused bookings walk ``ix_audit_log_action``."""
    out: list[Metric] = [
        CounterMetricFamily("gpuroster_reservations_created", "reservations booked (all states)",
                            value=s.scalar(select(func.count()).select_from(Reservation)) or 0),
        CounterMetricFamily(
            "gpuroster_reservation_conflicts", "bookings refused with 409 because the devices were reserved",
            value=s.scalar(select(func.count()).select_from(AuditLog).where(AuditLog.action == CONFLICT_ACTION)) or 0,
        ),
    ]
    findings = CounterMetricFamily("gpuroster_findings", "findings reported by agents, by kind", labels=("kind",))
    for kind, n in sorted(s.execute(select(Finding.kind, func.count()).group_by(Finding.kind)).all()):
        findings.add_metric((kind,), n)
    notices = CounterMetricFamily("gpuroster_notices", "notices sent about findings, by channel", labels=("channel",))
    for channel, n in sorted(s.execute(select(Notice.channel, func.count()).group_by(Notice.channel)).all()):
        notices.add_metric((channel,), n)
    open_by: dict[tuple[str, str], int] = defaultdict(int)
    for host_id, kind, n in s.execute(
        select(Finding.host_id, Finding.kind, func.count())
        .where(Finding.state.in_(LIVE_FINDING_STATES))
        .group_by(Finding.host_id, Finding.kind)
    ):
        if host_id in hosts:
            open_by[(hosts[host_id].name, kind)] += n
    open_f = GaugeMetricFamily("gpuroster_findings_open", "findings still open or notified", labels=("host", "kind"))
    for (host, kind), n in sorted(open_by.items()):
        open_f.add_metric((host, kind), n)
    return [*out, findings, notices, open_f]


class DatabaseCollector:
    """A ``prometheus_client`` collector reading the latest state through ``session`` at ``now``.

    Register it on a fresh ``CollectorRegistry`` per scrape (it holds the request's session).
    """

    def __init__(self, session: Session, *, now: datetime) -> None:
        self.session = session
        self.now = now

    # -- helpers ---------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The scrape in the Prometheus text format (``CONTENT_TYPE_LATEST``): the families of
        :meth:`collect` in order, :class:`TextGauge` ones as written, the others through
        ``prometheus_client.generate_latest``."""
        parts: list[bytes] = []
        pending: list[Metric] = []
        for fam in self.collect():
            if isinstance(fam, TextGauge):
                if pending:
                    parts.append(generate_latest(_Families(pending)))  # type: ignore[arg-type]
                    pending = []
                parts.append(fam.text().encode())
            else:
                pending.append(fam)
        if pending:
            parts.append(generate_latest(_Families(pending)))  # type: ignore[arg-type]
        return b"".join(parts)

    # -- the collector protocol ------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Yield every gpuroster metric family for the current database state."""
        s, now = self.session, self.now
        hosts = {h.id: h for h in s.scalars(select(Host))}
        up_hosts = {hid for hid, h in hosts.items() if host_status(h, now)[0] not in NOT_UP}

        yield from host_families(list(hosts.values()), up_hosts, now)

        # Devices in their host's latest snapshot: telemetry written by that very snapshot.
        # Plain rows (named like the model attributes), not ORM objects: a large lab has
        # thousands of devices and the scrape reads each once.
        dev_cols = (Device.id, Device.uuid, Device.host_id, Device.index, Device.name, Device.parent_id,
                    Device.gpu_instance_id, Device.memory_total_mib)
        rows = s.execute(
            select(*dev_cols, DeviceTelemetry.utilization_gpu, DeviceTelemetry.memory_used_mib,
                   DeviceTelemetry.temperature_c, DeviceTelemetry.power_draw_w)
            .join(DeviceTelemetry, DeviceTelemetry.device_id == Device.id)
            .join(Host, Host.id == Device.host_id)
            .where(Device.retired_at.is_(None), DeviceTelemetry.collected_at == Host.last_collected_at)
        ).all()
        rows = [(r, r) for r in rows if r.host_id in up_hosts]
        devices = {d.id: d for d, _ in rows}
        missing_parents = {d.parent_id for d in devices.values() if d.parent_id and d.parent_id not in devices}
        parents = dict(devices)
        if missing_parents:
            parents.update({d.id: d for d in s.execute(select(*dev_cols).where(Device.id.in_(missing_parents)))})
        holders = {dev_id: h.reservation.user.username
                   for dev_id, h in holders_at(s, devices=list(devices.values()), at=now).items()}

        util, mem_used, mem_total, temp, power = (TextGauge(name, doc, DEVICE_LABELS) for name, doc in DEVICE_FAMILIES)
        for d, t in sorted(rows, key=lambda r: (hosts[r[0].host_id].name, r[0].uuid)):
            labels = (hosts[d.host_id].name, device_index_label(d, parents), d.uuid, d.name or "", holders.get(d.id, ""))
            if t.utilization_gpu is not None:
                util.add_metric(labels, t.utilization_gpu)
            if t.memory_used_mib is not None:
                mem_used.add_metric(labels, t.memory_used_mib * MIB)
            if d.memory_total_mib is not None:
                mem_total.add_metric(labels, d.memory_total_mib * MIB)
            if t.temperature_c is not None:
                temp.add_metric(labels, t.temperature_c)
            if t.power_draw_w is not None:
                power.add_metric(labels, t.power_draw_w)
        yield from (util, mem_used, mem_total, temp, power)
        yield from self._quarantines(rows, hosts, parents, holders)

        proc_mem = TextGauge("gpuroster_process_memory_used_bytes",
                                     "device memory used by a process in its host's latest snapshot, bytes",
                                     PROCESS_LABELS)
        if devices:
            procs = s.execute(
                select(DeviceProcess.device_id, DeviceProcess.pid, DeviceProcess.unix_user, DeviceProcess.name,
                       DeviceProcess.used_memory_mib)
                .where(DeviceProcess.device_id.in_(list(devices)))
                .order_by(DeviceProcess.device_id, DeviceProcess.pid)
            ).all()
            for dev_id, pid, user, name, used in procs:
                if used is None:
                    continue
                d = devices[dev_id]
                proc_mem.add_metric((hosts[d.host_id].name, d.uuid, str(pid), user or "", name or ""), used * MIB)
        yield proc_mem

        yield from counter_families(s, hosts)

    def _quarantines(self, rows: list, hosts: dict, parents: dict, holders: dict) -> Iterator[Metric]:
        """Health state per device: ``gpuroster_device_quarantined`` 1/0 for the devices of up
        hosts (and 1 for a quarantined device of a host that is not up), and one
        ``gpuroster_device_health_condition`` series per condition of an open quarantine."""
        found = open_by_device(self.session)
        gauge = TextGauge("gpuroster_device_quarantined", "1 when the device is quarantined for a health reason, else 0",
                          DEVICE_LABELS)
        cond = GaugeMetricFamily("gpuroster_device_health_condition", "1 per critical condition of a quarantined device",
                                 labels=("host", "uuid", "kind"))
        shown = set()
        for d, _t in sorted(rows, key=lambda r: (hosts[r[0].host_id].name, r[0].uuid)):
            shown.add(d.id)
            labels = (hosts[d.host_id].name, device_index_label(d, parents), d.uuid, d.name or "", holders.get(d.id, ""))
            gauge.add_metric(labels, 1.0 if d.id in found else 0.0)
        others = [i for i in found if i not in shown]
        if others:
            for d in self.session.scalars(select(Device).where(Device.id.in_(others))):
                gauge.add_metric((hosts[d.host_id].name, "" if d.index is None else str(d.index), d.uuid, d.name or "", ""),
                                 1.0)
        uuids = dict(self.session.execute(select(Device.id, Device.uuid).where(Device.id.in_(list(found)))).all()) if found else {}
        for dev_id, q in sorted(found.items()):
            for kind in sorted({c["kind"] for c in q.conditions}):
                cond.add_metric((hosts[q.host_id].name, uuids[dev_id], kind), 1.0)
        yield gauge
        yield cond


__all__ = ["CONFLICT_ACTION", "DEVICE_FAMILIES", "DatabaseCollector", "TextGauge", "counter_families", "device_index_label",
           "host_families", "record_conflict"]
