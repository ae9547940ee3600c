"""Host and device schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.models.states import DeviceStatus, HostStatus


class HostCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128)


class HostUpdate(BaseModel):
    """Admin changes to a host's enforcement settings (any subset)."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["observe", "notify", "terminate"] | None = None
    grace_seconds: int | None = Field(default=None, ge=0, le=86400)
    kill_timeout_seconds: int | None = Field(default=None, ge=1, le=3600)
    notice_interval_seconds: int | None = Field(default=None, ge=0, le=7 * 86400)
    min_uid: int | None = Field(default=None, ge=0)
    exempt_users: list[str] | None = Field(default=None, max_length=256)
    exempt_process_names: list[str] | None = Field(default=None, max_length=256)
    idle_minutes: int | None = Field(default=None, ge=1, le=7 * 24 * 60)


class HostRead(BaseModel):
    name: str
    policy: str
    grace_seconds: int
    kill_timeout_seconds: int
    notice_interval_seconds: int
    min_uid: int
    exempt_users: list[str]
    exempt_process_names: list[str] | None
    idle_minutes: int
    last_seen_at: datetime | None
    seconds_since_snapshot: float | None
    status: str = Field(description=" | ".join(HostStatus))
    monitoring_message: str | None
    source: str | None = Field(description="nvml | replay")
    replay_of: list[str] | None
    agent_version: str | None
    driver_version: str | None
    cuda_version: str | None
    suspect: bool
    suspect_reasons: list[str] | None
    clock_offset_s: float | None = Field(default=None, description="service minus host clock, seconds (agent-measured)")
    clock_trouble: str | None = Field(default=None, description="the last implausible collected_at, within the last day")
    device_count: int


class HostCreated(HostRead):
    token: str = Field(description="the host token, shown once")


class TelemetryRead(BaseModel):
    collected_at: datetime
    memory_used_mib: float | None
    utilization_gpu: float | None
    utilization_memory: float | None
    temperature_c: float | None
    power_draw_w: float | None
    power_limit_w: float | None
    throttle_reasons: list[str] | None
    ecc_uncorrected: int | None
    retired_pages: int | None
    health: str
    error: str | None
    processes_status: str
    processes_error: str | None
    memory_reserved_mib: float | None = None
    process_data: str = Field(default="ok", description="ok | unreliable | unlisted | defunct")
    process_data_detail: str | None = None
    last_owner: str | None = None


class ProcessRead(BaseModel):
    pid: int
    type: str
    used_memory_mib: float | None
    unix_user: str | None
    uid: int | None
    command: str | None
    name: str | None
    container_id: str | None
    owner_status: str
    owner: str | None = Field(
        default=None,
        description="who the process is shown as: its user, 'user-c (uid 20001)', "
        "'uid 20001, unknown to gpuroster' or 'unattributed container'",
    )
    finding: str | None = Field(default=None, description="kind of an open finding on this process, if any")


class HolderRead(BaseModel):
    reservation_id: int
    user: str
    start: datetime
    end: datetime


class QuarantineRef(BaseModel):
    """The open health quarantine that keeps a device from booking (its own, or its GPU's)."""

    reason: str
    since: datetime
    self_clearing: bool = Field(description="lifts by itself once the condition has been gone a while")


class DeviceRead(BaseModel):
    uuid: str = Field(description="NVML UUID (MIG-… for a MIG slice): the stable identifier to book and script with")
    host: str
    index: int | None
    label: str = Field(description='the name people read: "GPU 0", or "GPU 0 · MIG 4" for GPU instance 4 of GPU 0')
    name: str | None
    pci_bus_id: str | None
    memory_total_mib: float | None
    parent_uuid: str | None
    mig_profile: str | None
    is_open: bool
    retired: bool
    last_seen_at: datetime | None
    telemetry: TelemetryRead | None
    processes: list[ProcessRead]
    holder: HolderRead | None
    next_reservation: HolderRead | None
    status: str = Field(description=" | ".join(DeviceStatus))
    quarantine: QuarantineRef | None = Field(default=None, description="set while quarantined for health (docs/health.md)")


class DeviceUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    retired: bool | None = None
    is_open: bool | None = None


class DeviceMove(BaseModel):
    """``POST /api/v1/devices/{uuid}/move``: register a GPU to another host (admins)."""

    model_config = ConfigDict(extra="forbid")
    host: str = Field(min_length=1, max_length=128, description="the host the GPU now belongs to")


class DeviceConflictRead(BaseModel):
    """A host reported a device registered to another host; refused until an admin moves it."""

    uuid: str
    device_name: str | None
    owner_host: str
    claimed_by: str
    first_at: datetime
    last_at: datetime
    count: int
