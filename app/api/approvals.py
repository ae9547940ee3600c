"""``/api/v1/approvals``, ``/api/v1/reservations/{id}/approve|deny``, group managers and
``/api/v1/maintenance`` (see :mod:`app.services.approvals` and :mod:`app.services.maintenance`)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Response
from sqlalchemy import select

from app.routes import api_router
from app.api.deps import AdminUser, CurrentUser, RowId, SessionDep, SettingsDep, WriteSessionDep, WriteUser
from app.api.idempotency import IdempotencyDep
from app.errors import InvalidInput
from app.models import GroupMember, User, utcnow
from app.periodic import run_periodically
from app.schemas.approvals import Decision, MaintenanceCreate, MaintenanceRead, ManagersChange, OverriddenRead
from app.schemas.reservation import ReservationRead
from app.services import approvals as svc
from app.services import groups as group_service
from app.services import maintenance as maintenance_service
from app.services import reservations as reservation_service
from app.services.conflicts import loaded_options
from app.timeutil import parse_instant
from app.services.audit import record_audit

router = api_router(tags=["approvals"])
log = logging.getLogger(__name__)
EXPIRE_PERIOD_S = 60.0  # how often pending reservations that reached their start are stored as expired
DECIDE = {403: {"description": "not an admin nor a manager of the owner's group"},
          409: {"description": "no longer pending: names who changed it and when"}}


@router.get("/approvals", response_model=list[ReservationRead])
def pending(user: CurrentUser, session: SessionDep) -> list[ReservationRead]:
    """Pending reservations the caller may decide (admins: all; group managers: their groups'), soonest first."""
    now = utcnow()
    return [reservation_service.to_read(r, now) for r in svc.list_pending(session, actor=user, now=now,
                                                                           load_options=loaded_options())]


@router.post("/reservations/{reservation_id}/approve", response_model=ReservationRead, responses=DECIDE)
def approve(reservation_id: RowId, user: WriteUser, session: WriteSessionDep, settings: SettingsDep,
            data: Decision | None = None) -> ReservationRead:
    """Confirm a pending reservation; the requester is told."""
    r = svc.decide(session, actor=user, reservation_id=reservation_id, approve=True, reason=data.reason if data else None,
                   settings=settings, now=utcnow(), load=reservation_service.load_locked)
    return reservation_service.to_read(r)


@router.post("/reservations/{reservation_id}/deny", response_model=ReservationRead, responses=DECIDE)
def deny(reservation_id: RowId, user: WriteUser, session: WriteSessionDep, settings: SettingsDep,
         data: Decision | None = None) -> ReservationRead:
    """Refuse a pending reservation (its devices are freed); the requester is told, with the reason."""
    r = svc.decide(session, actor=user, reservation_id=reservation_id, approve=False, reason=data.reason if data else None,
                   settings=settings, now=utcnow(), load=reservation_service.load_locked)
    return reservation_service.to_read(r)


@router.post("/groups/{name}/managers", response_model=list[str], tags=["groups"], responses={404: {}, 422: {}})
def set_managers(name: str, data: ManagersChange, admin: AdminUser, session: WriteSessionDep) -> list[str]:
    """Make members of group ``name`` managers (``manager: false`` removes the role); returns
    the group's managers."""
    g = group_service.get_group(session, name)
    for username in dict.fromkeys(data.users):
        uid = session.scalar(select(User.id).where(User.username == username))
        m = session.get(GroupMember, (g.id, uid)) if uid is not None else None
        if m is None:
            raise InvalidInput(f"users: {username!r} is not a member of group {name!r}", field="users")
        m.is_manager = data.manager
    record_audit(session, actor=f"user:{admin.username}", action="group.managers", target=f"group:{name}",
                 detail={"users": data.users, "manager": data.manager})
    session.flush()
    return managers(session, g.id)


def managers(session, group_id: int) -> list[str]:
    """Usernames of the managers of group ``group_id``, sorted."""
    return sorted(session.scalars(select(User.username).join(GroupMember, GroupMember.user_id == User.id)
                                  .where(GroupMember.group_id == group_id, GroupMember.is_manager.is_(True))))


@router.post("/maintenance", status_code=201, response_model=MaintenanceRead, tags=["reservations"],
             responses={403: {}, 404: {}, 409: {"description": "conflicts, listed (without override)"}, 422: {}})
def create_maintenance(data: MaintenanceCreate, admin: AdminUser, session: WriteSessionDep,
                       settings: SettingsDep, response: Response, idem: IdempotencyDep) -> MaintenanceRead:
    """Hold a host's devices for maintenance (admins), open-ended when ``end`` is omitted. With
    an ``Idempotency-Key`` header, a retry within 24 h gets the first answer and holds nothing more."""
    now = utcnow()
    start = max(parse_instant(data.start, field="start", now=now), now)
    end = parse_instant(data.end, field="end", now=now) if data.end else None
    m, done = maintenance_service.create(session, actor=admin, host_name=data.host, refs=data.devices, start=start,
                                         end=end, reason=data.reason, override=data.override, settings=settings,
                                         now=now, load=reservation_service.load_locked)
    out = MaintenanceRead(maintenance=reservation_service.to_read(m, now),
                          overridden=[OverriddenRead(id=o.id, user=o.user, action=o.action, end=o.end) for o in done])
    response.headers["Location"] = f"/api/v1/reservations/{m.id}"
    idem.done(201, out, response.headers["Location"])
    return out


def expire_once(app: FastAPI) -> int:
    """Store ``expired`` for every pending reservation at or past its start (owners told,
    devices freed, slot listeners run); returns how many."""
    from app.db import run_in_transaction

    settings = app.state.settings
    return run_in_transaction(app.state.session_factory, lambda s: len(svc.expire_due(
        s, now=utcnow(), settings=settings, load=reservation_service.load_locked)))


def _report(n: int) -> None:
    if n:
        log.info("%d pending reservation(s) expired unapproved", n)


def install_expiry(app: FastAPI, *, period: float = EXPIRE_PERIOD_S) -> None:
    """Run the expiry of unapproved pending reservations inside the app's lifespan (bookings
    that meet a due one expire it too)."""
    run_periodically(app, name="gpuroster-expire-pending", what="expiring pending reservations", work=expire_once,
                     period=period, report=_report)


__all__ = ["expire_once", "install_expiry", "router"]
