"""Waitlist schemas: ``WaitlistCreate`` (what to wait for) and ``WaitlistRead``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.reservation import PlacementConstraints

WaitlistState = Literal["waiting", "booked", "notified", "cancelled", "expired"]


class WaitlistCreate(BaseModel):
    """Wait for ``count`` devices for ``duration`` within ``[start, end)`` (or ``within`` of
    the start); ``book`` true books them for you when free, false tells you."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=1, le=64, description="how many devices, on one host")
    duration: timedelta = Field(description="how long, ISO 8601 (e.g. PT4H)")
    start: str | None = Field(default=None, max_length=64, description="window start (default now): ISO 8601 "
                              "with offset, wall time + tz, or 'now'")
    end: str | None = Field(default=None, max_length=64, description="window end: the booking must end by then")
    within: timedelta | None = Field(default=None, description="window length from its start, e.g. P2D (instead of end)")
    tz: str | None = Field(default=None, max_length=64, description="IANA zone for wall-time start/end")
    fold: Literal[0, 1] | None = Field(default=None, description="a repeated wall time: 0 the earlier, 1 the later")
    host: str | None = Field(default=None, max_length=128, description="only this host (default: any)")
    constraints: PlacementConstraints | None = None
    book: bool = Field(default=False, description="true: book for me when free; false: tell me")
    note: str | None = Field(default=None, max_length=1024, description="note of the booking it makes")


class WaitlistRead(BaseModel):
    """A waitlist entry; ``position`` is its place in the queue while waiting (1 is next)."""

    id: int
    user: str
    count: int
    duration_seconds: int
    window_start: datetime
    window_end: datetime
    host: str | None
    model: str | None
    min_memory_mib: float | None
    book: bool
    note: str | None
    state: WaitlistState
    position: int | None = None
    reservation_id: int | None = None
    last_refusal: str | None = None
    created_at: datetime
    served_at: datetime | None = None
