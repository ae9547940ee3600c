"""Usage report schemas: GPU-hours booked versus used, per user, group and reservation."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class UsageFigures(BaseModel):
    """GPU-hours over reserved device-time; ``reserved = used + idle + unmonitored``.

    A reserved minute counts as *used* when a process of the holder (or of a user the
    reservation is shared with) ran on the device in that minute and the device's mean
    utilization was at least the threshold (or NVML could not say, as for MIG instances);
    *idle* when the agent reported the device but the holder did not compute; *unmonitored*
    when no snapshot covered that minute (agent down, or history pruned).
    """

    reserved_gpu_hours: float = Field(description="device-hours reserved in the period")
    used_gpu_hours: float = Field(description="reserved device-hours in which the holder computed")
    idle_gpu_hours: float = Field(description="reserved device-hours reported idle for the holder")
    unmonitored_gpu_hours: float = Field(description="reserved device-hours without any snapshot")
    used_fraction: float | None = Field(description="used / (used + idle); None when nothing was monitored")


class UserUsage(UsageFigures):
    user: str
    reservations: int = Field(description="reservations overlapping the period (cancelled ones excluded)")
    findings: dict[str, int] = Field(description="findings in the period by kind (unreserved, foreign, overrun, idle, "
                                                 "no_show, idle_holder, ...)")
    no_shows: int = Field(default=0, description="reservations released for want of a check-in")
    consent_releases: int = Field(default=0, description="reservations released (all or some devices) after "
                                                         "\"still using it?\": by silence or by the holder")
    checked_in_idle_gpu_hours: float = Field(default=0.0, description="idle GPU-hours after the holder checked in")
    quarantined_gpu_hours: float = Field(default=0.0, description="reserved GPU-hours while the device (or a MIG "
                                                                  "instance's GPU) was quarantined")


class ReservationUsage(UsageFigures):
    id: int
    user: str
    host: str
    devices: list[str] = Field(description="device UUIDs")
    start: datetime
    end: datetime
    status: str
    checked_in_at: datetime | None = Field(default=None, description="first holder process on its devices")
    auto_release: str | None = Field(default=None, description="no_show | idle | idle_devices | idle_consent")
    checked_in_idle_gpu_hours: float = Field(default=0.0, description="idle GPU-hours after the check-in")
    quarantined_gpu_hours: float = Field(default=0.0, description="reserved GPU-hours while the device was quarantined")


class HostUsage(UsageFigures):
    """One host: the scope's reservations on it, and the host's quarantine time (all users)."""

    host: str
    reservations: int = Field(description="the scope's reservations on the host overlapping the period")
    no_shows: int = Field(default=0, description="the scope's reservations on the host released for want of a check-in")
    consent_releases: int = Field(default=0, description="the scope's releases on the host after \"still using it?\"")
    checked_in_idle_gpu_hours: float = Field(default=0.0, description="the scope's idle GPU-hours after check-in")
    quarantined_gpu_hours: float = Field(default=0.0, description="the scope's reserved GPU-hours on quarantined devices")
    quarantined_device_hours: float = Field(default=0.0, description="hours any device of the host was quarantined in "
                                                                     "the period, summed over devices, whoever booked")
    quarantines: int = Field(default=0, description="quarantines of the host's devices overlapping the period")


class UsageReport(BaseModel):
    """The booked-versus-used report of a user or a group for ``[start, end)``."""

    scope: Literal["user", "group"]
    name: str
    start: datetime = Field(description="period start, UTC")
    end: datetime = Field(description="period end (exclusive), UTC")
    until: datetime = Field(description="figures cover [start, until): the period end or now, whichever is earlier")
    threshold_pct: float = Field(description="mean utilization (%) from which a minute with the holder's process counts as used")
    totals: UserUsage = Field(description="the sum over users (user: the scope's name)")
    users: list[UserUsage]
    reservations: list[ReservationUsage]
    hosts: list[HostUsage] = Field(default_factory=list, description="per host: the scope's reservations there, and "
                                   "every host with quarantined time in the period")
    quarantined_device_hours: float = Field(default=0.0, description="quarantined device-hours of all hosts in the period")
