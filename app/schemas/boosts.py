"""Schemas of quota boosts (``/api/v1/boosts``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BoostState = Literal["pending", "active", "expired", "denied"]


class BoostCreate(BaseModel):
    """Ask for a temporary raise of one limit of yours."""

    model_config = ConfigDict(extra="forbid")

    limit: str = Field(min_length=1, max_length=64, description="the limit to raise, e.g. max_gpu_hours_week")
    value: float = Field(gt=0, le=1e7, description="the raised value in the limit's unit: devices, seconds, GPU-hours")
    reason: str = Field(min_length=1, max_length=1024, description="why (shown to whoever decides)")
    end: str = Field(min_length=1, max_length=64,
                     description="when the boost ends: ISO 8601 with an offset, or wall time with tz")
    tz: str | None = Field(default=None, max_length=64, description="IANA zone of a wall-time end")


class BoostDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=1024, description="told to the member")


class BoostRead(BaseModel):
    id: int
    user: str
    limit: str
    value: float
    unit: str = Field(description="devices, reservations, seconds or GPU-hours")
    reason: str
    end: datetime
    state: BoostState = Field(description="pending, active (approved, before its end), expired, denied")
    decided_by: str | None
    decided_at: datetime | None
    decision_reason: str | None
    created_at: datetime
