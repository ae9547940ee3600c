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
* Who a process is judged as (:func:`owner_of`): in a container (``container_id`` set) the
  container's owner that the agent found (``unix_user``), never its uid, so root in a
  container is not "the system"; on the host, first its uid through the service's
  ``unix_uids`` table (directory users the agent's passwd does not know), else its passwd
  name. A container with no owner is an ``unattributed`` finding, a host uid nobody can name
  an ``unknown_uid`` finding; both carry the device's current holder and are never
  signalled.
* Not judged at all (never a finding): processes whose owner cannot be read
  (``owner_status`` ``exited``, ``access_denied``, ``not_visible``, ``unknown``: a pid in
  another PID namespace, one that exited before the lookup, one whose owner may not be
  read); system processes: a verified system executable of the host (``exe`` set by the agent:
  root-owned, host mount namespace) run by root or a system account (``uid <
  policy.min_uid``) or whose executable's base name is in ``policy.exempt_process_names``
  (Xorg, display servers, DCGM: they hold a GPU without being anybody's job); users in
  ``policy.exempt_users``. The name a process gave itself is never a reason: any user can
  name a process ``Xorg``. Replayed processes (``owner_status`` ``replay``) have no
  executable to verify: the command's first word stands in for it.
* An uncovered process is

  - ``foreign`` when somebody else holds an active reservation of the device (or of its
    parent GPU) now; ``holder`` is that reservation's ``unix_name`` (a MIG instance counts as its parent GPU's; at a hand-over,
    once the next reservation has started, the previous holder's process is ``foreign``
    against the new holder, not ``overrun``);
  - ``overrun`` when nobody holds the device now but the owner's own reservation of it ended
    within ``overrun_window`` (``now - window < end <= now``);
  - ``unreserved`` otherwise.

* ``idle`` (:func:`agent.idle.judge_idle`, judged *now*, debounced by the tracker over ``policy.idle_minutes``): an active
  reservation's device whose process listing worked, that shows no process of the holder (or
  of a user it is shared with) and whose GPU utilization is known and below
  ``policy.idle_utilization_pct``. When utilization is not available (MIG instances) the
  device counts as idle only if it shows no process at all whose owner is unknown (such a
  process might be the holder's). Idle is judged per (reservation, device).

Naive datetimes are read as UTC (SQLite hands the service naive values); nothing raises on
them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from agent.attribution import (
    JUDGED_OWNER_STATUSES,
    KNOWN_OWNER_STATUSES,
    exemption,
    owner_known,
    owner_of,
    process_names,
)
from agent.idle import judge_idle
from agent.judgement import Judgement, as_utc, entitled, finding_key, is_active
from agent.schema import DeviceReport, HostPolicy, ProcessReport, ReservationEntry

#: How long after its end a reservation still turns its holder's leftover process into
#: ``overrun`` rather than ``unreserved`` (a leftover job of the last holder is an overrun for a while, not
#: an anonymous unreserved process). Equal to
#: how far back the service's table goes (``reservations.host_table(behind=6 h)``): an older
#: reservation is not in the agent's table anyway.
DEFAULT_OVERRUN_WINDOW = timedelta(hours=6)


class _Table:
    """The reservation table indexed by device UUID, for one judgement instant."""

    def __init__(
        self,
        reservations: Iterable[ReservationEntry],
        devices: Iterable[DeviceReport],
        open_devices: Collection[str],
        unix_uids: Mapping[int, str] | None = None,
    ) -> None:
        self.unix_uids = dict(unix_uids or {})
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
    user = owner_of(process, table.unix_uids)
    # a container's uid is the container's (root, mostly): only host uids match reservations
    uid = None if process.container_id else process.uid
    if user is not None and user in policy.exempt_users:
        return None
    if any(entitled(r, user, uid) for r in active):
        return None
    common = dict(
        device_uuid=device,
        pid=process.pid,
        create_time=process.create_time,
        identity=process.identity,
        unix_user=user,
        uid=process.uid,
        command=process.command,
        name=process.name,
        container_id=process.container_id,
        container_name=process.container_name,
        container_image=process.container_image,
    )
    holder = active[0] if active else None
    held = dict(
        reservation_id=holder.id if holder else None,
        holder=holder.unix_name if holder else None,
        reservation_end=as_utc(holder.end) if holder else None,
    )
    on = f" on a device reserved by {holder.unix_name}" if holder else ""
    if user is None and process.container_id:
        label = process.container_name or process.container_id[:12]
        image = f", image {process.container_image}" if process.container_image else ""
        return Judgement(kind="unattributed", reason=f"container {label}{image}: owner not found{on}", **held, **common)
    if user is None:
        return Judgement(kind="unknown_uid", reason=f"uid {process.uid}, unknown to gpuroster{on}", **held, **common)
    if holder is not None:
        r = holder
        return Judgement(
            kind="foreign",
            reason=f"device reserved by {r.unix_name} (reservation {r.id}) until {as_utc(r.end).isoformat()}",
            **held,
            **common,
        )
    t = as_utc(now)
    ended = [
        r for r in relevant if entitled(r, user, uid) and t - overrun_window < as_utc(r.end) <= t
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
    unix_uids: Mapping[int, str] | None = None,
) -> Judgement | None:
    """Judge one process at ``now``: a :class:`Judgement` or ``None`` when covered/exempt.

    ``devices`` supplies the MIG parent of each instance (without it a MIG process is only
    covered by a reservation of the instance itself). Raises nothing for well-formed schema
    objects.
    """
    return _judge_one(process, _Table(reservations, devices, open_devices, unix_uids), policy, now, overrun_window)


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
    unix_uids: Mapping[int, str] | None = None,
) -> list[Judgement]:
    """Judge a host at instant ``now``: every violation, one per (process, device, kind).

    ``processes`` and ``devices`` come from one :class:`~agent.schema.Snapshot`;
    ``reservations``, ``policy`` and ``open_devices`` from the service's
    :class:`~agent.schema.SnapshotAck`. The result is ordered as the processes were, idle
    judgements last, with duplicates (the same pid listed twice on a device) removed. Idle
    judgements need ``devices`` (telemetry); pass ``include_idle=False`` to skip them.
    ``unix_uids`` is the ack's uid table (uid -> unix name) for processes judged by uid.
    Pure: no I/O, no clock, no logging; raises nothing for well-formed schema objects.
    """
    table = _Table(reservations, devices, open_devices, unix_uids)
    out: dict[str, Judgement] = {}
    for p in processes:
        j = _judge_one(p, table, policy, now, overrun_window)
        if j is not None:
            out.setdefault(j.key, j)
    if include_idle:
        for j in judge_idle(processes, devices, reservations, policy, now=now, unix_uids=unix_uids):
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
    "JUDGED_OWNER_STATUSES",
    "KNOWN_OWNER_STATUSES",
    "owner_known",
    "owner_of",
    "process_names",
]
