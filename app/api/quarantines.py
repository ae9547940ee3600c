"""``/api/v1/quarantines``: devices taken out of booking for health, and clearing them."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from app.routes import api_router
from app.api.deps import AdminUser, CurrentUser, SessionDep, WriteSessionDep
from app.models import utcnow
from app.schemas.quarantine import QuarantineClear, QuarantineRead
from app.services import quarantine as quarantine_service

router = api_router(tags=["quarantines"])


@router.get("/quarantines", response_model=list[QuarantineRead])
def list_quarantines(
    user: CurrentUser, session: SessionDep,
    include_cleared: Annotated[bool, Query(description="also the latest cleared quarantines")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[QuarantineRead]:
    """Open quarantines (newest first), then, with ``include_cleared``, the latest cleared ones."""
    return quarantine_service.read_list(session, include_cleared=include_cleared, limit=limit)


@router.post("/devices/{uuid}/clear-quarantine", response_model=QuarantineRead, responses={404: {}, 409: {}, 422: {}})
def clear_quarantine(uuid: str, admin: AdminUser, session: WriteSessionDep,
                     data: QuarantineClear | None = None) -> QuarantineRead:
    """Admins lift a device's open quarantine (409 when it has none); audited. The conditions
    still showing are acknowledged: they quarantine the device again only once they change."""
    q = quarantine_service.clear(session, actor=f"user:{admin.username}", uuid=uuid,
                                 note=data.note if data else None, now=utcnow())
    return quarantine_service.to_read(session, q)
