"""Schemas of approvals (decide a pending reservation), group managers and maintenance."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.reservation import ReservationRead


class Decision(BaseModel):
    """Approve or deny a pending reservation; ``reason`` is told to the requester."""

    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=1024)


class ManagersChange(BaseModel):
    """Members of the group who may approve or deny its members' pending reservations."""

    model_config = ConfigDict(extra="forbid")
    users: list[str] = Field(min_length=1, max_length=1024, description="usernames (already members)")
    manager: bool = True


class MaintenanceCreate(BaseModel):
    """Hold ``devices`` (UUIDs or indices; default every whole GPU) of ``host`` from ``start``
    until ``end`` (omit it: open-ended, until an admin ends it). With ``override``,
    conflicting reservations are shortened or cancelled and their holders told."""

    model_config = ConfigDict(extra="forbid")
    host: str = Field(max_length=128)
    devices: list[str | int] | None = Field(default=None, max_length=64)
    start: str = Field(default="now", max_length=64, description="ISO 8601 with offset, or 'now'")
    end: str | None = Field(default=None, max_length=64, description="ISO 8601 with offset; omitted: open-ended")
    reason: str = Field(min_length=1, max_length=1024)
    override: bool = False


class OverriddenRead(BaseModel):
    id: int
    user: str
    action: str  # cancelled | shortened
    end: datetime


class MaintenanceRead(BaseModel):
    maintenance: ReservationRead
    overridden: list[OverriddenRead]
