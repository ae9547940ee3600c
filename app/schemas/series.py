"""Schemas of recurring reservations (``/api/v1/series``)."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_OCCURRENCES = 366


class SeriesCreate(BaseModel):
    """Book ``devices`` of ``host`` repeatedly: ``start_time`` wall time in ``tz`` (default:
    the lab zone) on the days of the rule, from ``start_date`` until ``until`` (inclusive,
    a date in ``tz``) or for ``count`` occurrences. RFC 5545 semantics: a monthly series on
    the 31st skips months without one; weekly ``weekdays`` are ``MO``…``SU``.
    """

    model_config = ConfigDict(extra="forbid")

    host: str = Field(max_length=128)
    devices: list[str | int] = Field(min_length=1, max_length=64, description="UUIDs or indices")
    freq: Literal["daily", "weekly", "monthly"]
    interval: int = Field(default=1, ge=1, le=99, description="every n days / weeks / months")
    weekdays: list[str] | None = Field(default=None, max_length=7, description="MO TU WE TH FR SA SU")
    start_date: date = Field(description="YYYY-MM-DD, the first possible day, in tz")
    start_time: str = Field(max_length=5, description="HH:MM wall time in tz")
    duration: timedelta = Field(description="ISO 8601 (PT2H, P1D) or seconds; whole days are calendar days")
    tz: str | None = Field(default=None, max_length=64, description="IANA zone of the wall times; default: the lab's")
    until: date | None = Field(default=None, description="last possible day, inclusive, in tz")
    count: int | None = Field(default=None, ge=1, le=MAX_OCCURRENCES)
    note: str | None = Field(default=None, max_length=1024)
    user: str | None = Field(default=None, max_length=64, description="admins: book for this username")
    share_with: list[str] | None = Field(default=None, max_length=64, description="usernames or group:<name>")
    override_reason: str | None = Field(default=None, max_length=1024, description="admins: override sharing rules")
    dry_run: bool = Field(default=False, description="check everything and return the occurrences; store nothing")


class OccurrenceRead(BaseModel):
    id: int | None = Field(description="the reservation's id; null in a dry run")
    start: datetime
    end: datetime
    local_start: str = Field(description="start as wall time with offset in the series' zone")
    state: str
    sequence: int


class SeriesRead(BaseModel):
    id: int | None = Field(description="null in a dry run")
    user: str
    host: str
    devices: list[str]
    freq: Literal["daily", "weekly", "monthly"]
    interval: int
    weekdays: list[str] | None
    start_date: date
    start_time: str
    duration_seconds: int
    tz: str
    until: date | None
    count: int | None
    note: str | None
    cancelled_at: datetime | None
    dry_run: bool = False
    occurrences: list[OccurrenceRead]


class SeriesCancelled(SeriesRead):
    cancelled: int = Field(description="occurrences cancelled by this request")
    kept: list[int] = Field(description="ids of occurrences already active or over, left as they are")
    recurrence: Literal["cancelled"] = "cancelled"
