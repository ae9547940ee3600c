"""Hosts (GPU servers running the agent), devices, and their latest telemetry."""

from __future__ import annotations

from datetime import datetime


from sqlalchemy import false as sa_false
from sqlalchemy import JSON, BigInteger, Boolean, CheckConstraint, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.models.base import Base, utcnow

POLICIES = ("observe", "notify", "terminate")


class Host(Base):
    """A GPU server. Authenticates with its own host token (stored as SHA-256)."""

    __tablename__ = "hosts"
    __table_args__ = (CheckConstraint("policy IN ('observe', 'notify', 'terminate')", name="policy"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    policy: Mapped[str] = mapped_column(String(16), default="notify")
    grace_seconds: Mapped[int] = mapped_column(Integer, default=60)
    kill_timeout_seconds: Mapped[int] = mapped_column(Integer, default=10)
    notice_interval_seconds: Mapped[int] = mapped_column(Integer, default=900)
    min_uid: Mapped[int] = mapped_column(Integer, default=1000)
    exempt_users: Mapped[list[str]] = mapped_column(JSON, default=list)
    exempt_process_names: Mapped[list[str] | None] = mapped_column(JSON)
    idle_minutes: Mapped[int] = mapped_column(Integer, default=60)
    feed_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)  # SHA-256 of the calendar feed token
    # What the agent last said about itself
    last_seen_at: Mapped[datetime | None]
    last_seq: Mapped[int | None] = mapped_column(BigInteger)
    last_collected_at: Mapped[datetime | None]
    interval_seconds: Mapped[float | None] = mapped_column(Float)
    agent_version: Mapped[str | None] = mapped_column(String(64))
    driver_version: Mapped[str | None] = mapped_column(String(64))
    nvml_version: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(64))
    source: Mapped[str | None] = mapped_column(String(16))
    replay_of: Mapped[list[str] | None] = mapped_column(JSON)
    monitoring_status: Mapped[str | None] = mapped_column(String(32))
    monitoring_message: Mapped[str | None] = mapped_column(String(2048))
    stale: Mapped[bool] = mapped_column(Boolean, default=False)
    suspect: Mapped[bool] = mapped_column(Boolean, default=False)
    suspect_reasons: Mapped[list[str] | None] = mapped_column(JSON)
    # service time minus the host's clock, seconds, as the agent measured it from its acks
    clock_offset_s: Mapped[float | None] = mapped_column(Float)
    # the last snapshot whose collected_at was implausible (future or too old), and when
    clock_trouble: Mapped[str | None] = mapped_column(String(512))
    clock_trouble_at: Mapped[datetime | None]
    # some device of this host is quarantined or has acknowledged health conditions: ingest
    # then looks at health state even for a snapshot that shows no critical condition
    health_watch: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    devices: Mapped[list["Device"]] = relationship(back_populates="host", lazy="raise", order_by="Device.index")


class Device(Base):
    """A reservable GPU or MIG instance, identified by its NVML UUID (never by index alone)."""

    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    uuid: Mapped[str] = mapped_column(String(128), unique=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    index: Mapped[int | None] = mapped_column(Integer)
    name: Mapped[str | None] = mapped_column(String(256))
    pci_bus_id: Mapped[str | None] = mapped_column(String(64))
    memory_total_mib: Mapped[float | None] = mapped_column(Float)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id", ondelete="SET NULL"), index=True)
    mig_profile: Mapped[str | None] = mapped_column(String(64))
    gpu_instance_id: Mapped[int | None] = mapped_column(Integer)
    compute_instance_id: Mapped[int | None] = mapped_column(Integer)
    mig_mode: Mapped[bool | None] = mapped_column(Boolean)
    link_group: Mapped[str | None] = mapped_column(String(128))
    is_open: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime | None]
    retired_at: Mapped[datetime | None]
    # condition keys an admin cleared a quarantine over while they still showed (an ECC count,
    # a pending retirement): they do not quarantine the device again until they change or go
    health_ack: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))

    host: Mapped[Host] = relationship(back_populates="devices", lazy="raise")
    parent: Mapped["Device | None"] = relationship(remote_side="Device.id", lazy="raise")
    telemetry: Mapped["DeviceTelemetry | None"] = relationship(lazy="raise", uselist=False)

    @property
    def physical_id(self) -> int:
        """The id of the physical GPU: the parent for a MIG instance, else this device."""
        return self.parent_id or self.id


class DeviceTelemetry(Base):
    """The latest telemetry of one device (one row per device, replaced on every snapshot).

    Units: MiB, %, °C, W. ``None`` means NVML could not say; it is never shown as 0.
    """

    __tablename__ = "device_telemetry"

    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True)
    collected_at: Mapped[datetime]
    memory_used_mib: Mapped[float | None] = mapped_column(Float)
    utilization_gpu: Mapped[float | None] = mapped_column(Float)
    utilization_memory: Mapped[float | None] = mapped_column(Float)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    power_draw_w: Mapped[float | None] = mapped_column(Float)
    power_limit_w: Mapped[float | None] = mapped_column(Float)
    throttle_reasons: Mapped[list[str] | None] = mapped_column(JSON)
    ecc_uncorrected: Mapped[int | None] = mapped_column(Integer)
    retired_pages: Mapped[int | None] = mapped_column(Integer)
    persistence_mode: Mapped[bool | None] = mapped_column(Boolean)
    compute_mode: Mapped[str | None] = mapped_column(String(64))
    health: Mapped[str] = mapped_column(String(16), default="ok")
    error: Mapped[str | None] = mapped_column(String(1024))
    processes_status: Mapped[str] = mapped_column(String(16), default="ok")
    processes_error: Mapped[str | None] = mapped_column(String(1024))
    memory_reserved_mib: Mapped[float | None] = mapped_column(Float)
    # whether the process list agrees with the memory figures (agent.schema.ProcessData)
    process_data: Mapped[str] = mapped_column(String(16), default="ok", server_default="ok")
    process_data_detail: Mapped[str | None] = mapped_column(String(512))
    last_owner: Mapped[str | None] = mapped_column(String(64))


class DeviceProcess(Base):
    """A process seen on a device in the host's latest snapshot (rows replaced per snapshot)."""

    __tablename__ = "device_processes"

    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), index=True)
    pid: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(4), default="C")
    used_memory_mib: Mapped[float | None] = mapped_column(Float)
    uid: Mapped[int | None] = mapped_column(Integer)
    unix_user: Mapped[str | None] = mapped_column(String(64))
    command: Mapped[str | None] = mapped_column(String(4096))
    name: Mapped[str | None] = mapped_column(String(256))
    create_time: Mapped[float | None] = mapped_column(Float)
    container_id: Mapped[str | None] = mapped_column(String(128))
    owner_status: Mapped[str] = mapped_column(String(16), default="ok")
    seen_at: Mapped[datetime]


class HostSnapshot(Base):
    """The (host, agent instance, seq) triples already ingested, for idempotent replays from
    the agent's spool. ``agent_instance`` is "" for agents that do not send one."""

    __tablename__ = "host_snapshots"
    __table_args__ = (UniqueConstraint("host_id", "agent_instance", "seq"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    agent_instance: Mapped[str] = mapped_column(String(64), default="", server_default="")
    seq: Mapped[int] = mapped_column(BigInteger)
    collected_at: Mapped[datetime]
    received_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class DeviceConflict(Base):
    """A host's token reported a device registered to another host: refused, kept for admins.

    One row per (device, claiming host); ``count`` snapshots so far, ``last_at`` the latest.
    Cleared when an admin moves the device (:func:`app.services.devices_admin.move_device`).
    """

    __tablename__ = "device_conflicts"
    __table_args__ = (UniqueConstraint("device_id", "claimed_by_host_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    claimed_by_host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    first_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_at: Mapped[datetime] = mapped_column(default=utcnow)
    count: Mapped[int] = mapped_column(Integer, default=1)


class UsageRollup(Base):
    """Per-minute usage of one device: mean utilization and memory, and who ran on it.

    ``users`` lists the Unix users with processes on the device during that minute;
    ``holder`` is the username of the reservation holder at that minute, if any.
    """

    __tablename__ = "usage_rollups"

    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True)
    minute: Mapped[datetime] = mapped_column(primary_key=True, index=True)  # index: retention pruning by age
    samples: Mapped[int] = mapped_column(Integer, default=0)
    utilization_sum: Mapped[float] = mapped_column(Float, default=0.0)
    utilization_samples: Mapped[int] = mapped_column(Integer, default=0)
    memory_used_sum_mib: Mapped[float] = mapped_column(Float, default=0.0)
    memory_samples: Mapped[int] = mapped_column(Integer, default=0)
    users: Mapped[list[str] | None] = mapped_column(JSON)
    holder: Mapped[str | None] = mapped_column(String(64))


__all__ = ["Host", "Device", "DeviceConflict", "DeviceTelemetry", "DeviceProcess", "HostSnapshot", "UsageRollup", "POLICIES"]
