"""What a telemetry source (NVML or replay) hands to the snapshot builder.

A source reports devices as finished :class:`~agent.schema.DeviceReport` objects and
processes as :class:`RawProcess` rows that still lack an owner; the builder
(:mod:`agent.collect`) resolves owners and assembles the :class:`~agent.schema.Snapshot`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from agent.schema import DeviceReport, MonitoringReport

log = logging.getLogger("gpuroster.agent")

PID_SENTINEL = 2**32 - 1
PID_MAX_LIMIT = 4_194_304  # Linux's upper bound for pid_max on 64-bit


@dataclass(slots=True)
class RawProcess:
    """One process row from a source, before owner lookup.

    ``used_memory_mib`` is ``None`` when unknown (WDDM, vGPU, N/A), never 0 for "unknown".
    ``command`` is only set by replay (the capture's ``process_name``); live processes get
    their command line from psutil.
    """

    device_uuid: str
    pid: int
    type: Literal["C", "G", "C+G"] = "C"
    used_memory_mib: float | None = None
    command: str | None = None


@dataclass(slots=True)
class Telemetry:
    """One poll of a source: devices, processes and the host-wide state."""

    source: Literal["nvml", "replay"]
    devices: list[DeviceReport] = field(default_factory=list)
    processes: list[RawProcess] = field(default_factory=list)
    monitoring: MonitoringReport = field(default_factory=MonitoringReport)
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_version: str | None = None
    binding_version: str | None = None
    suspect_reasons: list[str] = field(default_factory=list)
    stale: bool = False
    replay_of: list[str] | None = None
    # replay only: pid -> owner entry from the owners map (see agent.replay.load_owners)
    replay_owners: dict[int, dict] | None = None


class Source(Protocol):
    """A telemetry source: NVML on this host, or replayed ``nvidia-smi -q -x`` captures."""

    def poll(self) -> Telemetry:
        """Take one reading. Never raises for NVML or capture errors; reports them instead."""
        ...

    def close(self) -> None:
        """Release the source (NVML shutdown, worker thread)."""
        ...


_warned: set[str] = set()


def warn_once(key: str, msg: str, *args: object, level: int = logging.WARNING) -> None:
    """Log ``msg`` the first time ``key`` is seen in this process, then stay quiet."""
    if key in _warned:
        return
    _warned.add(key)
    log.log(level, msg, *args)


def reset_warnings() -> None:
    """Forget which warnings were logged (tests; a new agent run)."""
    _warned.clear()


def to_str(value: object, what: str = "value") -> str | None:
    """Normalise bytes / str / None from a binding to ``str`` (bindings
    differ in whether they decode names).

    Undecodable bytes are decoded with U+FFFD replacement and logged once per ``what``.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = value.decode("utf-8", errors="replace")
            warn_once(f"undecodable:{what}", "%s from NVML is not valid UTF-8 (%r); decoded with replacement", what, value)
    else:
        text = str(value)
    return text.strip("\x00").strip()


def read_pid_max(path: Path = Path("/proc/sys/kernel/pid_max")) -> int:
    """The kernel's ``pid_max`` (pids are < this); Linux's limit when it cannot be read."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def bogus_pid(pid: object, pid_max: int) -> bool:
    """True for pids NVML cannot really have returned: 0, negative, >= pid_max, 2^32-1
    (what an nvidia-ml-py reading the process struct at the wrong stride produces)."""
    return not isinstance(pid, int) or pid <= 0 or pid >= pid_max or pid >= PID_SENTINEL
