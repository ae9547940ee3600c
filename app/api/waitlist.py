"""``/api/v1/waitlist``: wait for devices (book them for me, or tell me, when free), list and
cancel entries (see :mod:`app.services.waitlist` and :mod:`app.services.waitlist_serving`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response

from app.routes import api_router
from app.api.deps import CurrentUser, RowId, SessionDep, SettingsDep, WriteSessionDep, WriteUser
from app.api.idempotency import IdempotencyDep
from app.errors import Forbidden, InvalidInput
from app.models import utcnow
from app.schemas.waitlist import WaitlistCreate, WaitlistRead
from app.services import waitlist as svc
from app.services import waitlist_serving

router = api_router("/waitlist", tags=["waitlist"])


def request_from(data: WaitlistCreate, *, now) -> svc.WaitRequest:
    """The parsed request; raises InvalidInput naming the field."""
    c = data.constraints
    if c is not None and not c.same_host:
        raise InvalidInput("constraints.same_host: a reservation holds devices of one host", field="constraints.same_host")
    start, end = svc.parse_window(start=data.start, end=data.end, within=data.within, tz=data.tz, fold=data.fold, now=now)
    return svc.WaitRequest(count=data.count, length=data.duration, start=start, end=end, book=data.book,
                           host=data.host or None, model=(c.model if c else None) or None,
                           min_memory_mib=c.min_memory_mib if c else None, note=data.note)


@router.post("", status_code=201, response_model=WaitlistRead, responses={403: {}, 404: {}, 422: {}})
def create_entry(data: WaitlistCreate, user: WriteUser, session: WriteSessionDep, settings: SettingsDep,
                 response: Response, idem: IdempotencyDep) -> WaitlistRead:
    """Wait for ``count`` devices for ``duration`` within the window. It is tried at once:
    already free, it is booked (``book``) or you are told, and its state says which;
    otherwise it waits its turn. With an ``Idempotency-Key`` header, a retry within 24 h
    gets the first answer and adds nothing."""
    now = utcnow()
    e = svc.create_entry(session, actor=user, req=request_from(data, now=now), settings=settings, now=now)
    waitlist_serving.serve(session, settings=settings, now=now, only=[e.id])
    response.headers["Location"] = f"/api/v1/waitlist/{e.id}"
    out = svc.to_read(e, now, svc.positions(session, [e], now).get(e.id))
    idem.done(201, out, response.headers["Location"])
    return out


@router.get("", response_model=list[WaitlistRead], responses={403: {}})
def list_entries(
    user: CurrentUser, session: SessionDep,
    user_filter: Annotated[str | None, Query(alias="user", max_length=64, description="admins: this user's")] = None,
    state: Annotated[str | None, Query(pattern="^(waiting|booked|notified|cancelled|expired)$")] = None,
) -> list[WaitlistRead]:
    """Your entries, oldest first (admins: everyone's, or ``user``'s), with each waiting
    entry's place in the queue."""
    now = utcnow()
    rows = svc.list_entries(session, actor=user, username=user_filter, status=state)
    pos = svc.positions(session, rows, now)
    return [svc.to_read(e, now, pos.get(e.id)) for e in rows]


@router.get("/{entry_id}", response_model=WaitlistRead, responses={403: {}, 404: {}})
def get_entry(entry_id: RowId, user: CurrentUser, session: SessionDep) -> WaitlistRead:
    """One entry (yours; admins: anyone's)."""
    now = utcnow()
    e = svc.get_entry(session, entry_id)
    if e.user_id != user.id and not user.is_admin:
        raise Forbidden(f"waitlist entry {entry_id} belongs to {e.user.username}")
    return svc.to_read(e, now, svc.positions(session, [e], now).get(e.id))


@router.delete("/{entry_id}", response_model=WaitlistRead, responses={403: {}, 404: {}, 409: {}})
def cancel_entry(entry_id: RowId, user: WriteUser, session: WriteSessionDep, settings: SettingsDep) -> WaitlistRead:
    """Withdraw a waiting entry (yours; admins: anyone's). One already booked, told,
    expired or cancelled is a 409 saying which."""
    now = utcnow()
    return svc.to_read(svc.cancel_entry(session, actor=user, entry_id=entry_id, now=now, settings=settings), now)


__all__ = ["request_from", "router"]
