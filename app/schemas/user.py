"""User and token schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: The largest valid uid: uid_t is 32 bits and (uid_t)-1 means "no uid".
MAX_UID = 2**32 - 2


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=32)
    password: str | None = Field(default=None, min_length=8, max_length=1024)
    email: str | None = Field(default=None, max_length=254)
    unix_name: str | None = Field(default=None, max_length=32)
    unix_uid: int | None = Field(default=None, ge=0, le=MAX_UID, description="Unix uid on the GPU hosts (directory users)")
    display_name: str | None = Field(default=None, max_length=128)
    role: Literal["member", "admin"] = "member"


class UserUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    email: str | None = Field(default=None, max_length=254)
    unix_name: str | None = Field(default=None, max_length=32)
    unix_uid: int | None = Field(default=None, ge=0, le=MAX_UID, description="null clears it")
    display_name: str | None = Field(default=None, max_length=128)
    role: Literal["member", "admin"] | None = None
    active: bool | None = None
    password: str | None = Field(default=None, min_length=8, max_length=1024)


class PasswordChange(BaseModel):
    """A user's own password change: the current password proves it is them."""

    model_config = ConfigDict(extra="forbid")
    current_password: str = Field(min_length=1, max_length=1024)
    new_password: str = Field(min_length=8, max_length=1024)


class PasswordChanged(BaseModel):
    sessions_ended: int = Field(description="web sessions of the user that were signed out")


class UserRead(BaseModel):
    username: str
    display_name: str | None
    email: str | None
    unix_name: str
    unix_uid: int | None = None
    role: str
    active: bool
    groups: list[str] = Field(default_factory=list)
    created_at: datetime
    language: str | None = Field(default=None, description="pages and notices: en or zh_CN; null: the browser's choice")


class LanguageChoice(BaseModel):
    """The caller's language for pages and notices; ``null`` follows the browser (``Accept-Language``)."""

    model_config = ConfigDict(extra="forbid")
    language: str | None = Field(default=None, max_length=16, description="en or zh_CN; null: the browser's choice")


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="token", min_length=1, max_length=128)
    expires_days: int | None = Field(default=None, ge=1, le=3650)
    user: str | None = Field(default=None, max_length=32, description="admins: create for this user")


class TokenRead(BaseModel):
    id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenRead):
    token: str = Field(description="the token, shown once")
