"""Does a device's process list agree with its memory figures?

NVML's per-process memory and the device's used memory come from different calls, and
drivers, containers and vGPU setups make them disagree. Each device whose process list
was read ("ok") gets a ``process_data`` verdict (:data:`agent.schema.ProcessData`):

* ``unreliable``: the listed processes hold more memory than the device has in use, plus
  :func:`tolerance_mib`: the list cannot be trusted; no finding is raised on it.
* ``defunct``: a listed process is a zombie (state ``Z`` in ``/proc/PID/stat``): its memory
  is held until the driver lets go; nothing can or may be signalled.
* ``unlisted``: more than :data:`UNLISTED_MIB` in use and no process listed (a process in
  another PID namespace, a driver leak, a process NVML does not report).

For ``unlisted`` and ``defunct`` the last known owner is named, but only while the process
that was last seen on the device still exists with the same start time (``/proc/PID/stat``
field 22, clock ticks since boot), so a recycled pid never names the wrong person.
The enforcer never sees processes of such devices (:func:`judged_view`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from agent.procid import read_stat, stat_fields
from agent.schema import DeviceReport, ProcessReport, Snapshot

UNLISTED_MIB = 512.0  # above an idle GPU's baseline (driver context, display) with either memory structure
TOLERANCE_MIB = 256.0


def tolerance_mib(device: DeviceReport) -> float:
    """How far the processes' memory may exceed the device's used memory: 256 MiB or 2 % of
    the device's total, whichever is larger (rounding, pages mapped by two processes)."""
    return max(TOLERANCE_MIB, 0.02 * (device.memory_total_mib or 0.0))


@dataclass(frozen=True, slots=True)
class ProcStat:
    """State letter and start time (clock ticks since boot) of one process."""

    state: str
    start_ticks: int


def read_proc_stat(pid: int, proc: Path = Path("/proc")) -> ProcStat | None:
    """``/proc/PID/stat`` fields 3 (state) and 22 (starttime); ``None`` when gone or unreadable."""
    try:
        _comm, state, ticks = stat_fields(read_stat(pid, proc))
    except (OSError, ValueError):
        return None
    return ProcStat(state, ticks)


class ProcessDataChecker:
    """Sets ``process_data``, its detail and ``last_owner`` on a snapshot's devices.

    :param stat: pid -> :class:`ProcStat` (``None`` when gone); injectable for tests.
    """

    def __init__(self, stat: Callable[[int], ProcStat | None] = read_proc_stat) -> None:
        self.stat = stat
        self.live = True
        # device uuid -> (pid, start ticks, unix user) of the processes last listed on it
        self._last: dict[str, list[tuple[int, int, str]]] = {}

    def check(self, snap: Snapshot, *, live: bool = True) -> None:
        """Judge every device of ``snap`` in place (see module doc). ``live``: the pids are this
        host's (False for replayed captures: no zombie check, no owner lookups)."""
        self.live = live
        by_dev: dict[str, list[ProcessReport]] = {}
        for p in snap.processes:
            by_dev.setdefault(p.device_uuid, []).append(p)
        children: dict[str, list[str]] = {}
        for d in snap.devices:
            if d.parent_uuid:
                children.setdefault(d.parent_uuid, []).append(d.uuid)
        for d in snap.devices:
            if d.health != "ok" or d.processes_status != "ok" or snap.stale:
                continue
            span = [d.uuid, *children.get(d.uuid, [])]
            procs = [p for u in span for p in by_dev.get(u, [])]
            stats = {p.pid: self.stat(p.pid) for p in procs} if self.live else {}
            self._judge(d, procs, stats, has_children=bool(children.get(d.uuid)))
            if self.live:
                seen = [(p.pid, stats[p.pid].start_ticks, p.unix_user) for p in procs
                        if p.unix_user and stats.get(p.pid) is not None and stats[p.pid].state != "Z"]
                if seen:
                    self._last[d.uuid] = seen

    def _judge(self, d: DeviceReport, procs: list[ProcessReport], stats: dict[int, ProcStat | None],
               *, has_children: bool) -> None:
        used = d.memory_used_mib
        listed = sum(p.used_memory_mib for p in procs if p.used_memory_mib is not None)
        zombies = [p for p in procs if (stats.get(p.pid) is not None and stats[p.pid].state == "Z")]  # type: ignore[union-attr]
        if used is not None and listed > used + tolerance_mib(d):
            d.process_data = "unreliable"
            d.process_data_detail = (f"processes hold {listed:.0f} MiB but the device has {used:.0f} MiB in use; "
                                     "process data not trusted, no findings on it")
        elif zombies:
            z = zombies[0]
            d.process_data = "defunct"
            d.last_owner = z.unix_user or self._owner(d.uuid)
            d.process_data_detail = f"memory held by defunct (zombie) process {z.pid}"[:512]
        elif not procs and not has_children and used is not None and used > UNLISTED_MIB:
            d.process_data = "unlisted"
            d.last_owner = self._owner(d.uuid) if self.live else None
            d.process_data_detail = f"{used:.0f} MiB in use but no process listed"

    def _owner(self, uuid: str) -> str | None:
        """The user of the process last seen on ``uuid``, if that process still exists unchanged."""
        for pid, ticks, user in self._last.get(uuid, []):
            now = self.stat(pid)
            if now is not None and now.start_ticks == ticks:
                return user
        return None


def judged_view(snap: Snapshot) -> tuple[Snapshot, set[str]]:
    """The snapshot as the enforcer may judge it, and the devices it must not judge.

    Devices whose process data is not "ok" (and MIG instances of such a GPU) are marked
    ``processes_status="unavailable"`` and their processes removed, so no finding is raised
    and nothing is signalled on such evidence.
    """
    flagged = {d.uuid for d in snap.devices if d.process_data != "ok"}
    if not flagged:
        return snap, flagged
    flagged |= {d.uuid for d in snap.devices if d.parent_uuid in flagged}
    devices = [d.model_copy(update={"processes_status": "unavailable"}) if d.uuid in flagged else d for d in snap.devices]
    processes = [p for p in snap.processes if p.device_uuid not in flagged]
    return snap.model_copy(update={"devices": devices, "processes": processes}), flagged
