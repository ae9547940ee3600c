"""Sharing rules, groups, open devices, usage, availability, recurring series and the CLI's
password sign-in (all under ``/api/v1``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import Query, Request, Response

from app.routes import api_router
from app.api.boosts import boost_read
from app.api.deps import AdminUser, CurrentUser, SessionDep, SettingsDep, WriteSessionDep, WriteUser
from app.api.idempotency import IdempotencyDep
from app.client.units import parse_duration
from app.errors import Forbidden, InvalidInput
from app.problems import problem_response
from app.models import Host, SharingRule, utcnow
from app.schemas.rules import (
    AvailabilityRead,
    GroupCreate,
    GroupRead,
    LimitUsage,
    MembersAdd,
    OpenDeviceRead,
    OpenDevicesChange,
    PasswordLogin,
    QuotaWindow,
    RuleCreate,
    RuleRead,
    RuleUpdate,
    SlotRead,
    UsageRead,
)
from app.schemas.reservation import PlacementConstraints
from app.schemas.series import SeriesCancelled, SeriesCreate, SeriesRead
from app.schemas.user import TokenCreated
from app.services import cli_login, placement
from app.services import groups as group_service
from app.services import limit_usage
from app.services.limits import LIMIT_FIELDS
from app.services import rule_admin
from app.services import series as series_service
from app.services import users as user_service
from app.timeutil import parse_instant

router = api_router()

RULE_FIELDS = LIMIT_FIELDS + ("note",)


def _rule_read(r: SharingRule, names: dict[int, str]) -> RuleRead:
    return RuleRead(
        id=r.id, scope=r.scope,  # type: ignore[arg-type]
        user=names.get(r.id) if r.scope == "user" else None, group=names.get(r.id) if r.scope == "group" else None,
        **{f: getattr(r, f) for f in RULE_FIELDS}, created_at=r.created_at, updated_at=r.updated_at,
    )


# ---------------------------------------------------------------------------- open devices


def _open(session, d, ahead: int | None = None) -> OpenDeviceRead:
    host = session.get(Host, d.host_id)
    return OpenDeviceRead(uuid=d.uuid, host=host.name if host else "", index=d.index, name=d.name, is_open=d.is_open,
                          reservations_ahead=ahead)


@router.get("/rules/open-devices", response_model=list[OpenDeviceRead], tags=["rules"])
def list_open_devices(user: CurrentUser, session: SessionDep) -> list[OpenDeviceRead]:
    """Devices anyone may use without a reservation."""
    return [_open(session, d) for d in rule_admin.list_open_devices(session)]


@router.post("/rules/open-devices", response_model=list[OpenDeviceRead], tags=["rules"], responses={404: {}})
def open_devices(data: OpenDevicesChange, admin: AdminUser, session: WriteSessionDep) -> list[OpenDeviceRead]:
    """Admins: open devices to everyone (no reservation needed; the agent stops flagging them).
    Reservations still on them are kept and counted in ``reservations_ahead``."""
    rows = rule_admin.set_open(session, uuids=data.devices, is_open=True, actor=admin, now=utcnow())
    return [_open(session, d, n) for d, n in rows]


@router.delete("/rules/open-devices/{uuid}", response_model=OpenDeviceRead, tags=["rules"], responses={404: {}})
def close_device(uuid: str, admin: AdminUser, session: WriteSessionDep) -> OpenDeviceRead:
    """Admins: make an open device reservable only again."""
    d, n = rule_admin.set_open(session, uuids=[uuid], is_open=False, actor=admin, now=utcnow())[0]
    return _open(session, d, n)


# ---------------------------------------------------------------------------- rules


@router.get("/rules", response_model=list[RuleRead], tags=["rules"])
def list_rules(user: CurrentUser, session: SessionDep) -> list[RuleRead]:
    """Every sharing rule (the lab's policy is public to its members)."""
    rules = rule_admin.list_rules(session)
    names = rule_admin.rule_target_names(session, rules)
    return [_rule_read(r, names) for r in rules]


@router.post("/rules", status_code=201, response_model=RuleRead, tags=["rules"], responses={409: {}, 422: {}})
def create_rule(data: RuleCreate, admin: AdminUser, session: WriteSessionDep, response: Response) -> RuleRead:
    """Admins: a rule for the lab (``default``), a ``group`` or a ``user``; one per target."""
    values = data.model_dump(exclude_unset=True, exclude={"scope", "user", "group"})
    r = rule_admin.create_rule(session, scope=data.scope, user=data.user, group=data.group, values=values, actor=admin)
    response.headers["Location"] = f"/api/v1/rules/{r.id}"
    return _rule_read(r, rule_admin.rule_target_names(session, [r]))


@router.get("/rules/{rule_id}", response_model=RuleRead, tags=["rules"], responses={404: {}})
def get_rule(rule_id: int, user: CurrentUser, session: SessionDep) -> RuleRead:
    r = rule_admin.get_rule(session, rule_id)
    return _rule_read(r, rule_admin.rule_target_names(session, [r]))


@router.patch("/rules/{rule_id}", response_model=RuleRead, tags=["rules"], responses={404: {}, 422: {}})
def update_rule(rule_id: int, data: RuleUpdate, admin: AdminUser, session: WriteSessionDep) -> RuleRead:
    """Admins: set limits, or clear one with ``null`` (it is inherited again)."""
    r = rule_admin.update_rule(session, rule_id=rule_id, changes=data.model_dump(exclude_unset=True), actor=admin)
    return _rule_read(r, rule_admin.rule_target_names(session, [r]))


@router.delete("/rules/{rule_id}", response_model=RuleRead, tags=["rules"], responses={404: {}})
def delete_rule(rule_id: int, admin: AdminUser, session: WriteSessionDep) -> RuleRead:
    """Admins: delete a rule; returns it as it was."""
    r = rule_admin.get_rule(session, rule_id)
    read = _rule_read(r, rule_admin.rule_target_names(session, [r]))
    rule_admin.delete_rule(session, rule_id=rule_id, actor=admin)
    return read


# ---------------------------------------------------------------------------- groups


@router.get("/groups", response_model=list[GroupRead], tags=["groups"])
def list_groups(user: CurrentUser, session: SessionDep) -> list[GroupRead]:
    return [GroupRead(name=g.name, description=g.description, members=m, created_at=g.created_at)
            for g, m in group_service.list_groups(session)]


def _group_read(session, g) -> GroupRead:
    return GroupRead(name=g.name, description=g.description, members=group_service.member_names(session, g),
                     created_at=g.created_at)


@router.post("/groups", status_code=201, response_model=GroupRead, tags=["groups"], responses={409: {}, 422: {}})
def create_group(data: GroupCreate, admin: AdminUser, session: WriteSessionDep) -> GroupRead:
    """Admins: create a group, optionally with members."""
    g = group_service.create_group(session, name=data.name, description=data.description, members=data.members, actor=admin)
    return _group_read(session, g)


@router.get("/groups/{name}", response_model=GroupRead, tags=["groups"], responses={404: {}})
def get_group(name: str, user: CurrentUser, session: SessionDep) -> GroupRead:
    return _group_read(session, group_service.get_group(session, name))


@router.delete("/groups/{name}", response_model=GroupRead, tags=["groups"], responses={404: {}})
def delete_group(name: str, admin: AdminUser, session: WriteSessionDep) -> GroupRead:
    """Admins: delete a group with its rules and the shares naming it; returns it as it was."""
    read = _group_read(session, group_service.get_group(session, name))
    group_service.delete_group(session, name=name, actor=admin)
    return read


@router.post("/groups/{name}/members", response_model=GroupRead, tags=["groups"], responses={404: {}, 422: {}})
def add_members(name: str, data: MembersAdd, admin: AdminUser, session: WriteSessionDep) -> GroupRead:
    """Admins: add users to a group."""
    return _group_read(session, group_service.add_members(session, name=name, usernames=data.users, actor=admin))


@router.delete("/groups/{name}/members/{username}", response_model=GroupRead, tags=["groups"], responses={404: {}})
def remove_member(name: str, username: str, admin: AdminUser, session: WriteSessionDep) -> GroupRead:
    """Admins: remove a user from a group."""
    return _group_read(session, group_service.remove_member(session, name=name, username=username, actor=admin))


# ---------------------------------------------------------------------------- usage, availability


@router.get("/me/usage", response_model=UsageRead, tags=["rules"])
def my_usage(
    user: CurrentUser, session: SessionDep, settings: SettingsDep,
    of: Annotated[str | None, Query(alias="user", max_length=64, description="admins: another user")] = None,
) -> UsageRead:
    """Each limit that applies to the caller: its value and source, what is used, what is left."""
    who = user
    if of and of != user.username:
        if not user.is_admin:
            raise Forbidden("user: only admins may see another user's usage", field="user")
        who = user_service.get_user(session, of)
    u = limit_usage.usage(session, user=who, now=utcnow(), tz=settings.tz)
    return UsageRead(user=u["user"], timezone=u["timezone"], now=u["now"], window=QuotaWindow(**u["window"]),
                     limits=[LimitUsage(**vars(i)) for i in u["limits"]],
                     boosts=[boost_read(b, u["now"]) for b in u["boosts"]])


def _duration_param(value: str) -> float:
    try:
        return parse_duration(value, allow_seconds=True).total_seconds()
    except ValueError as e:
        raise InvalidInput(f"duration: {e}", field="duration") from None


@router.get("/availability", response_model=AvailabilityRead, tags=["reservations"], responses={422: {}})
def availability(
    user: CurrentUser,
    session: SessionDep,
    duration: Annotated[str, Query(max_length=32, description="4h, 90m, 2d, PT4H or seconds")],
    count: Annotated[int, Query(ge=1, le=64)] = 1,
    host: Annotated[str | None, Query(max_length=128)] = None,
    model: Annotated[str | None, Query(max_length=128, description="GPU model substring")] = None,
    min_memory: Annotated[float | None, Query(ge=0, description="minimum total memory per device, MiB")] = None,
    from_: Annotated[str | None, Query(alias="from", max_length=64, description="not before (ISO 8601); default now")] = None,
    limit: Annotated[int, Query(ge=1, le=50)] = 5,
) -> AvailabilityRead:
    """The next free slots where ``count`` devices matching the constraints are free for ``duration``."""
    now = utcnow()
    seconds = _duration_param(duration)
    after = parse_instant(from_, field="from", now=now) if from_ else now
    after = max(after, now)
    req = placement.request_for(session, count=count, host=host, constraints=PlacementConstraints(model=model, min_memory_mib=min_memory),
                                owner=user, override=False)
    slots = placement.availability(session, req=req, after=after, length=timedelta(seconds=seconds), now=now, limit=limit)
    return AvailabilityRead(count=count, duration_seconds=seconds, slots=[
        SlotRead(host=s.host.name, start=s.start, end=s.end, devices=[d.uuid for d in s.devices],
                 indices=[d.index for d in s.devices], free_until=s.free_until)
        for s in slots
    ])


# ---------------------------------------------------------------------------- series


@router.post("/series", status_code=201, response_model=SeriesRead, tags=["series"], responses={403: {}, 409: {}, 422: {}})
def create_series(data: SeriesCreate, user: WriteUser, session: WriteSessionDep, settings: SettingsDep,
                  response: Response, idem: IdempotencyDep) -> SeriesRead:
    """Book a recurring reservation (all occurrences or none). ``dry_run``: 200 with the
    occurrences that would be stored, nothing stored. With an ``Idempotency-Key`` header, a
    retry within 24 h gets the first answer and books nothing."""
    read = series_service.create_series(session, actor=user, data=data, settings=settings)
    if read.dry_run:
        response.status_code = 200
    else:
        response.headers["Location"] = f"/api/v1/series/{read.id}"
        idem.done(201, read, response.headers["Location"])
    return read


@router.get("/series", response_model=list[SeriesRead], tags=["series"])
def list_series(
    user: CurrentUser, session: SessionDep,
    of: Annotated[str | None, Query(alias="user", max_length=64, description="only this user's series")] = None,
) -> list[SeriesRead]:
    return [series_service.series_read(session, s) for s in series_service.list_series(session, user=of)]


@router.get("/series/{series_id}", response_model=SeriesRead, tags=["series"], responses={404: {}})
def get_series(series_id: int, user: CurrentUser, session: SessionDep) -> SeriesRead:
    return series_service.series_read(session, series_service.get_series(session, series_id))


@router.delete("/series/{series_id}", response_model=SeriesCancelled, tags=["series"], responses={403: {}, 404: {}})
def cancel_series(series_id: int, user: WriteUser, session: WriteSessionDep) -> SeriesCancelled:
    """Cancel every upcoming occurrence (one occurrence alone: ``DELETE /reservations/{id}``)."""
    s, n, kept = series_service.cancel_series(session, actor=user, series_id=series_id)
    return SeriesCancelled(**series_service.series_read(session, s).model_dump(), cancelled=n, kept=kept)


# ---------------------------------------------------------------------------- CLI sign-in


@router.post("/auth/token", status_code=201, response_model=TokenCreated, tags=["users"], responses={401: {}, 429: {}})
def token_by_password(data: PasswordLogin, request: Request, session: WriteSessionDep, settings: SettingsDep):
    """Trade a username and password for an API token (``gpuroster login``). Failed attempts
    are throttled per user and address: ``login_max_attempts`` per ``login_window_seconds``, then 429."""
    out = cli_login.issue_token(
        session, username=data.username, password=data.password, address=request.client.host if request.client else None,
        name=data.name, expires_days=data.expires_days, settings=settings,
    )
    if out.error is not None:
        headers = {"Retry-After": str(out.retry_after)} if out.retry_after else {"WWW-Authenticate": "Bearer"}
        return problem_response(out.error.status, out.error.to_problem(request.url.path), headers)
    row = out.row
    assert row is not None and out.token is not None
    return TokenCreated(id=row.id, name=row.name, prefix=row.prefix, created_at=row.created_at, last_used_at=row.last_used_at,
                        expires_at=row.expires_at, revoked_at=row.revoked_at, token=out.token)

