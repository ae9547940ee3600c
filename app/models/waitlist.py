"""Waitlist entries: "tell me, or book for me, when ``count`` devices matching these
constraints are free for ``seconds`` within ``[window_start, window_end)``".

Served first come, first served (``created_at``, then ``id``) whenever a reservation frees
its devices; see :mod:`app.services.waitlist`.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.models.base import Base, utcnow
from app.models.states import WaitlistStatus
from app.models.user import User


WAITLIST_STATUSES = tuple(s.value for s in WaitlistStatus)


class WaitlistEntry(Base):
    """One standing request of a user for ``count`` devices for ``seconds`` in a window."""

    __tablename__ = "waitlist_entries"
    __table_args__ = (
        CheckConstraint("status IN ('waiting', 'booked', 'notified', 'cancelled', 'expired')", name="status"),
        CheckConstraint("window_end > window_start", name="window"),
        CheckConstraint("count >= 1 AND seconds >= 1", name="positive"),
        Index("ix_waitlist_entries_status_created_at", "status", "created_at"),  # serving order
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    count: Mapped[int] = mapped_column(Integer, comment="devices wanted, on one host")
    seconds: Mapped[int] = mapped_column(Integer, comment="length wanted, seconds")
    window_start: Mapped[datetime]
    window_end: Mapped[datetime] = mapped_column(comment="the booking must end by then; the entry expires then")
    host: Mapped[str | None] = mapped_column(String(128), comment="only this host (None: any)")
    model: Mapped[str | None] = mapped_column(String(128), comment="substring of the GPU model name")
    min_memory_mib: Mapped[float | None] = mapped_column(Float)
    book: Mapped[bool] = mapped_column(Boolean, default=False, comment="true: book it; false: tell the owner")
    note: Mapped[str | None] = mapped_column(String(1024), comment="note of the booking it makes")
    status: Mapped[str] = mapped_column(String(16), default=WaitlistStatus.WAITING)
    reservation_id: Mapped[int | None] = mapped_column(ForeignKey("reservations.id", ondelete="SET NULL"))
    last_refusal: Mapped[str | None] = mapped_column(String(1024), comment="why the last auto-book was refused")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    served_at: Mapped[datetime | None]

    user: Mapped[User] = relationship(lazy="raise")


__all__ = ["WAITLIST_STATUSES", "WaitlistEntry", "WaitlistStatus"]
