"""Sharing rules: limits per default / group / user scope."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, utcnow


class SharingRule(Base):
    """Limits for a scope. ``None`` in a limit means "no limit from this rule".

    Resolution: the most specific scope wins (user > group > default); a user in several
    groups gets the most generous group value. Durations in seconds, GPU-hours per rolling
    7 days and per calendar day, ISO week and month.
    """

    __tablename__ = "sharing_rules"
    __table_args__ = (
        CheckConstraint("scope IN ('default', 'group', 'user')", name="scope"),
        CheckConstraint(
            "(scope = 'default' AND user_id IS NULL AND group_id IS NULL) OR "
            "(scope = 'group' AND group_id IS NOT NULL AND user_id IS NULL) OR "
            "(scope = 'user' AND user_id IS NOT NULL AND group_id IS NULL)",
            name="target",
        ),
        CheckConstraint("idle_silence IN ('nothing', 'release', 'release_idle_devices')", name="idle_silence"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    max_devices: Mapped[int | None] = mapped_column(Integer)
    max_duration_seconds: Mapped[int | None] = mapped_column(Integer)
    max_ahead_seconds: Mapped[int | None] = mapped_column(Integer)
    max_gpu_hours_7d: Mapped[float | None] = mapped_column(Float)
    max_concurrent_reservations: Mapped[int | None] = mapped_column(Integer)
    # GPU-hours per calendar window in the lab time zone (day; ISO week from Monday; month)
    max_gpu_hours_day: Mapped[float | None] = mapped_column(Float)
    max_gpu_hours_week: Mapped[float | None] = mapped_column(Float)
    max_gpu_hours_month: Mapped[float | None] = mapped_column(Float)
    allowed_hosts: Mapped[list[str] | None] = mapped_column()
    allowed_models: Mapped[list[str] | None] = mapped_column()
    # approval thresholds: a booking above any of them is pending until approved
    approval_above_devices: Mapped[int | None] = mapped_column(Integer)
    approval_above_seconds: Mapped[int | None] = mapped_column(Integer)
    approval_above_ahead_seconds: Mapped[int | None] = mapped_column(Integer)
    approval_above_gpu_hours: Mapped[float | None] = mapped_column(Float)
    # check-in and idle holders (app.services.checkin); minutes, percent
    checkin_minutes: Mapped[int | None] = mapped_column(Integer, comment="check-in window after the start")
    checkin_min_booking_minutes: Mapped[int | None] = mapped_column(Integer, comment="shorter bookings: no check-in")
    checkin_grace_minutes: Mapped[int | None] = mapped_column(Integer, comment="after the warning, before release")
    idle_below_percent: Mapped[int | None] = mapped_column(Integer, comment="compute utilization counted as idle")
    idle_after_minutes: Mapped[int | None] = mapped_column(Integer, comment="idle this long: holder asked")
    idle_grace_minutes: Mapped[int | None] = mapped_column(Integer, comment="after the question, before silence counts")
    idle_silence: Mapped[str | None] = mapped_column(String(24), comment="nothing | release | release_idle_devices")
    note: Mapped[str | None] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


__all__ = ["SharingRule"]
