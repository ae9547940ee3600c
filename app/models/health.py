"""Device quarantine: a device taken out of booking for a health reason, until cleared."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.models.base import Base, utcnow


class DeviceQuarantine(Base):
    """One quarantine of one device: open while ``cleared_at`` is ``None``, kept afterwards.

    ``conditions`` lists the critical conditions that caused it, as
    :func:`app.services.health_rule.critical_conditions` names them
    (``[{"kind", "key", "reason", "self_clearing"}]``). ``self_clearing`` is true when every
    condition is one that ends by itself (thermal or power slowdown): then
    ``condition_gone_at`` is when the agent first reported the device without any of them,
    and the quarantine clears itself once that is ``health_self_clear_seconds`` old.
    ``cleared_by`` is ``user:<name>`` (an admin) or ``system`` (cleared by itself).
    """

    __tablename__ = "device_quarantines"
    __table_args__ = (Index("ix_device_quarantines_open", "host_id", "cleared_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), index=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    reason: Mapped[str] = mapped_column(String(512))
    conditions: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    self_clearing: Mapped[bool] = mapped_column(Boolean, default=False)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    condition_gone_at: Mapped[datetime | None]
    cleared_at: Mapped[datetime | None]
    cleared_by: Mapped[str | None] = mapped_column(String(160))
    clear_note: Mapped[str | None] = mapped_column(String(512))


__all__ = ["DeviceQuarantine"]
