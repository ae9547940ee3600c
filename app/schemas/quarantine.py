"""Health quarantine schemas (``/api/v1/quarantines``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class QuarantineCondition(BaseModel):
    """One critical condition (see ``docs/rules.md``, health quarantine)."""

    kind: str = Field(description="xid, ecc_uncorrected, retired_pages_pending, remapped_rows_pending, "
                      "remapped_rows_failure, gpu_lost, thermal_slowdown, power_slowdown")
    key: str = Field(description="kind, or kind:value (xid:79, ecc_uncorrected:3)")
    reason: str
    self_clearing: bool


class QuarantineRead(BaseModel):
    """A device's quarantine: open while ``cleared_at`` is null."""

    id: int
    device: str = Field(description="the device's NVML UUID")
    host: str
    index: int | None
    reason: str
    conditions: list[QuarantineCondition]
    self_clearing: bool = Field(description="lifts by itself once the conditions are gone long enough")
    started_at: datetime
    condition_gone_at: datetime | None
    cleared_at: datetime | None
    cleared_by: str | None = Field(description="user:<name>, cli or system (cleared by itself)")
    clear_note: str | None


class QuarantineClear(BaseModel):
    """An admin clears a device's quarantine (the device was reset or repaired)."""

    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(default=None, max_length=512, description="what was done, for the audit log")
