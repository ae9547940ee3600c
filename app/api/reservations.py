"""``/api/v1/reservations``: book, list, change, cancel and release."""

from __future__ import annotations


from typing import Annotated

from fastapi import Query, Request, Response
from sqlalchemy.orm import Session

from app.routes import api_router
from app.api import json_body
from app.api.deps import CurrentUser, RowId, SessionDep, SettingsDep, WriteSessionDep, WriteUser, in_write_unit
from app.api.idempotency import guard, json_request_key
from app.models import User
from app.schemas.common import Page
from app.schemas.reservation import ReservationCreate, ReservationRead, ReservationUpdate
from app.services import reservations as svc
from app.services.filter_names import require_known
from app.timeutil import parse_instant

router = api_router("/reservations", tags=["reservations"])

CONFLICT = {409: {"description": "conflict: names each conflicting reservation and the earliest free start"}}


@router.post("", status_code=201, response_model=ReservationRead, responses={**CONFLICT, 403: {}, 422: {}},
             openapi_extra={"requestBody": json_body.request_body(ReservationCreate)})
async def create_reservation(request: Request, settings: SettingsDep) -> Response:
    """Book devices (UUIDs or indices) of a host for ``[start, end)``. With an
    ``Idempotency-Key`` header, a retry within 24 h gets the first answer and books nothing."""
    # One hand-off to the thread pool for the whole booking (in_write_unit), so the body is
    # read here rather than as a parameter; the answer is serialised by pydantic here, as
    # response_model documents it: it is built from validated rows, and FastAPI's check of a
    # returned model is one more hand-off per booking.
    raw = await request.body()
    parsed, errors = json_body.parse(ReservationCreate, raw, request.headers.get("content-type"))

    def book(session: Session, user: User) -> Response:
        # the order of a route taking WriteUser and IdempotencyDep: the user, the key, the body
        idem = guard(request, session, user, json_request_key(request, raw))
        data = json_body.require(parsed, errors)
        r = svc.create_reservation(session, actor=user, data=data, settings=settings)
        location = f"/api/v1/reservations/{r.id}"
        out = svc.to_read(r)
        idem.done(201, out, location)
        return Response(out.model_dump_json(), status_code=201, media_type="application/json",
                        headers={"Location": location})

    return await in_write_unit(request, book)


@router.get("", response_model=Page[ReservationRead], responses={404: {}})
def list_reservations(
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    user_filter: Annotated[str | None, Query(alias="user", max_length=64)] = None,
    host: Annotated[str | None, Query(max_length=128)] = None,
    device: Annotated[str | None, Query(max_length=128, description="device UUID")] = None,
    state: Annotated[str | None, Query(pattern="^(upcoming|active|ended|cancelled|released|pending|denied|expired)$")] = None,
    from_: Annotated[str | None, Query(alias="from", max_length=64, description="overlapping [from, to)")] = None,
    to: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> Page[ReservationRead]:
    """Everyone's reservations (who holds what is public in the lab), filtered and paginated;
    a ``user``, ``host`` or ``device`` that does not exist is 404 naming the field."""
    flt = svc.ReservationFilter(
        user=user_filter, host=host, device=device, state=state,
        start=parse_instant(from_, field="from") if from_ else None,
        end=parse_instant(to, field="to") if to else None,
    )
    rows, total = svc.list_reservations(session, flt=flt, limit=min(limit, settings.page_size_max), offset=offset)
    if not total:
        require_known(session, host=host, user=user_filter, device=device)
    return Page[ReservationRead](items=[svc.to_read(r) for r in rows], total=total, limit=limit, offset=offset)


@router.get("/{reservation_id}", response_model=ReservationRead)
def get_reservation(reservation_id: RowId, user: CurrentUser, session: SessionDep) -> ReservationRead:
    return svc.to_read(svc.get_reservation(session, reservation_id))


@router.patch("/{reservation_id}", response_model=ReservationRead, responses={**CONFLICT, 403: {}, 422: {}})
def update_reservation(reservation_id: RowId, data: ReservationUpdate, user: WriteUser, session: WriteSessionDep, settings: SettingsDep) -> ReservationRead:
    """Change the end (extend/shorten) or the note. History cannot be changed (409)."""
    r = svc.update_reservation(session, actor=user, reservation_id=reservation_id, data=data, settings=settings)
    return svc.to_read(r)


@router.delete("/{reservation_id}", response_model=ReservationRead, responses={409: {}, 403: {}})
def delete_reservation(reservation_id: RowId, user: WriteUser, session: WriteSessionDep, settings: SettingsDep) -> ReservationRead:
    """Cancel an upcoming reservation, or release an active one (end = now). The row is kept."""
    return svc.to_read(svc.end_reservation(session, actor=user, reservation_id=reservation_id, tz=settings.tz))


@router.post("/{reservation_id}/release", response_model=ReservationRead, responses={409: {}, 403: {}})
def release_reservation(reservation_id: RowId, user: WriteUser, session: WriteSessionDep, settings: SettingsDep) -> ReservationRead:
    """Give the devices back now: an active reservation ends now, an upcoming one is cancelled."""
    return svc.to_read(svc.end_reservation(session, actor=user, reservation_id=reservation_id, tz=settings.tz))


