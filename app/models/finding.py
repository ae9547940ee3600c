"""Findings reported by agents, notices sent about them, and the audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.models.base import Base, utcnow
from app.models.host import Device, Host
from app.models.states import FindingKind, FindingState

FINDING_KINDS = tuple(FindingKind)
FINDING_STATES = tuple(FindingState)


class Finding(Base):
    """A process running where its owner holds no covering reservation, or an idle reservation.

    One row per (host, key), where the agent's key identifies (device, pid, process identity,
    kind). ``unattributed`` (a container whose owner cannot be found, with its id, name and
    image) and ``unknown_uid`` (a host uid no user has) are for admins.
    """

    __tablename__ = "findings"
    __table_args__ = (
        UniqueConstraint("host_id", "key"),
        CheckConstraint("kind IN ('unreserved', 'foreign', 'overrun', 'idle', 'unattributed', 'unknown_uid', 'no_show', 'idle_holder')",
                        name="kind"),
        CheckConstraint("state IN ('open', 'notified', 'terminated', 'resolved')", name="state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id", ondelete="SET NULL"), index=True)
    key: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default="open", index=True)  # the live ones are read lab-wide
    pid: Mapped[int | None] = mapped_column(Integer)
    create_time: Mapped[float | None] = mapped_column(Float)
    unix_user: Mapped[str | None] = mapped_column(String(64), index=True)
    uid: Mapped[int | None] = mapped_column(Integer)
    command: Mapped[str | None] = mapped_column(String(4096))
    container_id: Mapped[str | None] = mapped_column(String(128))
    container_name: Mapped[str | None] = mapped_column(String(256))
    container_image: Mapped[str | None] = mapped_column(String(512))
    reservation_id: Mapped[int | None] = mapped_column(ForeignKey("reservations.id", ondelete="SET NULL"))
    holder: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(String(2048))
    first_seen_at: Mapped[datetime]
    last_seen_at: Mapped[datetime] = mapped_column(index=True)
    resolved_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    host: Mapped[Host] = relationship(lazy="raise")
    device: Mapped[Device | None] = relationship(lazy="raise")
    notices: Mapped[list["Notice"]] = relationship(back_populates="finding", lazy="raise", order_by="Notice.sent_at")


class Notice(Base):
    """A message about a finding: on the host's terminals, in the web UI, by e-mail or webhook."""

    __tablename__ = "notices"
    __table_args__ = (CheckConstraint("channel IN ('terminal', 'web', 'email', 'webhook')", name="channel"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    finding_id: Mapped[int] = mapped_column(ForeignKey("findings.id", ondelete="CASCADE"), index=True)
    channel: Mapped[str] = mapped_column(String(16))
    recipient: Mapped[str | None] = mapped_column(String(254))
    sent_at: Mapped[datetime] = mapped_column(default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default="sent")
    detail: Mapped[str | None] = mapped_column(String(2048))

    finding: Mapped[Finding] = relationship(back_populates="notices", lazy="raise")


class AuditLog(Base):
    """Every administrative or enforcement action: who, what, on what, when."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(160), comment="user:<name> | host:<name> | system")
    action: Mapped[str] = mapped_column(String(64), index=True)  # /metrics counts one action's rows
    target: Mapped[str | None] = mapped_column(String(256), index=True)  # a finding's actions, a reservation's changes
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)


__all__ = ["Finding", "Notice", "AuditLog", "FINDING_KINDS", "FINDING_STATES"]
