"""The wire contract between the agent and the service, defined once.

The agent posts a :class:`Snapshot` to ``POST /api/v1/agent/snapshots`` with its host token;
the service answers with a :class:`SnapshotAck` carrying the host's reservation table and
policy. Units: memory in MiB, utilization in %, temperature in °C, power in W, times as
timezone-aware UTC datetimes, ``create_time`` in seconds since the epoch (psutil's
``Process.create_time()``, shown to people; it moves when the clock is stepped), ``identity``
``<start ticks>@<boot id>`` (what the agent identifies a process by, see :mod:`agent.procid`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

ProcessType = Literal["C", "G", "C+G"]
DeviceHealth = Literal["ok", "lost", "error"]
# How the process owner was found: "ok" resolved; "exited" the process ended between the
# NVML listing and the lookup; "access_denied" psutil raised AccessDenied (hidepid, other
# account); "not_visible" the pid does not exist in the agent's PID namespace; "replay"
# owner given by a replay owners map; "unknown" no information at all; "uid_only" the uid is
# known but has no passwd entry in the agent's view (directory users: judged by uid through the
# ack's ``unix_uids``); "unattributed" a process in a container whose owner no rule names.
OwnerStatus = Literal["ok", "exited", "access_denied", "not_visible", "replay", "unknown", "uid_only", "unattributed"]
# Host-wide monitoring state: "ok"; "degraded" (some data missing, e.g. process listing
# unavailable or wrong PID namespace); "down" (NVML failed, e.g. driver/library mismatch);
# "no_driver" (no NVIDIA driver on this node: 0 GPUs, not an error); "misconfigured" (NVML
# library missing where the config says the host has GPUs).
MonitoringStatus = Literal["ok", "degraded", "down", "no_driver", "misconfigured"]
# Whether a device's process list agrees with its memory figures: "ok"; "unreliable" (the
# processes' memory sums beyond the device's used memory: the list cannot be trusted, no
# findings on it); "unlisted" (memory in use, no process listed); "defunct" (memory held by a
# zombie process). Nothing is ever signalled on a device that is not "ok".
ProcessData = Literal["ok", "unreliable", "unlisted", "defunct"]
# "unattributed": a container process whose owner cannot be found; "unknown_uid": a host
# process whose uid has no name on the host and no gpuroster user. Both go to admins and are
# never signalled: nobody can tell whose job it is.
FindingKind = Literal["unreserved", "foreign", "overrun", "idle", "unattributed", "unknown_uid"]
FindingState = Literal["open", "notified", "terminated", "resolved"]
Policy = Literal["observe", "notify", "terminate"]
# Device health readings (see HealthCheck): an XID error event, volatile uncorrectable ECC
# errors, retired pages or remapped rows waiting for a GPU reset, a failed row remap, a GPU
# fallen off the bus, and clocks slowed down for temperature or power.
HealthKind = Literal["xid", "ecc_uncorrected", "retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure",
                     "gpu_lost", "thermal_slowdown", "power_slowdown"]
# "ok": read and fine; "bad": read and showing the condition; "unknown": NVML (or the
# capture) could not say (NotSupported, N/A), never to be read as "ok" nor as a failure.
HealthState = Literal["ok", "bad", "unknown"]

_STRICT = ConfigDict(extra="forbid")


def _utc(v: datetime) -> datetime:
    """An aware datetime in UTC; naive ones and ones that cannot be expressed in UTC refused."""
    if v.tzinfo is None or v.utcoffset() is None:
        raise ValueError("needs a timezone offset (UTC expected)")
    try:
        return v.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        raise ValueError("out of range: not a time that exists in UTC") from None


# Every time the agent sends: timezone-aware, normalised to UTC (a naive or out-of-range
# time is a 422 naming the field, never a 500 further down).
UtcDatetime = Annotated[datetime, AfterValidator(_utc)]


class HealthCheck(BaseModel):
    """One health reading of a device, as the agent saw it in this poll.

    ``value`` by kind: ``xid`` the XID code of one error event since the previous poll (one
    check per event); ``ecc_uncorrected`` the volatile uncorrectable ECC error count since the
    last driver load; ``retired_pages_pending``/``remapped_rows_pending`` the pages/rows
    affected where known; otherwise ``None``. Whether a reading is critical is the service's
    rule (:func:`app.services.health_rule.critical_conditions`), not the agent's.
    """

    model_config = _STRICT

    kind: HealthKind
    state: HealthState = "ok"
    value: int | None = Field(default=None, ge=0)
    detail: str | None = Field(default=None, max_length=256)


class DeviceReport(BaseModel):
    """One reservable device (a whole GPU, or a MIG instance with ``parent_uuid`` set).

    Every telemetry field is ``None`` when NVML could not say (NotSupported, NoPermission,
    N/A in a capture); ``None`` is never to be read as 0.
    """

    model_config = _STRICT

    uuid: str = Field(min_length=1, max_length=128, description="NVML UUID, GPU-… or MIG-…")
    index: int | None = Field(default=None, ge=0, description="NVML index (PCI order); MIG: GI id order")
    name: str | None = Field(default=None, max_length=256)
    pci_bus_id: str | None = Field(default=None, max_length=64)
    memory_total_mib: float | None = Field(default=None, ge=0)
    memory_used_mib: float | None = Field(default=None, ge=0, description="as nvidia-smi shows it (NVML v2 structure)")
    memory_reserved_mib: float | None = Field(
        default=None, ge=0, description="driver-reserved memory, apart from used (NVML v2 structure, drivers >= 510)"
    )
    utilization_gpu: float | None = Field(default=None, ge=0, le=100, description="%")
    utilization_memory: float | None = Field(default=None, ge=0, le=100, description="%")
    temperature_c: float | None = None
    power_draw_w: float | None = Field(default=None, ge=0)
    power_limit_w: float | None = Field(default=None, ge=0)
    throttle_reasons: list[str] | None = None
    ecc_uncorrected: int | None = Field(default=None, ge=0)
    retired_pages: int | None = Field(default=None, ge=0)
    persistence_mode: bool | None = None
    compute_mode: str | None = Field(default=None, max_length=64)
    mig_mode: bool | None = None
    parent_uuid: str | None = Field(default=None, max_length=128, description="MIG: the parent GPU's UUID")
    mig_profile: str | None = Field(default=None, max_length=64, description="MIG: e.g. 3g.40gb")
    gpu_instance_id: int | None = Field(default=None, ge=0)
    compute_instance_id: int | None = Field(default=None, ge=0)
    link_group: str | None = Field(
        default=None, max_length=128, description="devices sharing a value are close (NVLink / PCIe switch)"
    )
    health: DeviceHealth = "ok"
    error: str | None = Field(default=None, max_length=1024)
    health_checks: list[HealthCheck] = Field(
        default_factory=list, max_length=64,
        description="health readings of this poll (XID events, ECC, pending retirement/remap, lost, slowdown); "
        "empty when the source reads none",
    )
    processes_status: Literal["ok", "unavailable", "error"] = "ok"
    processes_error: str | None = Field(default=None, max_length=1024)
    process_data: ProcessData = "ok"
    process_data_detail: str | None = Field(default=None, max_length=512)
    last_owner: str | None = Field(
        default=None, max_length=64, description="unlisted/defunct: the Unix user whose process was last seen here, "
        "named only while that process (pid and start time) still exists"
    )

    @field_validator("uuid", "parent_uuid")
    @classmethod
    def _strip(cls, v: str | None) -> str | None:
        return v.strip() if isinstance(v, str) else v


class ProcessReport(BaseModel):
    """One process on one device (compute and graphics lists merged by pid)."""

    model_config = _STRICT

    device_uuid: str = Field(min_length=1, max_length=128)
    pid: int = Field(gt=0, lt=2**32 - 1)
    type: ProcessType = "C"
    used_memory_mib: float | None = Field(default=None, ge=0, description="None: NVML could not say (WDDM, vGPU)")
    uid: int | None = Field(default=None, ge=0, description="the process's real uid (0 for root in a container)")
    unix_user: str | None = Field(
        default=None, max_length=64,
        description="who the process is judged as: its passwd name, or in a container the container's owner",
    )
    command: str | None = Field(default=None, max_length=4096)
    name: str | None = Field(default=None, max_length=256, description="process name; '(unnamed)' when empty")
    create_time: float | None = Field(default=None, ge=0, description="seconds since the epoch")
    identity: str | None = Field(default=None, max_length=80, description="<start ticks since boot>@<boot id>")
    container_id: str | None = Field(default=None, max_length=128)
    container_name: str | None = Field(default=None, max_length=256)
    container_image: str | None = Field(default=None, max_length=512)
    owner_source: Literal["passwd", "label", "name", "compose"] | None = Field(
        default=None, description="how unix_user was found: passwd entry, or a container rule"
    )
    exe: str | None = Field(
        default=None, max_length=4096, description="verified system executable (root-owned, host mount namespace), else None"
    )
    owner_status: OwnerStatus = "ok"


class NoticeReport(BaseModel):
    """A notice the agent delivered on the host (terminal message) for a finding."""

    model_config = _STRICT

    channel: Literal["terminal"] = "terminal"
    recipient: str = Field(max_length=64)
    at: UtcDatetime
    delivered: int = Field(default=0, ge=0, description="number of terminals written")
    detail: str | None = Field(default=None, max_length=2048)


class ActionReport(BaseModel):
    """An enforcement action the agent took or, with --dry-run, would have taken."""

    model_config = _STRICT

    action: Literal["sigterm", "sigkill", "skipped", "dry_run"]
    pid: int = Field(gt=0)
    create_time: float | None = None
    at: UtcDatetime
    reason: str = Field(max_length=1024)


class FindingReport(BaseModel):
    """A debounced finding: one per (process, device, kind), updated on every poll."""

    model_config = _STRICT

    key: str = Field(min_length=1, max_length=256, description="stable id: uuid:pid:identity:kind")
    kind: FindingKind
    device_uuid: str = Field(max_length=128)
    pid: int | None = Field(default=None, gt=0)
    create_time: float | None = None
    identity: str | None = Field(default=None, max_length=80, description="<start ticks since boot>@<boot id>")
    unix_user: str | None = Field(default=None, max_length=64)
    uid: int | None = None
    command: str | None = Field(default=None, max_length=4096)
    container_id: str | None = Field(default=None, max_length=128)
    container_name: str | None = Field(default=None, max_length=256)
    container_image: str | None = Field(default=None, max_length=512)
    reservation_id: int | None = Field(default=None, description="the reservation the process conflicts with or overran")
    holder: str | None = Field(default=None, max_length=64, description="unix_name of the rightful holder, if any")
    first_seen: UtcDatetime
    last_seen: UtcDatetime
    state: FindingState = "open"
    message: str | None = Field(default=None, max_length=2048)
    notices: list[NoticeReport] = Field(default_factory=list)
    actions: list[ActionReport] = Field(default_factory=list)


class MonitoringReport(BaseModel):
    model_config = _STRICT

    status: MonitoringStatus = "ok"
    message: str | None = Field(default=None, max_length=2048)


class Snapshot(BaseModel):
    """One poll of a host: telemetry per device, usage per process, and findings.

    ``seq`` rises within one agent process (``agent_instance``, a random id drawn at every
    start); the service ingests idempotently by ``(host, agent_instance, seq)``, so a restart
    with a wiped state directory, which numbers from 0 again, never collides with what the
    previous agent sent. ``collected_at`` is in service time (the agent's clock corrected by
    ``clock_offset_s``).
    """

    model_config = _STRICT

    host: str = Field(min_length=1, max_length=128)
    seq: int = Field(ge=0, lt=2**63)
    agent_instance: str | None = Field(
        default=None, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
        description="random id of the agent process that numbered seq; (host, agent_instance, seq) is the idempotency key",
    )
    collected_at: UtcDatetime
    clock_offset_s: float | None = Field(
        default=None, ge=-1e9, le=1e9,
        description="service time minus the agent host's clock, seconds, measured from the last ack's server_time",
    )
    trimmed: str | None = Field(default=None, max_length=512, description="what the agent cut to stay under the body limit")
    agent_version: str | None = Field(default=None, max_length=64)
    source: Literal["nvml", "replay"] = "nvml"
    replay_of: list[str] | None = Field(default=None, description="replay: capture file names")
    interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    driver_version: str | None = Field(default=None, max_length=64)
    nvml_version: str | None = Field(default=None, max_length=64)
    cuda_version: str | None = Field(default=None, max_length=64)
    binding_version: str | None = Field(default=None, max_length=64)
    monitoring: MonitoringReport = Field(default_factory=MonitoringReport)
    stale: bool = Field(default=False, description="NVML did not answer within the poll deadline")
    suspect: bool = False
    suspect_reasons: list[str] = Field(default_factory=list)
    pid_namespace_ok: bool | None = None
    devices: list[DeviceReport] = Field(default_factory=list, max_length=1024)
    processes: list[ProcessReport] = Field(default_factory=list, max_length=16384)
    findings: list[FindingReport] = Field(default_factory=list, max_length=16384)



class ReservationEntry(BaseModel):
    """A reservation as the agent needs it to judge processes: half-open ``[start, end)``."""

    id: int
    user: str = Field(description="the holder's username")
    unix_name: str = Field(description="the holder's Unix account, used to match processes")
    device_uuids: list[str]
    start: datetime
    end: datetime
    shared_with: list[str] = Field(default_factory=list, description="unix names also covered")
    unix_uid: int | None = Field(default=None, description="the holder's Unix uid, where the service knows it")
    shared_uids: list[int] = Field(default_factory=list, description="Unix uids also covered")


class HostPolicy(BaseModel):
    """Per-host enforcement settings, set by admins on the service."""

    policy: Policy = "notify"
    grace_seconds: int = Field(default=60, ge=0)
    kill_timeout_seconds: int = Field(default=10, ge=1)
    notice_interval_seconds: int = Field(default=900, ge=0, description="at most one notice per finding per interval")
    min_uid: int = Field(default=1000, ge=0, description="uids below are system accounts, always exempt")
    exempt_users: list[str] = Field(default_factory=list)
    exempt_process_names: list[str] = Field(
        default_factory=lambda: ["Xorg", "Xwayland", "gnome-shell", "kwin_wayland", "nv-hostengine", "nvidia-persistenced", "dcgm-exporter"]
    )
    idle_minutes: int = Field(default=60, ge=1, description="a reservation idle this long becomes an 'idle' finding")
    idle_utilization_pct: float = Field(default=5.0, ge=0, le=100)


class SnapshotAck(BaseModel):
    """The service's answer to a snapshot: what the agent caches until the next one."""

    accepted: bool
    duplicate: bool = False
    conflict: str | None = Field(
        default=None, description="set with duplicate=true when the seq was already used by a different snapshot"
    )
    seq: int
    server_time: datetime
    policy: HostPolicy
    reservations: list[ReservationEntry]
    open_devices: list[str] = Field(default_factory=list, description="UUIDs anyone may use unreserved")
    unix_uids: dict[int, str] = Field(
        default_factory=dict, description="Unix uid -> unix_name of every active user with a uid (directory users)"
    )
    booking_url: str | None = None
