"""Reservation schemas: ``ReservationCreate``, ``ReservationUpdate``, ``ReservationRead``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ReservationState = Literal["upcoming", "active", "ended", "cancelled", "released", "pending", "denied", "expired"]


class PlacementConstraints(BaseModel):
    """Constraints for automatic placement (``count`` instead of ``devices``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, max_length=128, description="substring of the GPU model name")
    min_memory_mib: float | None = Field(default=None, ge=0, description="minimum total memory per device, MiB")
    same_host: bool = True


class ReservationCreate(BaseModel):
    """Book ``devices`` (UUIDs or indices) of ``host`` for ``[start, end)``.

    ``start`` is an ISO 8601 instant with an offset, or wall time plus ``tz`` (IANA zone), or
    ``"now"`` / ``"asap"``. Give either ``end`` or ``duration`` (ISO 8601, e.g. ``PT4H``).
    """

    model_config = ConfigDict(extra="forbid")

    host: str | None = Field(default=None, max_length=128)
    devices: list[str | int] | None = Field(default=None, max_length=64)
    count: int | None = Field(default=None, ge=1, le=64, description="placement: how many devices")
    constraints: PlacementConstraints | None = None
    start: str = Field(max_length=64, description="ISO 8601 with offset, wall time + tz, 'now' or 'asap'")
    end: str | None = Field(default=None, max_length=64)
    duration: timedelta | None = Field(default=None, description="ISO 8601 duration, e.g. PT4H")
    tz: str | None = Field(default=None, max_length=64, description="IANA zone for wall-time start/end")
    fold: Literal[0, 1] | None = Field(
        default=None, description="a wall time that occurs twice (autumn DST night): 0 the earlier, 1 the later"
    )
    note: str | None = Field(default=None, max_length=1024)
    user: str | None = Field(default=None, max_length=64, description="admins: book for this username")
    share_with: list[str] | None = Field(default=None, max_length=64, description="usernames or group:<name>")
    override_reason: str | None = Field(default=None, max_length=1024, description="admins: override sharing rules")

    @model_validator(mode="after")
    def _one_of(self) -> "ReservationCreate":
        if (self.end is None) == (self.duration is None):
            raise ValueError("give exactly one of 'end' or 'duration'")
        if self.devices is None and self.count is None:
            raise ValueError("give 'devices' (UUIDs or indices) or 'count'")
        if self.devices is not None and self.count is not None:
            raise ValueError("give either 'devices' or 'count', not both")
        if self.devices is not None and len(self.devices) == 0:
            raise ValueError("'devices' must name at least one device")
        return self


class ReservationUpdate(BaseModel):
    """Change the end (extend or shorten), the note or the shares of a reservation."""

    model_config = ConfigDict(extra="forbid")

    end: str | None = Field(default=None, max_length=64)
    tz: str | None = Field(default=None, max_length=64)
    fold: Literal[0, 1] | None = Field(default=None, description="a repeated wall time: 0 the earlier, 1 the later")
    note: str | None = Field(default=None, max_length=1024)
    share_with: list[str] | None = Field(
        default=None, max_length=64, description="replaces the shares: usernames or group:<name>; [] clears"
    )
    override_reason: str | None = Field(default=None, max_length=1024)


class DeviceRef(BaseModel):
    uuid: str
    index: int | None
    name: str | None
    pci_bus_id: str | None = None
    mig_profile: str | None = None


class ConflictRef(BaseModel):
    """A reservation in a 409's ``conflicts``: ``devices`` are the UUIDs of its devices in the
    way of those requested (the same device, or the whole GPU of a requested MIG slice, or a
    MIG slice of a requested whole GPU), not all it holds; ``start``/``end`` its interval (UTC)."""

    id: int
    user: str
    devices: list[str]
    start: datetime
    end: datetime


class ReservationRead(BaseModel):
    """A reservation as the API returns it; ``cuda_visible_devices`` lists UUIDs."""

    id: int
    user: str
    host: str
    devices: list[DeviceRef]
    start: datetime
    end: datetime
    state: ReservationState
    status: str
    note: str | None
    cuda_visible_devices: str
    series_id: int | None = None
    shared_with: list[str] = Field(default_factory=list)
    created_at: datetime
    created_by: str | None = None
    override_reason: str | None = None
    kind: Literal["booking", "maintenance"] = "booking"
    checked_in_at: datetime | None = Field(default=None, description="when a holder process was first seen on its devices")
    question: Literal["checkin", "idle"] | None = Field(
        default=None, description="pending: no check-in yet (keep it?) or still using it? Answer with POST .../keep or release")
    auto_release: Literal["no_show", "idle", "idle_devices", "idle_consent"] | None = Field(
        default=None, description="why it was released: no-show, idle (all or some devices), or by its holder when asked")
