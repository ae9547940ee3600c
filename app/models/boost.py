"""Quota boosts: a member's request for a temporary raise of one numeric limit."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Float, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.models.base import Base, utcnow
from app.models.user import User

#: stored statuses; an approved boost past ``ends_at`` (and a pending one) is shown as
#: ``expired`` by :func:`app.services.boosts.state`, evaluated by time, never stored
BOOST_STATUSES = ("pending", "approved", "denied")


class QuotaBoost(Base):
    """A temporary raise of ``limit_name`` to ``value`` (the limit's own unit: devices,
    seconds, GPU-hours) for ``user``, asked with a ``reason`` and lasting until ``ends_at``
    (UTC) once approved by an admin or a manager of one of the user's groups."""

    __tablename__ = "quota_boosts"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'approved', 'denied')", name="status"),
        CheckConstraint("value > 0", name="value_positive"),
        Index("ix_quota_boosts_user_id_ends_at", "user_id", "ends_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    limit_name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(String(1024))
    ends_at: Mapped[datetime] = mapped_column()
    status: Mapped[str] = mapped_column(String(16), default="pending")
    decided_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    decided_at: Mapped[datetime | None] = mapped_column()
    decision_reason: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    user: Mapped[User] = relationship(foreign_keys=[user_id], lazy="joined")
    decided_by: Mapped[User | None] = relationship(foreign_keys=[decided_by_id], lazy="joined")


__all__ = ["BOOST_STATUSES", "QuotaBoost"]
