"""``/api/v1/hosts`` and ``/api/v1/devices``: the lab's machines and their state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request, Response

from app.routes import api_router
from app.api.deps import AdminUser, CurrentUser, PageDep, SessionDep, WriteSessionDep
from app.models import utcnow
from app.schemas.host import (
    DeviceConflictRead,
    DeviceMove,
    DeviceRead,
    DeviceUpdate,
    HostCreate,
    HostCreated,
    HostRead,
    HostUpdate,
)
from app.middleware.compression import accepts_gzip
from app.services import device_claims
from app.services.device_list_cache import DeviceListCache
from app.services import devices as device_service
from app.services import hosts as host_service
from app.services.filter_names import require_known

router = api_router(tags=["hosts"])


@router.get("/hosts", response_model=list[HostRead])
def list_hosts(user: CurrentUser, session: SessionDep, page: PageDep, response: Response) -> list[HostRead]:
    """Every host with its agent's state; paginated (``limit``, ``offset``; total in ``X-Total-Count``)."""
    return page.apply(device_service.list_hosts(session, now=utcnow()), response)


@router.post("/hosts", status_code=201, response_model=HostCreated)
def create_host(data: HostCreate, admin: AdminUser, session: WriteSessionDep) -> HostCreated:
    """Register a host; the response carries its host token once."""
    host, token = host_service.create_host(session, name=data.name, actor=f"user:{admin.username}")
    read = device_service.host_read(host, now=utcnow(), device_count=0)
    return HostCreated(**read.model_dump(), token=token)


@router.get("/hosts/{name}", response_model=HostRead)
def get_host(name: str, user: CurrentUser, session: SessionDep) -> HostRead:
    return device_service.get_host_read(session, name=name, now=utcnow())


@router.patch("/hosts/{name}", response_model=HostRead)
def update_host(name: str, data: HostUpdate, admin: AdminUser, session: WriteSessionDep) -> HostRead:
    """Admins set the enforcement policy, grace, exempt lists; recorded in the audit log."""
    host_service.update_host(session, actor=admin, name=name, changes=data.model_dump(exclude_unset=True))
    return device_service.get_host_read(session, name=name, now=utcnow())


@router.get("/devices", response_model=list[DeviceRead], responses={404: {}})
def list_devices(
    request: Request,
    user: CurrentUser,
    session: SessionDep,
    page: PageDep,
    host: Annotated[str | None, Query(max_length=128)] = None,
) -> Response:
    """Every device with its latest telemetry, processes, current holder and next reservation;
    paginated (``limit``, ``offset``; total in ``X-Total-Count``). A ``host`` that does not
    exist is 404 naming the field."""
    # documents reused between snapshots, each request keyed on what it reads of the database
    cache: DeviceListCache = request.app.state.device_list_cache  # built by create_app
    view = cache.view(session, now=utcnow(), host=host)
    if not view.docs:
        require_known(session, host=host)
    headers = {"X-Total-Count": str(len(view.docs))}
    body, packed = cache.page(view, offset=page.offset, limit=page.limit, gzip=accepts_gzip(request))
    if packed:  # compressed here (and kept) rather than by the middleware, which passes it through
        headers |= {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
    return Response(body, media_type="application/json", headers=headers)


@router.patch("/devices/{uuid}", response_model=DeviceRead)
def update_device(uuid: str, data: DeviceUpdate, admin: AdminUser, session: WriteSessionDep) -> DeviceRead:
    """Admins retire a device or mark it open (usable by anyone without a reservation)."""
    device_service.update_device(
        session, uuid=uuid, retired=data.retired, is_open=data.is_open, actor=f"user:{admin.username}", now=utcnow()
    )
    session.flush()
    return device_service.get_device_read(session, uuid=uuid, now=utcnow())


@router.post("/devices/{uuid}/move", response_model=DeviceRead, responses={404: {}, 409: {}, 422: {}})
def move_device(uuid: str, data: DeviceMove, admin: AdminUser, session: WriteSessionDep) -> DeviceRead:
    """Admins register a GPU (with its MIG instances) to another host; audited; clears its conflicts."""
    device_claims.move_device(session, actor=admin, uuid=uuid, to_host=data.host)
    return device_service.get_device_read(session, uuid=uuid, now=utcnow())


@router.get("/device-conflicts", response_model=list[DeviceConflictRead])
def list_device_conflicts(admin: AdminUser, session: SessionDep) -> list[DeviceConflictRead]:
    """Devices a host reported although they belong to another host (refused), newest first."""
    return device_claims.list_conflicts(session)
