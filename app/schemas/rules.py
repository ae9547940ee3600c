"""Schemas of the sharing-rules API: rules, groups, open devices, usage, availability,
password sign-in for the CLI and calendar feed URLs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas.boosts import BoostRead

Scope = Literal["default", "group", "user"]


class RuleLimits(BaseModel):
    """The limits a rule may set; ``null`` = not set by this rule (inherited)."""

    model_config = ConfigDict(extra="forbid")

    max_devices: int | None = Field(default=None, ge=1, le=4096, description="devices held at once")
    max_duration_seconds: int | None = Field(default=None, ge=60, le=366 * 86400, description="longest reservation, s")
    max_ahead_seconds: int | None = Field(default=None, ge=0, le=3 * 366 * 86400,
                                          description="how far ahead a reservation may start, s")
    max_gpu_hours_7d: float | None = Field(default=None, gt=0, le=1e7,
                                           description="device-hours per 7 lab-calendar days")
    max_concurrent_reservations: int | None = Field(default=None, ge=1, le=4096)
    max_gpu_hours_day: float | None = Field(default=None, gt=0, le=1e7,
                                            description="device-hours per calendar day (lab time zone)")
    max_gpu_hours_week: float | None = Field(default=None, gt=0, le=1e7,
                                             description="device-hours per ISO week, Monday 00:00 (lab time zone)")
    max_gpu_hours_month: float | None = Field(default=None, gt=0, le=1e7,
                                              description="device-hours per calendar month (lab time zone)")
    allowed_hosts: list[str] | None = Field(default=None, max_length=256, description="host names")
    allowed_models: list[str] | None = Field(default=None, max_length=256,
                                             description="model substrings, case-insensitive (e.g. A100)")
    approval_above_devices: int | None = Field(default=None, ge=0, le=4096,
                                               description="a booking of more devices awaits approval")
    approval_above_seconds: int | None = Field(default=None, ge=0, le=366 * 86400,
                                               description="a longer booking awaits approval, s")
    approval_above_ahead_seconds: int | None = Field(default=None, ge=0, le=3 * 366 * 86400,
                                                     description="a booking starting further ahead awaits approval, s")
    approval_above_gpu_hours: float | None = Field(default=None, ge=0, le=1e7,
                                                   description="a booking of more device-hours awaits approval")
    checkin_minutes: int | None = Field(default=None, ge=1, le=1440,
                                        description="no holder process by this many minutes after the start: warned")
    checkin_min_booking_minutes: int | None = Field(default=None, ge=0, le=366 * 1440,
                                                    description="bookings shorter than this need no check-in (default 60)")
    checkin_grace_minutes: int | None = Field(default=None, ge=1, le=1440,
                                              description="warned and still no check-in this long: released (default 15)")
    idle_below_percent: int | None = Field(default=None, ge=1, le=100,
                                           description="compute utilization under this % (memory held) counts as idle")
    idle_after_minutes: int | None = Field(default=None, ge=5, le=7 * 1440,
                                           description="idle this many minutes: holder asked (default 60)")
    idle_grace_minutes: int | None = Field(default=None, ge=1, le=1440,
                                           description="asked and no answer this long: silence policy (default 30)")
    idle_silence: Literal["nothing", "release", "release_idle_devices"] | None = Field(
        default=None, description="what an unanswered question does (default nothing)")
    note: str | None = Field(default=None, max_length=512)


class RuleCreate(RuleLimits):
    """A rule for the lab (``default``), a ``group`` (name it) or a ``user`` (name them)."""

    scope: Scope
    user: str | None = Field(default=None, max_length=64)
    group: str | None = Field(default=None, max_length=64)


class RuleUpdate(RuleLimits):
    """Any subset of the limits; ``null`` clears one (it is inherited again)."""


class RuleRead(BaseModel):
    id: int
    scope: Scope
    user: str | None
    group: str | None
    max_devices: int | None
    max_duration_seconds: int | None
    max_ahead_seconds: int | None
    max_gpu_hours_7d: float | None
    max_concurrent_reservations: int | None
    max_gpu_hours_day: float | None = None
    max_gpu_hours_week: float | None = None
    max_gpu_hours_month: float | None = None
    allowed_hosts: list[str] | None
    allowed_models: list[str] | None
    approval_above_devices: int | None = None
    approval_above_seconds: int | None = None
    approval_above_ahead_seconds: int | None = None
    approval_above_gpu_hours: float | None = None
    checkin_minutes: int | None = None
    checkin_min_booking_minutes: int | None = None
    checkin_grace_minutes: int | None = None
    idle_below_percent: int | None = None
    idle_after_minutes: int | None = None
    idle_grace_minutes: int | None = None
    idle_silence: str | None = None
    note: str | None
    created_at: datetime
    updated_at: datetime


class GroupCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=32)
    description: str | None = Field(default=None, max_length=256)
    members: list[str] = Field(default_factory=list, max_length=1024, description="usernames")


class MembersAdd(BaseModel):
    model_config = ConfigDict(extra="forbid")
    users: list[str] = Field(min_length=1, max_length=1024, description="usernames")


class GroupRead(BaseModel):
    name: str
    description: str | None
    members: list[str]
    created_at: datetime


class OpenDevicesChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    devices: list[str] = Field(min_length=1, max_length=1024, description="device UUIDs")


class OpenDeviceRead(BaseModel):
    uuid: str
    host: str
    index: int | None
    name: str | None
    is_open: bool
    reservations_ahead: int | None = Field(
        default=None, description="current and upcoming reservations still holding it (opening cancels none)"
    )


class LimitUsage(BaseModel):
    rule: str
    limit: Any = Field(description="the effective value; null = unlimited")
    used: Any = Field(description="what is used now (devices, reservations) or in the window (GPU-hours)")
    left: Any
    unit: str
    scope: str | None = Field(description="where the limit comes from: user, group:<name>, default, boost:<id>")
    detail: str
    boosted_from: Any = Field(default=None, description="under a quota boost: the value the rules give")
    boost_until: datetime | None = Field(default=None, description="under a quota boost: when it ends")


class QuotaWindow(BaseModel):
    start: datetime
    end: datetime


class UsageRead(BaseModel):
    user: str
    timezone: str = Field(description="the lab time zone: quota windows and day boundaries")
    now: datetime
    window: QuotaWindow = Field(description="the GPU-hour window: the 7 lab days ending today")
    limits: list[LimitUsage]
    boosts: list[BoostRead] = Field(default_factory=list, description="your pending and active quota boosts")


class SlotRead(BaseModel):
    host: str
    start: datetime
    end: datetime
    devices: list[str] = Field(description="the device UUIDs a booking now would get")
    indices: list[int | None]
    free_until: datetime | None = Field(description="when the first of these devices is next reserved")


class AvailabilityRead(BaseModel):
    count: int
    duration_seconds: float
    slots: list[SlotRead]


class PasswordLogin(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)
    name: str = Field(default="cli", min_length=1, max_length=128, description="a label for the token")
    expires_days: int | None = Field(default=None, ge=1, le=3650)


class FeedRead(BaseModel):
    """A calendar feed. Only a hash of its secret is stored, so ``url`` is given once, when
    the feed is made or rotated; afterwards it is ``null`` and ``detail`` says how to get a new one."""

    url: str | None = Field(description="secret ICS URL (shown once); anyone with it can read the calendar")
    detail: str | None = Field(default=None, description="why there is no URL")
