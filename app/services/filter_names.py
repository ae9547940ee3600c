"""Filters that name something: a misspelt name is an error, not an empty answer.

A list filtered by a host, user or device that does not exist would otherwise answer 200 with
nothing in it, which reads as "nothing there". The lists call :func:`require_known` only
when nothing matched, so a list that finds rows pays no extra statement.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import NotFound
from app.models import Device
from app.services import hosts as host_service
from app.services import users as user_service


def require_known(session: Session, *, host: str | None = None, user: str | None = None,
                  device: str | None = None) -> None:
    """Raise NotFound (404) naming the field of the first given value that names nothing:
    ``host`` (host name), ``user`` (username), ``device`` (device UUID, retired ones too)."""
    if host is not None:
        host_service.get_host(session, host)
    if user is not None:
        user_service.get_user(session, user)
    if device is not None and session.scalar(select(Device.id).where(Device.uuid == device)) is None:
        raise NotFound(f"device {device!r} not found", field="device")


__all__ = ["require_known"]
