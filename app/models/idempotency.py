"""Idempotency keys: the first answer to a creating POST, replayed for a retry with the same key."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, utcnow


class IdempotencyKey(Base):
    """One ``Idempotency-Key`` of one user, with the request it came with and its first answer.

    ``request_hash`` is the SHA-256 of method, path and the canonical body, so the same key
    with another body is recognised; ``status_code``, ``response_body`` and ``location`` are
    what the first request answered. Rows past ``expires_at`` (24 h) are pruned.
    """

    __tablename__ = "idempotency_keys"
    __table_args__ = (
        UniqueConstraint("user_id", "key"),
        Index("ix_idempotency_keys_expires_at", "expires_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(255))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    request_hash: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(Integer)
    response_body: Mapped[Any | None] = mapped_column(JSON)
    location: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


__all__ = ["IdempotencyKey"]
