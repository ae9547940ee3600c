"""Notification targets (apprise URLs) and notice preferences on the API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class NotifyTargetCreate(BaseModel):
    """A new apprise URL: for the caller (default), ``group`` (admins), ``user`` (admins), or
    the whole deployment (``deployment: true``, admins)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=1024, description="apprise URL, e.g. mmost://chat.lab.example/TOKEN")
    label: str | None = Field(default=None, max_length=128)
    group: str | None = Field(default=None, max_length=64)
    user: str | None = Field(default=None, max_length=64)
    deployment: bool = False


class NotifyTargetRead(BaseModel):
    """A target as listed: the URL redacted (its path and query carry tokens)."""

    id: int
    url: str = Field(description="scheme://host/… (redacted)")
    label: str | None
    owner: str = Field(description="deployment | group:<name> | user:<name>")
    created_at: datetime


class NoticePreferences(BaseModel):
    """What the user wants to hear about (``true``: notices of that kind reach the user's own URLs)."""

    model_config = ConfigDict(extra="forbid")

    findings: bool | None = None
    approvals: bool | None = None
    waitlist: bool | None = None
    no_shows: bool | None = None
    quarantine: bool | None = None
