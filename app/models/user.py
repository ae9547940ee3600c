"""Users, groups, API tokens and web sessions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, ForeignKey, Integer, String, false
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.models.base import Base, utcnow

ROLES = ("member", "admin")


class User(Base):
    """A lab member. ``unix_name`` matches GPU processes to the user (defaults to username);
    ``unix_uid`` (set by admins or by directory sign-in from LDAP ``uidNumber``; unique) matches
    processes whose uid has no name on the GPU host (directory users) and is handed to the
    agents in every ack."""

    __tablename__ = "users"
    __table_args__ = (CheckConstraint("role IN ('member', 'admin')", name="role"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    display_name: Mapped[str | None] = mapped_column(String(128))
    email: Mapped[str | None] = mapped_column(String(254))
    unix_name: Mapped[str] = mapped_column(String(64), unique=True)
    unix_uid: Mapped[int | None] = mapped_column(Integer, unique=True)
    role: Mapped[str] = mapped_column(String(16), default="member")
    password_hash: Mapped[str | None] = mapped_column(String(256))
    # Who vouches for the password: "local" (password_hash), "ldap" or "oidc" (the directory/provider).
    auth_source: Mapped[str] = mapped_column(String(16), default="local", server_default="local")
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    feed_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)  # SHA-256 of the calendar feed token
    # the latest end of the user's approved quota boosts: resolving limits reads boosts only before it
    boost_until: Mapped[datetime | None] = mapped_column()
    # The language of pages and notices ("en", "zh_CN"); NULL: the browser's Accept-Language decides.
    language: Mapped[str | None] = mapped_column(String(16), comment="preferred locale; NULL: browser's choice")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    groups: Mapped[list["Group"]] = relationship(secondary="group_members", back_populates="members", lazy="raise")

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


class Group(Base):
    """A set of users (project or sub-team); sharing rules may target it."""

    __tablename__ = "groups"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    members: Mapped[list[User]] = relationship(secondary="group_members", back_populates="groups", lazy="raise")


class GroupMember(Base):
    __tablename__ = "group_members"

    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    # a manager approves or denies the group's pending reservations (admins approve all)
    is_manager: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ApiToken(Base):
    """A bearer token for the API. Only its SHA-256 is stored; ``prefix`` identifies it in lists."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128), default="token")
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]

    user: Mapped[User] = relationship(lazy="raise")


class WebSession(Base):
    """A signed-in browser session: cookie value stored as SHA-256, with its CSRF token."""

    __tablename__ = "web_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]

    user: Mapped[User] = relationship(lazy="raise")


class LoginAttempt(Base):
    """A failed sign-in, for throttling across app processes."""

    __tablename__ = "login_attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), index=True)
    address: Mapped[str | None] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


__all__ = ["User", "Group", "GroupMember", "ApiToken", "WebSession", "LoginAttempt", "ROLES"]
