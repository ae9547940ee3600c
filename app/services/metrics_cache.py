"""``GET /metrics`` of a large lab from text reused between snapshots.

The scrape of 1,000 hosts x 8 GPUs wrote about 100,000 lines, nearly all of them the same
as the scrape before: a device's gauges change with its host's snapshot, its ``holder``
label with bookings, its quarantine gauge with quarantines. A :class:`MetricsCache` keeps,
per host, what its snapshot gives (the devices in that snapshot, their label values and the
process lines) under the host's snapshot version and the lab-wide key of the Now page
(:func:`app.services.now_state.lab_key`), and the finished per-device lines under that,
the holders (:mod:`app.services.lab_holds`) and the open quarantines of its devices.
Host freshness, counters and quarantine conditions are read and written on every scrape.

The exposition is the one :meth:`app.services.metrics.DatabaseCollector.exposition`
writes for the same database state and instant, byte for byte (a test compares them).
"""

from __future__ import annotations

import threading
from collections import namedtuple
from datetime import datetime

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Device, DeviceProcess, DeviceTelemetry, Host
from app.services.devices import host_state
from app.services.lab_holds import HoldsCache
from app.services.metrics import (
    DEVICE_LABELS,
    DEVICE_FAMILIES,
    MIB,
    NOT_UP,
    PROCESS_LABELS,
    TextGauge,
    _Families,
    counter_families,
    device_index_label,
    host_families,
)
from app.services.now_state import lab_key
from app.services.quarantined import open_by_device

_HOST = ("id", "name", "source", "last_seen_at", "last_seq", "last_collected_at", "interval_seconds",
         "monitoring_status", "clock_offset_s")
ScrapeHost = namedtuple("ScrapeHost", _HOST)
_DEV = (Device.id, Device.uuid, Device.host_id, Device.index, Device.name, Device.parent_id, Device.gpu_instance_id,
        Device.memory_total_mib)


class _Snap:
    """One host's devices in its latest snapshot: (device id, label values without the
    holder, values of the five device families) by uuid, and each device's process lines."""

    __slots__ = ("devices", "procs", "version")

    def __init__(self, version: tuple, devices: list[tuple], procs: dict[int, str]) -> None:
        self.version, self.devices, self.procs = version, devices, procs


class MetricsCache:
    """Per process, per application (see the module docstring); bounded by the number of
    hosts; thread-safe (two scrapes building the same host at once both build it)."""

    def __init__(self, holds: HoldsCache | None = None) -> None:
        self.holds = holds or HoldsCache()
        self._lock = threading.Lock()
        self._lab: tuple | None = None
        self._snaps: dict[int, _Snap] = {}
        self._live: dict[int, tuple[tuple, list[str]]] = {}
        self.snap_misses = 0

    def exposition(self, session: Session, *, now: datetime) -> bytes:
        """The scrape at ``now`` (UTC) in the Prometheus text format (``CONTENT_TYPE_LATEST``)."""
        hosts = [ScrapeHost._make(r) for r in session.execute(select(*(getattr(Host, c) for c in _HOST)))]
        by_id = {h.id: h for h in hosts}
        up = {h.id for h in hosts
              if host_state(h.last_seen_at, h.interval_seconds, h.monitoring_status, now)[0] not in NOT_UP}
        lab = lab_key(session)
        holds = self.holds.read(session, now=now, lab=lab)
        quarantines = open_by_device(session)
        with self._lock:
            if lab != self._lab:
                self._lab, self._snaps, self._live = lab, {}, {}
            snaps = {hid: self._snaps.get(hid) for hid in up}
        stale = [by_id[hid] for hid, s in snaps.items() if s is None or s.version != _version(by_id[hid])]
        if stale:
            self.snap_misses += len(stale)
            fresh = _read_snaps(session, stale)
            snaps.update(fresh)
            with self._lock:
                if lab == self._lab:
                    self._snaps.update(fresh)
        ordered = sorted((by_id[hid] for hid in up), key=lambda h: h.name)
        chunks = [self._finished(h, snaps[h.id], holds.current, quarantines) for h in ordered]  # type: ignore[arg-type]

        parts = [f.text().encode() for f in host_families(hosts, up, now)]
        for i, (name, doc) in enumerate(DEVICE_FAMILIES):
            parts.append((TextGauge(name, doc, DEVICE_LABELS).text() + "".join(c[i] for c in chunks)).encode())
        parts.append(self._quarantines(session, hosts=by_id, chunks=chunks, shown={
            d[0] for h in ordered for d in snaps[h.id].devices}, quarantines=quarantines))  # type: ignore[union-attr]
        shown = sorted((dev_id, text) for h in ordered for dev_id, text in snaps[h.id].procs.items())  # type: ignore[union-attr]
        proc = TextGauge("gpuroster_process_memory_used_bytes",
                         "device memory used by a process in its host's latest snapshot, bytes", PROCESS_LABELS)
        parts.append((proc.text() + "".join(t for _i, t in shown)).encode())
        parts.append(generate_latest(_Families(counter_families(session, by_id))))  # type: ignore[arg-type]
        with self._lock:  # forget hosts no longer up or listed
            for gone in [hid for hid in self._live if hid not in up]:
                self._live.pop(gone, None)
        return b"".join(parts)

    def _finished(self, h: ScrapeHost, snap: _Snap, holders: dict, quarantines: dict) -> list[str]:
        """The host's lines of the five device families and the quarantine gauge."""
        names = tuple(holders[d[0]].user.username if d[0] in holders else "" for d in snap.devices)
        quarantined = tuple(d[0] in quarantines for d in snap.devices)
        key = (snap, names, quarantined)
        with self._lock:
            got = self._live.get(h.id)
        if got is not None and got[0][0] is snap and got[0][1:] == key[1:]:
            return got[1]
        families = [TextGauge(name, doc, DEVICE_LABELS) for name, doc in DEVICE_FAMILIES]
        families.append(TextGauge("gpuroster_device_quarantined", "", DEVICE_LABELS))
        for (dev_id, labels, values), holder, q in zip(snap.devices, names, quarantined, strict=True):
            full = (*labels, holder)
            for g, v in zip(families[:-1], values, strict=True):
                if v is not None:
                    g.add_metric(full, v)
            families[-1].add_metric(full, 1.0 if q else 0.0)
        lines = ["".join(g._lines) for g in families]  # noqa: SLF001
        with self._lock:
            self._live[h.id] = (key, lines)
        return lines

    def _quarantines(self, session: Session, *, hosts: dict, chunks: list[list[str]], shown: set[int],
                     quarantines: dict) -> bytes:
        """``gpuroster_device_quarantined`` (shown devices from ``chunks``, then quarantined
        devices of hosts that are not up) and ``gpuroster_device_health_condition``."""
        gauge = TextGauge("gpuroster_device_quarantined", "1 when the device is quarantined for a health reason, else 0",
                          DEVICE_LABELS)
        cond = GaugeMetricFamily("gpuroster_device_health_condition", "1 per critical condition of a quarantined device",
                                 labels=("host", "uuid", "kind"))
        others = [i for i in quarantines if i not in shown]
        if others:
            for d in session.scalars(select(Device).where(Device.id.in_(others))):
                gauge.add_metric((hosts[d.host_id].name, "" if d.index is None else str(d.index), d.uuid, d.name or "", ""),
                                 1.0)
        uuids = dict(session.execute(select(Device.id, Device.uuid).where(Device.id.in_(list(quarantines)))).all()) \
            if quarantines else {}
        for dev_id, q in sorted(quarantines.items()):
            for kind in sorted({c["kind"] for c in q.conditions}):
                cond.add_metric((hosts[q.host_id].name, uuids[dev_id], kind), 1.0)
        head = TextGauge(gauge.name, gauge.documentation, DEVICE_LABELS).text()
        text = head + "".join(c[-1] for c in chunks) + "".join(gauge._lines)  # noqa: SLF001
        return text.encode() + generate_latest(_Families([cond]))  # type: ignore[arg-type]


def _version(h: ScrapeHost) -> tuple:
    # what every snapshot rewrites; the devices shown are those of the latest one
    return (h.name, h.last_seen_at, h.last_seq, h.last_collected_at)


def _read_snaps(session: Session, hosts: list[ScrapeHost]) -> dict[int, _Snap]:
    """Host id -> its :class:`_Snap` for ``hosts``: three statements (chunked by host)."""
    out: dict[int, _Snap] = {}
    for i in range(0, len(hosts), 4000):
        part = {h.id: h for h in hosts[i : i + 4000]}
        rows = session.execute(
            select(*_DEV, DeviceTelemetry.utilization_gpu, DeviceTelemetry.memory_used_mib,
                   DeviceTelemetry.temperature_c, DeviceTelemetry.power_draw_w)
            .join(DeviceTelemetry, DeviceTelemetry.device_id == Device.id)
            .join(Host, Host.id == Device.host_id)
            .where(Device.host_id.in_(list(part)), Device.retired_at.is_(None),
                   DeviceTelemetry.collected_at == Host.last_collected_at)
        ).all()
        parents = {r.id: r for r in rows}
        missing = {r.parent_id for r in rows if r.parent_id and r.parent_id not in parents}
        if missing:
            parents.update({d.id: d for d in session.execute(select(*_DEV).where(Device.id.in_(missing)))})
        procs: dict[int, TextGauge] = {}
        ids = [r.id for r in rows]
        uuid_of = {r.id: r.uuid for r in rows}
        for j in range(0, len(ids), 4000):
            for dev_id, host_id, pid, user, name, used in session.execute(
                select(DeviceProcess.device_id, Device.host_id, DeviceProcess.pid, DeviceProcess.unix_user,
                       DeviceProcess.name, DeviceProcess.used_memory_mib)
                .join(Device, Device.id == DeviceProcess.device_id)
                .where(DeviceProcess.device_id.in_(ids[j : j + 4000])).order_by(DeviceProcess.device_id, DeviceProcess.pid)
            ):
                if used is None:
                    continue
                g = procs.setdefault(dev_id, TextGauge("gpuroster_process_memory_used_bytes", "", PROCESS_LABELS))
                g.add_metric((part[host_id].name, uuid_of[dev_id], str(pid), user or "", name or ""), used * MIB)
        per_host: dict[int, list] = {hid: [] for hid in part}
        for r in sorted(rows, key=lambda r: r.uuid):
            labels = (part[r.host_id].name, device_index_label(r, parents), r.uuid, r.name or "")
            values = (r.utilization_gpu, None if r.memory_used_mib is None else r.memory_used_mib * MIB,
                      None if r.memory_total_mib is None else r.memory_total_mib * MIB, r.temperature_c, r.power_draw_w)
            per_host[r.host_id].append((r.id, labels, values))
        by_host: dict[int, dict[int, str]] = {hid: {} for hid in part}
        for dev_id, g in procs.items():
            by_host[parents[dev_id].host_id][dev_id] = "".join(g._lines)  # noqa: SLF001
        for hid, h in part.items():
            out[hid] = _Snap(_version(h), per_host[hid], by_host[hid])
    return out


__all__ = ["MetricsCache"]
