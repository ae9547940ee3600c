"""Where a user's notices go and what they want to hear about.

``NotifyTarget`` is an apprise URL (``mmost://…``, ``dingtalk://…``, ``mailto://…``) owned by
the deployment (neither user nor group), one group, or one user. ``NoticePreference`` stores a
user's choice per notice kind; a kind without a row is wanted (notices are on by default).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, utcnow

#: Kinds a user may choose to hear about; only ``findings`` are raised by the service today,
#: the others are stored so that the features that raise them find the choice made.
NOTICE_KINDS = ("findings", "approvals", "waitlist", "no_shows", "quarantine")


class NotifyTarget(Base):
    """An apprise notification URL of the deployment, a group or a user (at most one owner)."""

    __tablename__ = "notify_targets"
    __table_args__ = (CheckConstraint("user_id IS NULL OR group_id IS NULL", name="one_owner"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(1024))
    label: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class NoticePreference(Base):
    """One user's choice for one notice kind (see ``NOTICE_KINDS``)."""

    __tablename__ = "notice_preferences"
    __table_args__ = (
        CheckConstraint("kind IN ('findings', 'approvals', 'waitlist', 'no_shows', 'quarantine')", name="kind"),
    )

    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)


__all__ = ["NOTICE_KINDS", "NoticePreference", "NotifyTarget"]
