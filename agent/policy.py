"""Who may use which GPU right now: the one pure coverage function of gpuroster.

The agent calls :func:`judge` on every poll with the reservation table that the service
handed it (so it keeps judging while the service is unreachable); the service may import the
same function for display. It does no I/O, reads no clock and imports only the standard
library and the wire schema (pydantic).

Rules:

* A process is **covered** on device ``D`` at instant ``now`` when its owner (matched by
  ``unix_user`` against :attr:`ReservationEntry.unix_name` or one of
  :attr:`ReservationEntry.shared_with`) has a reservation with ``start <= now < end``
  (half-open) that lists ``D``'s UUID, or, when ``D`` is a MIG instance, ``D``'s parent GPU
  UUID (:attr:`DeviceReport.parent_uuid`). A reservation of one MIG instance does *not*
  cover its parent GPU or a sibling instance. Devices listed in ``open_devices`` (or whose
  parent GPU is listed) need no reservation.
* Not judged at all (never a finding): processes whose owner is not known
  (``owner_status`` other than ``"ok"``/``"replay"``, or ``unix_user`` ``None``: a pid the
  agent cannot see from its namespace, one that exited before its owner was read, or one
  whose owner it may not read); root and system accounts (``uid < policy.min_uid``, or user ``root``); users in
  ``policy.exempt_users``; processes whose name (or the base name of their command's first
  word) is in ``policy.exempt_process_names`` (Xorg, display servers, DCGM: they hold a
  GPU without being anybody's job).
* An uncovered process is

  - ``foreign`` when somebody else holds an active reservation of the device (or of its
    parent GPU) now; ``holder`` is that reservation's ``unix_name`` (a MIG instance counts as its parent GPU's; at a hand-over,
    once the next reservation has started, the previous holder's process is ``foreign``
    against the new holder, not ``overrun``);
  - ``overrun`` when nobody holds the device now but the owner's own reservation of it ended
    within ``overrun_window`` (``now - window < end <= now``);
  - ``unreserved`` otherwise.

* ``idle`` (judged *now*, debounced by the tracker over ``policy.idle_minutes``): an active
  reservation's device whose process listing worked, that shows no process of the holder (or
  of a user it is shared with) and whose GPU utilization is known and below
  ``policy.idle_utilization_pct``. When utilization is not available (MIG instances) the
  device counts as idle only if it shows no process at all whose owner is unknown (such a
  process might be the holder's). Idle is judged per (reservation, device).

Naive datetimes are read as UTC (SQLite hands the service naive values); nothing raises on
them.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from agent.schema import DeviceReport, FindingKind, HostPolicy, ProcessReport, ReservationEntry

#: How long after its end a reservation still turns its holder's leftover process into
#: ``overrun`` rather than ``unreserved`` (a leftover job of the last holder is an overrun for a while, not
#: an anonymous unreserved process). Equal to
#: how far back the service's table goes (``reservations.host_table(behind=6 h)``): an older
#: reservation is not in the agent's table anyway.
DEFAULT_OVERRUN_WINDOW = timedelta(hours=6)

#: Owner statuses whose ``unix_user`` may be trusted (not: unseen in a foreign PID namespace,
#: exited before the lookup, lookup denied).
KNOWN_OWNER_STATUSES = frozenset({"ok", "replay"})


@dataclass(frozen=True, slots=True)
class Judgement:
    """One violation at one instant, before any debouncing.

    ``pid``/``create_time``/process fields are ``None`` for ``idle`` (which is about a
    reservation, not a process). ``reservation_id``/``holder``: for ``foreign`` the
    reservation and unix name of the rightful holder now; for ``overrun`` the owner's ended
    reservation (``holder`` ``None``: nobody holds the device now); for ``idle`` the idle
    reservation and its holder; for ``unreserved`` both ``None``.
    """

    kind: FindingKind
    device_uuid: str
    reason: str
    pid: int | None = None
    create_time: float | None = None
    unix_user: str | None = None
    uid: int | None = None
    command: str | None = None
    name: str | None = None
    container_id: str | None = None
    reservation_id: int | None = None
    holder: str | None = None
    reservation_end: datetime | None = None

    @property
    def key(self) -> str:
        """The stable finding key ``uuid:pid:create_time:kind`` (idle: ``uuid:-:r<id>:idle``)."""
        if self.kind == "idle":
            return f"{self.device_uuid}:-:r{self.reservation_id}:idle"
        return finding_key(self.device_uuid, self.pid, self.create_time, self.kind)


def finding_key(device_uuid: str, pid: int | None, create_time: float | None, kind: str) -> str:
    """Return ``uuid:pid:create_time:kind``; ``create_time`` with 2 decimals (psutil's 10 ms
    resolution), so the same process keeps its key across agent restarts; ``-`` for ``None``."""
    ct = "-" if create_time is None else f"{create_time:.2f}"
    return f"{device_uuid}:{pid if pid is not None else '-'}:{ct}:{kind}"


def as_utc(value: datetime) -> datetime:
    """Return ``value`` as an aware UTC datetime; a naive value is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def is_active(reservation: ReservationEntry, now: datetime) -> bool:
    """True when ``now`` lies in the half-open ``[start, end)`` of ``reservation``."""
    t = as_utc(now)
    return as_utc(reservation.start) <= t < as_utc(reservation.end)


def entitled(reservation: ReservationEntry, unix_user: str | None) -> bool:
    """True when ``unix_user`` holds ``reservation`` or is shared into it."""
    return unix_user is not None and (unix_user == reservation.unix_name or unix_user in reservation.shared_with)


def process_names(process: ProcessReport) -> set[str]:
    """Names an exemption list is matched against: the process name and the base name of
    the command's first word (``/usr/lib/xorg/Xorg -core`` gives ``Xorg``)."""
    names: set[str] = set()
    if process.name:
        names.add(process.name)
        names.add(os.path.basename(process.name))
    if process.command:
        first = process.command.strip().split(" ", 1)[0]
        if first:
            names.add(os.path.basename(first))
    names.discard("")
    return names


def owner_known(process: ProcessReport) -> bool:
    """True when the process owner is attributed (not unseen, exited or denied)."""
    return process.owner_status in KNOWN_OWNER_STATUSES and bool(process.unix_user)


def exemption(process: ProcessReport, policy: HostPolicy) -> str | None:
    """Why ``process`` is exempt from judgement, or ``None`` when it is judged.

    Unknown owners, root and system accounts (uid below ``policy.min_uid``), exempt users
    and exempt process names are exempt.
    """
    if not owner_known(process):
        return f"owner unknown ({process.owner_status})"
    if process.unix_user == "root" or (process.uid is not None and process.uid == 0):
        return "root"
    if process.uid is not None and process.uid < policy.min_uid:
        return f"system account (uid {process.uid} < {policy.min_uid})"
    if process.unix_user in policy.exempt_users:
        return f"exempt user {process.unix_user}"
    hit = process_names(process) & set(policy.exempt_process_names)
    if hit:
        return f"exempt process name {sorted(hit)[0]}"
    return None


class _Table:
    """The reservation table indexed by device UUID, for one judgement instant."""

    def __init__(
        self,
        reservations: Iterable[ReservationEntry],
        devices: Iterable[DeviceReport],
        open_devices: Collection[str],
    ) -> None:
        self.by_device: dict[str, list[ReservationEntry]] = {}
        for r in sorted(reservations, key=lambda r: (as_utc(r.start), r.id)):
            for uuid in r.device_uuids:
                self.by_device.setdefault(uuid.strip(), []).append(r)
        self.parent: dict[str, str] = {d.uuid: d.parent_uuid for d in devices if d.parent_uuid}
        self.open = {u.strip() for u in open_devices}

    def scope(self, device_uuid: str) -> list[str]:
        """The UUIDs whose reservation covers ``device_uuid``: itself and its parent GPU."""
        parent = self.parent.get(device_uuid)
        return [device_uuid, parent] if parent else [device_uuid]

    def reservations_of(self, device_uuid: str) -> list[ReservationEntry]:
        """Reservations relevant to ``device_uuid`` (its own and its parent's), by start."""
        seen: dict[int, ReservationEntry] = {}
        for uuid in self.scope(device_uuid):
            for r in self.by_device.get(uuid, ()):
                seen.setdefault(r.id, r)
        return sorted(seen.values(), key=lambda r: (as_utc(r.start), r.id))

    def is_open(self, device_uuid: str) -> bool:
        return any(u in self.open for u in self.scope(device_uuid))


def _judge_one(
    process: ProcessReport,
    table: _Table,
    policy: HostPolicy,
    now: datetime,
    overrun_window: timedelta,
) -> Judgement | None:
    if exemption(process, policy) is not None:
        return None
    device = process.device_uuid.strip()
    if table.is_open(device):
        return None
    relevant = table.reservations_of(device)
    active = [r for r in relevant if is_active(r, now)]
    user = process.unix_user
    if any(entitled(r, user) for r in active):
        return None
    common = dict(
        device_uuid=device,
        pid=process.pid,
        create_time=process.create_time,
        unix_user=user,
        uid=process.uid,
        command=process.command,
        name=process.name,
        container_id=process.container_id,
    )
    if active:
        r = active[0]
        return Judgement(
            kind="foreign",
            reason=f"device reserved by {r.unix_name} (reservation {r.id}) until {as_utc(r.end).isoformat()}",
            reservation_id=r.id,
            holder=r.unix_name,
            reservation_end=as_utc(r.end),
            **common,
        )
    t = as_utc(now)
    ended = [
        r for r in relevant if entitled(r, user) and t - overrun_window < as_utc(r.end) <= t
    ]
    if ended:
        r = max(ended, key=lambda r: (as_utc(r.end), r.id))
        return Judgement(
            kind="overrun",
            reason=f"reservation {r.id} of {r.unix_name} ended at {as_utc(r.end).isoformat()}",
            reservation_id=r.id,
            holder=None,
            reservation_end=as_utc(r.end),
            **common,
        )
    return Judgement(kind="unreserved", reason=f"{user} holds no reservation of this device now", **common)


def judge_process(
    process: ProcessReport,
    reservations: Sequence[ReservationEntry],
    policy: HostPolicy,
    *,
    now: datetime,
    devices: Sequence[DeviceReport] = (),
    open_devices: Collection[str] = (),
    overrun_window: timedelta = DEFAULT_OVERRUN_WINDOW,
) -> Judgement | None:
    """Judge one process at ``now``: a :class:`Judgement` or ``None`` when covered/exempt.

    ``devices`` supplies the MIG parent of each instance (without it a MIG process is only
    covered by a reservation of the instance itself). Raises nothing for well-formed schema
    objects.
    """
    return _judge_one(process, _Table(reservations, devices, open_devices), policy, now, overrun_window)


def judge_idle(
    processes: Sequence[ProcessReport],
    devices: Sequence[DeviceReport],
    reservations: Sequence[ReservationEntry],
    policy: HostPolicy,
    *,
    now: datetime,
) -> list[Judgement]:
    """Devices of active reservations that look idle *now* (see the module docstring).

    A device that is not in ``devices`` (not reported, lost) or whose process listing failed
    is never idle: absence of evidence is not idleness. Utilization is in %.
    """
    by_uuid = {d.uuid: d for d in devices}
    children: dict[str, list[str]] = {}
    for d in devices:
        if d.parent_uuid:
            children.setdefault(d.parent_uuid, []).append(d.uuid)
    on_device: dict[str, list[ProcessReport]] = {}
    for p in processes:
        on_device.setdefault(p.device_uuid.strip(), []).append(p)
    out: list[Judgement] = []
    for r in sorted(reservations, key=lambda r: r.id):
        if not is_active(r, now):
            continue
        for uuid in dict.fromkeys(u.strip() for u in r.device_uuids):
            d = by_uuid.get(uuid)
            if d is None or d.health != "ok" or d.processes_status != "ok":
                continue
            span = [uuid, *children.get(uuid, [])]
            if any(by_uuid[u].processes_status != "ok" for u in span if u in by_uuid):
                continue
            procs = [p for u in span for p in on_device.get(u, ())]
            if any(owner_known(p) and entitled(r, p.unix_user) for p in procs):
                continue
            util = d.utilization_gpu
            if util is None:
                if any(not owner_known(p) for p in procs):
                    continue
                basis = "utilization n/a, no process of the holder"
            elif util >= policy.idle_utilization_pct:
                continue
            else:
                basis = f"utilization {util:g}% < {policy.idle_utilization_pct:g}%, no process of the holder"
            out.append(
                Judgement(
                    kind="idle",
                    device_uuid=uuid,
                    reason=f"reservation {r.id} of {r.unix_name} idle: {basis}",
                    unix_user=r.unix_name,
                    reservation_id=r.id,
                    holder=r.unix_name,
                    reservation_end=as_utc(r.end),
                )
            )
    return out


def judge(
    processes: Sequence[ProcessReport],
    reservations: Sequence[ReservationEntry],
    policy: HostPolicy,
    *,
    now: datetime,
    devices: Sequence[DeviceReport] = (),
    open_devices: Collection[str] = (),
    overrun_window: timedelta = DEFAULT_OVERRUN_WINDOW,
    include_idle: bool = True,
) -> list[Judgement]:
    """Judge a host at instant ``now``: every violation, one per (process, device, kind).

    ``processes`` and ``devices`` come from one :class:`~agent.schema.Snapshot`;
    ``reservations``, ``policy`` and ``open_devices`` from the service's
    :class:`~agent.schema.SnapshotAck`. The result is ordered as the processes were, idle
    judgements last, with duplicates (the same pid listed twice on a device) removed. Idle
    judgements need ``devices`` (telemetry); pass ``include_idle=False`` to skip them.
    Pure: no I/O, no clock, no logging; raises nothing for well-formed schema objects.
    """
    table = _Table(reservations, devices, open_devices)
    out: dict[str, Judgement] = {}
    for p in processes:
        j = _judge_one(p, table, policy, now, overrun_window)
        if j is not None:
            out.setdefault(j.key, j)
    if include_idle:
        for j in judge_idle(processes, devices, reservations, policy, now=now):
            out.setdefault(j.key, j)
    return list(out.values())


def holders(
    device_uuid: str,
    reservations: Sequence[ReservationEntry],
    *,
    now: datetime,
    devices: Sequence[DeviceReport] = (),
) -> list[ReservationEntry]:
    """Active reservations covering ``device_uuid`` at ``now`` (its own or its parent GPU's),
    by start; for display ("GPU0: reserved by user-b")."""
    return [r for r in _Table(reservations, devices, ()).reservations_of(device_uuid.strip()) if is_active(r, now)]


__all__ = [
    "DEFAULT_OVERRUN_WINDOW",
    "Judgement",
    "as_utc",
    "entitled",
    "exemption",
    "finding_key",
    "holders",
    "is_active",
    "judge",
    "judge_idle",
    "judge_process",
    "owner_known",
    "process_names",
]
