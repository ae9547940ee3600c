"""Placement: pick ``count`` devices and the earliest start at which they are free.

A request names how many devices, for how long, from when (``asap`` = now), and optional
constraints (host, GPU model substring, minimum total memory per device). Candidates are
whole GPUs that are not retired, not reported lost, not quarantined, not open (open devices need no
reservation) and not in MIG mode (MIG instances are booked by UUID); with the owner's
``allowed_hosts`` / ``allowed_models`` rules applied unless an admin overrides.

The start is the earliest instant ``t >= from`` at which one host has ``count`` matching
devices free for the whole ``[t, t + length)``. Such a ``t`` is ``from`` itself or the end
of a busy interval, so only those instants are tried. Among the devices free at ``t`` the
service prefers, in this order:

1. devices idle now per the latest telemetry: no compute process, at most
   :data:`BUSY_MEMORY_MIB` in use and utilization below :data:`BUSY_UTILIZATION_PCT`
   (a display server or a few MiB of driver overhead do not make a GPU busy); a device of a
   host whose agent went quiet (stale: the host may be down) counts as unknown, after the
   idle ones and before those known busy;
2. devices close to each other: fewest distinct ``link_group`` values (NVLink / PCIe
   switch, reported by the agent; a device without one is its own group);
3. the tightest fit: the shortest free stretches around ``[t, t + length)``, so long free
   stretches stay whole for others;
4. the lowest indices.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from app.errors import Conflict, InvalidInput
from app.models import Device, DeviceProcess, DeviceQuarantine, DeviceTelemetry, Host, ReservationDevice, User
from app.models.base import utcnow
from app.schemas.reservation import PlacementConstraints, ReservationCreate
from app.services import hosts as host_service
from app.services import rules as rules_service
from app.services.limits import resolve_limits
from app.services.intervals import Interval
from app.services.devices import agent_quiet
from app.timeutil import add_capped

BUSY_MEMORY_MIB = 1024.0
BUSY_UTILIZATION_PCT = 10.0
_INF = float("inf")


@dataclass
class Candidate:
    """A device that may be placed, with its busy intervals (sorted, merged) and idleness.

    ``busy_rank``: 0 idle now, 1 unknown (no telemetry, or a host whose agent has gone quiet:
    never reported or stale, so its last telemetry says nothing of now and the host may be
    down), 2 busy now (a process of someone else's is on it).
    """

    device: Device
    host: Host
    busy_rank: int
    starts: list[datetime] = field(default_factory=list)
    ends: list[datetime] = field(default_factory=list)

    def free(self, start: datetime, end: datetime) -> bool:
        """True if no busy interval overlaps ``[start, end)``."""
        i = bisect.bisect_left(self.starts, end) - 1
        return i < 0 or self.ends[i] <= start

    def stretch(self, start: datetime, end: datetime, now: datetime) -> float:
        """Length in seconds of the free stretch around ``[start, end)`` (``inf`` when open-ended)."""
        j = bisect.bisect_left(self.starts, end)
        if j >= len(self.starts):
            return _INF
        nxt = self.starts[j]
        prev = self.ends[j - 1] if j > 0 else now
        return (nxt - max(prev, now)).total_seconds()

    def next_busy(self, after: datetime) -> datetime | None:
        """The start of the first busy interval that starts after ``after``."""
        j = bisect.bisect_right(self.starts, after)
        return self.starts[j] if j < len(self.starts) else None

    @property
    def group(self) -> str:
        return self.device.link_group or f"\x00{self.device.uuid}"

    @property
    def sort_index(self) -> tuple[int, str]:
        return (self.device.index if self.device.index is not None else 1 << 30, self.device.uuid)


@dataclass(frozen=True)
class Slot:
    """``count`` devices of one host free for ``[start, end)``; ``free_until`` is when the
    first of them is next reserved (``None``: not at all)."""

    host: Host
    devices: list[Device]
    start: datetime
    end: datetime
    free_until: datetime | None


@dataclass(frozen=True)
class Request:
    count: int
    host: str | None = None
    model: str | None = None
    min_memory_mib: float | None = None
    allowed_hosts: Sequence[str] | None = None
    allowed_models: Sequence[str] | None = None


def _merge(intervals: list[tuple[datetime, datetime]]) -> tuple[list[datetime], list[datetime]]:
    starts: list[datetime] = []
    ends: list[datetime] = []
    for s, e in sorted(intervals):
        if starts and s <= ends[-1]:
            ends[-1] = max(ends[-1], e)
        else:
            starts.append(s)
            ends.append(e)
    return starts, ends


def _busy_rank(t: DeviceTelemetry | None, computing: bool, host: Host, now: datetime) -> int:
    if agent_quiet(host.last_seen_at, host.interval_seconds, host.monitoring_status, now):
        return 1
    if computing:
        return 2
    if t is None:
        return 1
    if t.memory_used_mib is not None and t.memory_used_mib > BUSY_MEMORY_MIB:
        return 2
    if t.utilization_gpu is not None and t.utilization_gpu >= BUSY_UTILIZATION_PCT:
        return 2
    return 0


def candidates(session: Session, *, req: Request, after: datetime) -> list[Candidate]:
    """Devices matching ``req`` with their busy intervals ending after ``after``.

    Two statements: the whole GPUs with their host, telemetry and whether a compute process
    runs on them (GPUs split into MIG instances left out in SQL), then the busy intervals of
    the candidates only.
    """
    child = aliased(Device)
    computing = (
        select(DeviceProcess.id)
        .where(DeviceProcess.device_id == Device.id, DeviceProcess.type != "G")
        .exists()
        .label("computing")
    )
    q = (
        select(Device, Host, DeviceTelemetry, computing)
        .join(Host, Host.id == Device.host_id)
        .outerjoin(DeviceTelemetry, DeviceTelemetry.device_id == Device.id)
        .where(Device.retired_at.is_(None), Device.parent_id.is_(None), Device.is_open.is_(False),
               ~select(child.id).where(child.parent_id == Device.id).exists(),
               # a quarantined device is never placed (app.services.quarantine)
               ~select(DeviceQuarantine.id).where(DeviceQuarantine.device_id == Device.id,
                                                  DeviceQuarantine.cleared_at.is_(None)).exists())
    )
    if req.host:
        q = q.where(Host.name == req.host)
    rows = list(session.execute(q).all())
    now = utcnow()
    out: list[Candidate] = []
    for d, h, t, busy_now in rows:
        if d.mig_mode:
            continue
        if t is not None and t.health == "lost":
            continue
        if req.allowed_hosts is not None and h.name not in req.allowed_hosts:
            continue
        if req.model and req.model.strip().lower() not in (d.name or "").lower():
            continue
        if req.allowed_models is not None and not rules_service.model_allowed(d.name, req.allowed_models):
            continue
        if req.min_memory_mib is not None and (d.memory_total_mib is None or d.memory_total_mib < req.min_memory_mib):
            continue
        out.append(Candidate(device=d, host=h, busy_rank=_busy_rank(t, bool(busy_now), h, now)))
    if not out:
        return out
    busy: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    by_id = {c.device.id: c for c in out}
    for phys, s, e in session.execute(
        select(ReservationDevice.physical_id, ReservationDevice.start_at, ReservationDevice.end_at).where(
            ReservationDevice.active.is_(True),
            ReservationDevice.end_at > after,
            ReservationDevice.physical_id.in_(list(by_id)),
        )
    ):
        busy[phys].append((s, e))
    for dev_id, c in by_id.items():
        c.starts, c.ends = _merge(busy.get(dev_id, []))
    return out


def _score(sel: Sequence[Candidate], start: datetime, end: datetime, now: datetime) -> tuple:
    """Lower is better. Devices known busy are counted before unknown ones: a choice with one
    GPU running someone's job is worse than any with none, however many unknown (their ranks
    summed, one busy and one idle would tie with two unknown)."""
    stretch = sum(min(c.stretch(start, end, now), 1e15) for c in sel)
    return (sum(c.busy_rank == 2 for c in sel), sum(c.busy_rank == 1 for c in sel), len({c.group for c in sel}), stretch,
            sorted(c.sort_index for c in sel))


def choose(free: Sequence[Candidate], count: int, start: datetime, end: datetime, now: datetime) -> list[Candidate]:
    """The preferred ``count`` of the ``free`` devices of one host (see the module docstring).

    Tries the best devices overall and, for each link group, that group's best devices
    first; returns the option with the best score.
    """
    keyed = sorted(free, key=lambda c: (c.busy_rank, min(c.stretch(start, end, now), 1e15), c.sort_index))
    options = [keyed[:count]]
    for g in {c.group for c in keyed}:
        inside = [c for c in keyed if c.group == g]
        options.append((inside + [c for c in keyed if c.group != g])[:count])
    return min(options, key=lambda sel: _score(sel, start, end, now))


def _times(cands: Sequence[Candidate], after: datetime) -> list[datetime]:
    ts = {after}
    for c in cands:
        ts.update(e for e in c.ends if e > after)
    return sorted(ts)


def _fits(cands: Sequence[Candidate], req: Request, t: datetime, length: timedelta, now: datetime) -> list[Slot]:
    if add_capped(t, length) - t < length:
        return []  # past the latest instant the service computes with (an open-ended hold ends there)
    by_host: dict[int, list[Candidate]] = defaultdict(list)
    for c in cands:
        if c.free(t, t + length):
            by_host[c.host.id].append(c)
    out = []
    for free in by_host.values():
        if len(free) >= req.count:
            sel = choose(free, req.count, t, t + length, now)
            nxt = [n for n in (c.next_busy(t) for c in sel) if n is not None]
            out.append((_score(sel, t, t + length, now), sel[0].host.name,
                        Slot(host=sel[0].host, devices=[c.device for c in sorted(sel, key=lambda c: c.sort_index)],
                             start=t, end=t + length, free_until=min(nxt) if nxt else None)))
    out.sort(key=lambda x: (x[0], x[1]))
    return [s for _score_, _name, s in out]


def _check_satisfiable(cands: Sequence[Candidate], req: Request) -> None:
    per_host: dict[str, int] = defaultdict(int)
    for c in cands:
        per_host[c.host.name] += 1
    best = max(per_host.values(), default=0)
    if best < req.count:
        what = [f"host {req.host}" if req.host else None,
                f"model ~ {req.model!r}" if req.model else None,
                f"at least {req.min_memory_mib:g} MiB" if req.min_memory_mib is not None else None,
                "hosts and models your rules allow" if (req.allowed_hosts is not None or req.allowed_models is not None) else None]
        cond = ", ".join(w for w in what if w) or "no constraints"
        raise InvalidInput(
            f"count: {req.count} device(s) wanted, but at most {best} bookable device(s) on one host match ({cond})",
            field="count",
        )


def earliest_slot(session: Session, *, req: Request, after: datetime, length: timedelta, now: datetime) -> Slot:
    """The earliest slot for ``req`` at or after ``after``; raises InvalidInput (422, field
    ``count``) when no host has enough matching devices at all, Conflict (409, field
    ``count``) when they are held open-ended (until the latest instant)."""
    return earliest_among(candidates(session, req=req, after=after), req=req, after=after, length=length, now=now)


def earliest_among(cands: Sequence[Candidate], *, req: Request, after: datetime, length: timedelta,
                   now: datetime) -> Slot:
    """:func:`earliest_slot` over candidates already loaded (:func:`candidates` for the same
    constraints, loaded with an ``after`` no later than this one), so that a caller trying
    many requests against one state of the bookings loads them once."""
    _check_satisfiable(cands, req)
    for t in _times(cands, after):
        fits = _fits(cands, req, t, length, now)
        if fits:
            return fits[0]
    # every matching device is held until the latest instant (open-ended or year-9999 holds)
    raise Conflict(f"count: {req.count} matching device(s) are never free for {length} on one host: "
                   "they are held open-ended", field="count")


def request_for(session: Session, *, count: int, host: str | None, constraints: PlacementConstraints | None,
                owner: User | None, override: bool) -> Request:
    """A placement request from API input, with ``owner``'s host/model rules unless ``override``.

    Raises InvalidInput for ``same_host = false`` (a reservation holds devices of one host)
    and NotFound for an unknown host.
    """
    c = constraints or PlacementConstraints()
    if not c.same_host:
        raise InvalidInput(
            "constraints.same_host: a reservation holds devices of one host; book several reservations instead",
            field="constraints.same_host",
        )
    if host:
        host_service.get_host(session, host)
    allowed_hosts = allowed_models = None
    if owner is not None and not override:
        limits = resolve_limits(session, owner)
        allowed_hosts = limits["allowed_hosts"].value
        allowed_models = limits["allowed_models"].value
    return Request(count=count, host=host, model=c.model or None, min_memory_mib=c.min_memory_mib,
                   allowed_hosts=allowed_hosts, allowed_models=allowed_models)


def place(
    session: Session, *, data: ReservationCreate, owner: User, interval: Interval, now: datetime
) -> tuple[Host, list[Device], Interval]:
    """Choose host, devices and start for a ``count`` request (see the module docstring).

    ``interval.start`` is the earliest acceptable start; the length is kept. Raises
    InvalidInput (422) naming ``count`` or ``constraints.same_host``, NotFound for an unknown
    ``host``.
    """
    assert data.count is not None
    req = request_for(session, count=data.count, host=data.host, constraints=data.constraints, owner=owner,
                      override=bool(data.override_reason))
    length = interval.end - interval.start
    slot = earliest_slot(session, req=req, after=interval.start, length=length, now=now)
    return slot.host, slot.devices, Interval(slot.start, slot.end)


def availability(
    session: Session, *, req: Request, after: datetime, length: timedelta, now: datetime, limit: int = 5
) -> list[Slot]:
    """The next ``limit`` free slots for ``req`` from ``after``: per host, each start at which
    it can take the request, skipping starts inside a slot already listed for that host.

    Raises InvalidInput (field ``count``) when no host has enough matching devices.
    """
    cands = candidates(session, req=req, after=after)
    _check_satisfiable(cands, req)
    out: list[Slot] = []
    covered: dict[int, datetime | None] = {}
    for t in _times(cands, after):
        for slot in _fits(cands, req, t, length, now):
            hid = slot.host.id
            if hid in covered and (covered[hid] is None or t < covered[hid]):
                continue
            covered[hid] = slot.free_until
            out.append(slot)
            if len(out) >= limit:
                return out
        if covered and all(v is None for v in covered.values()) and len(covered) == len({c.host.id for c in cands}):
            break
    return out
