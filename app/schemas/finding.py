"""Finding schemas: ``FindingRead`` with its notices and enforcement actions."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.models.states import FindingKind, FindingState


class NoticeRead(BaseModel):
    """A notice about a finding. ``recipient`` is shown to admins and to the finding's own
    user only (it may be an e-mail address); others see ``null``."""

    channel: Literal["terminal", "web", "email", "webhook"]
    recipient: str | None
    sent_at: datetime
    status: str = Field(description="sent | pending | sending | failed | skipped | undelivered | dry_run")
    detail: str | None


class ActionRead(BaseModel):
    """An enforcement action the host agent took (from the audit log)."""

    action: str = Field(description="sigterm | sigkill | skipped | dry_run")
    at: datetime
    actor: str
    detail: dict[str, Any] | None


class FindingRead(BaseModel):
    """A process where its owner holds no covering reservation, or an idle reservation; or a
    process nobody can be named for: ``unattributed`` (a container without a known owner:
    ``container_id``, ``container_name``, ``container_image``) or ``unknown_uid`` (``uid``)."""

    id: int
    host: str
    key: str
    kind: FindingKind
    state: FindingState
    device_uuid: str | None
    device_index: int | None
    device_pci_bus_id: str | None
    pid: int | None
    create_time: float | None
    unix_user: str | None
    uid: int | None
    command: str | None
    container_id: str | None
    container_name: str | None = None
    container_image: str | None = None
    reservation_id: int | None
    holder: str | None
    message: str | None
    first_seen_at: datetime
    last_seen_at: datetime
    resolved_at: datetime | None
    notices: list[NoticeRead]
    actions: list[ActionRead]
