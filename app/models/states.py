"""Statuses and states as enums, one place for each set of names.

Members are ``StrEnum`` s whose values are the strings stored in the database, sent by the API
and used as CSS hooks (``data-status``), so ``DeviceStatus.FREE == "free"`` and a member can
go wherever the string went. A new state is added here, where every reader of the set looks.
"""

from __future__ import annotations

from enum import StrEnum


class DeviceStatus(StrEnum):
    """What a device is doing now, as the Now page, ``GET /api/v1/devices`` and
    ``gpuroster status`` show it; the first that applies wins, in this order."""

    RETIRED = "retired"
    LOST = "lost"  # the agent reported the GPU lost (NVML_ERROR_GPU_IS_LOST)
    STALE = "stale"  # the host's agent has not reported for a few intervals
    MONITORING_DOWN = "monitoring-down"  # the agent reports but cannot read NVML
    OCCUPIED_UNLISTED = "occupied-unlisted"  # memory held by a process NVML does not list, or a defunct one
    UNRELIABLE = "unreliable"  # the process list disagrees with the memory figures
    FINDING = "finding"  # a process on it has an open finding
    IN_USE = "in-use"  # a compute process runs on it
    RESERVED_IDLE = "reserved-idle"  # someone holds it and nothing runs
    FREE = "free"


class HostStatus(StrEnum):
    """A host's agent as the service sees it: ``NEVER`` and ``STALE`` from the time of its last
    snapshot, the others as the agent reports its own monitoring."""

    NEVER = "never"
    STALE = "stale"
    OK = "ok"
    DEGRADED = "degraded"
    DOWN = "down"
    NO_DRIVER = "no_driver"
    MISCONFIGURED = "misconfigured"


class FindingKind(StrEnum):
    """Why the agent flagged a process or a reservation."""

    UNRESERVED = "unreserved"  # its owner holds no reservation of the device
    FOREIGN = "foreign"  # the device is reserved by someone else
    OVERRUN = "overrun"  # it outlived its owner's reservation
    IDLE = "idle"  # a reservation whose holder runs nothing
    UNATTRIBUTED = "unattributed"  # a container whose owner no rule names
    UNKNOWN_UID = "unknown_uid"  # a host process whose uid maps to no user
    NO_SHOW = "no_show"  # the service: no holder process on a reservation's devices by its check-in time
    IDLE_HOLDER = "idle_holder"  # the service: a checked-in holder's devices hold memory, compute idle


class FindingState(StrEnum):
    """Where a finding stands; ``OPEN`` and ``NOTIFIED`` are still live (``LIVE``)."""

    OPEN = "open"
    NOTIFIED = "notified"
    TERMINATED = "terminated"
    RESOLVED = "resolved"


class WaitlistStatus(StrEnum):
    """What ``waitlist_entries.status`` stores; ``waiting`` past its window's end is shown
    (and, once met by the service, stored) as ``expired``."""

    WAITING = "waiting"
    BOOKED = "booked"  # auto-book: a reservation was made for the owner (``reservation_id``)
    NOTIFIED = "notified"  # notify-only: the owner was told the slot is free
    CANCELLED = "cancelled"  # the owner (or an admin) withdrew it
    EXPIRED = "expired"  # its window ended while it waited


#: finding states that still need attention (shown, counted as open, notified again)
LIVE_FINDING_STATES = (FindingState.OPEN, FindingState.NOTIFIED)

__all__ = ["DeviceStatus", "FindingKind", "FindingState", "HostStatus", "LIVE_FINDING_STATES", "WaitlistStatus"]
