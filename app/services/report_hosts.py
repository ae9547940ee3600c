"""Quarantined device-hours and the per-host breakdown of the booked-versus-used report
(:mod:`app.services.reports`).

Two quarantine figures, both clipped to the report's ``[start, until)`` (time that has not
happened yet is not counted; an open quarantine runs until ``until``):

* **quarantined GPU-hours of a reservation** (and summed per user, group and host): the
  reserved device-time during which that device, or for a MIG instance its GPU, was
  quarantined (:class:`app.models.DeviceQuarantine`); the holder could not use it.
* **quarantined device-hours of a host**: the time each of the host's devices was
  quarantined in the period, summed over its devices, whoever booked them: capacity the
  whole lab lost. Every host with a quarantine in the period gets a row, also in a user's
  report, since a quarantine takes capacity from everyone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.models import DeviceQuarantine, Host, Reservation
from app.schemas.report import HostUsage
from app.services.report_counts import CheckinFigures

Spans = dict[int, list[tuple[datetime, datetime]]]


def quarantine_spans(session: Session, *, start: datetime, until: datetime,
                     device_ids: Iterable[int] | None = None) -> tuple[Spans, dict[int, int]]:
    """Quarantines overlapping ``[start, until)``, clipped to it.

    Returns ``(spans, host_of)``: device id -> ``[(lo, hi)]`` UTC intervals (one per
    quarantine; quarantines of one device never overlap, one is opened only when none is
    open), and device id -> host id. ``device_ids``: only these devices (``None``: all).
    """
    spans: Spans = defaultdict(list)
    host_of: dict[int, int] = {}
    if until <= start:
        return spans, host_of
    q = select(DeviceQuarantine.device_id, DeviceQuarantine.host_id, DeviceQuarantine.started_at,
               DeviceQuarantine.cleared_at).where(
        DeviceQuarantine.started_at < until,
        or_(DeviceQuarantine.cleared_at.is_(None), DeviceQuarantine.cleared_at > start),
    )
    if device_ids is not None:
        ids = sorted({i for i in device_ids if i is not None})
        if not ids:
            return spans, host_of
        q = q.where(DeviceQuarantine.device_id.in_(ids))
    for device_id, host_id, started, cleared in session.execute(q.order_by(DeviceQuarantine.id)):
        lo, hi = max(started, start), min(cleared or until, until)
        if hi > lo:
            spans[device_id].append((lo, hi))
            host_of[device_id] = host_id
    return spans, host_of


def overlap_seconds(spans: Iterable[tuple[datetime, datetime]], lo: datetime, hi: datetime) -> float:
    """Seconds of ``[lo, hi)`` covered by ``spans`` (overlapping spans, such as a MIG
    instance's own and its GPU's quarantine, count once)."""
    total, reach = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += (b - a).total_seconds()
            reach = b
    return total


@dataclass
class HostFigures:
    """One host's row: the scope's reservations on it, and the host's quarantine time."""

    reservations: int = 0
    reserved_quarantined_s: float = 0.0
    quarantined_device_s: float = 0.0
    quarantines: int = 0

    def figures(self) -> dict:
        """The quarantine fields of :class:`app.schemas.report.HostUsage`."""
        return {"reservations": self.reservations,
                "quarantined_gpu_hours": round(self.reserved_quarantined_s / 3600, 4),
                "quarantined_device_hours": round(self.quarantined_device_s / 3600, 4),
                "quarantines": self.quarantines}


def host_quarantine_time(session: Session, *, start: datetime, until: datetime) -> dict[int, tuple[float, int]]:
    """Host id -> (quarantined device-seconds in ``[start, until)``, quarantines overlapping it),
    over every device of every host."""
    spans, host_of = quarantine_spans(session, start=start, until=until)
    out: dict[int, tuple[float, int]] = {}
    for device_id, parts in spans.items():
        seconds, n = out.get(host_of[device_id], (0.0, 0))
        out[host_of[device_id]] = (seconds + sum((b - a).total_seconds() for a, b in parts), n + len(parts))
    return out


class HostRows:
    """The per-host rows, gathered while the report walks the scope's reservations.

    ``new_tally``: makes an empty used/idle/unmonitored tally (the report's own type, with
    ``add`` and ``figures``)."""

    def __init__(self, new_tally: Callable[[], Any]) -> None:
        self._new = new_tally
        self.tallies: dict[int, Any] = {}
        self.checkins: dict[int, CheckinFigures] = {}
        self.figs: dict[int, HostFigures] = {}

    def add(self, r: Reservation, tally: Any, idle_checked_in_s: float, quarantined_s: float) -> None:
        """Count reservation ``r`` on its host: its tally, idle seconds after check-in and
        reserved seconds on a quarantined device, all within the period."""
        h = r.host_id
        self.tallies.setdefault(h, self._new()).add(tally)
        self.checkins.setdefault(h, CheckinFigures()).add(r, idle_checked_in_s)
        f = self.figs.setdefault(h, HostFigures())
        f.reservations += 1
        f.reserved_quarantined_s += quarantined_s

    def rows(self, session: Session, *, start: datetime, until: datetime) -> tuple[list[HostUsage], float]:
        """The rows by host name, with every host's quarantine time in ``[start, until)``
        added, and the lab's quarantined device-hours in total."""
        quarantined = host_quarantine_time(session, start=start, until=until)
        ids = set(self.figs) | set(quarantined)
        names = host_names(session, ids)
        out = []
        for h in ids:
            f = self.figs.get(h, HostFigures())
            f.quarantined_device_s, f.quarantines = quarantined.get(h, (0.0, 0))
            out.append(HostUsage(host=names[h], **self.tallies.get(h, self._new()).figures(),
                                 **self.checkins.get(h, CheckinFigures()).figures(), **f.figures()))
        out.sort(key=lambda row: row.host)
        return out, round(sum(s for s, _ in quarantined.values()) / 3600, 4)


def host_names(session: Session, host_ids: Iterable[int]) -> dict[int, str]:
    """Host id -> name for ``host_ids``."""
    ids = sorted(set(host_ids))
    if not ids:
        return {}
    return dict(session.execute(select(Host.id, Host.name).where(Host.id.in_(ids))).all())


__all__ = ["HostFigures", "HostRows", "host_names", "host_quarantine_time", "overlap_seconds", "quarantine_spans"]
