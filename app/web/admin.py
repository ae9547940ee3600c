"""Admin (``/admin``, admins only): users, groups, hosts and devices.

Users are created with :func:`app.services.users.create_user`, groups with
:mod:`app.services.groups`, hosts with :func:`app.services.hosts.create_host`, devices
retired with :func:`app.services.devices.update_device`, users changed with
:func:`app.services.users.update_user` and hosts' policies with
:func:`app.services.hosts.update_host`: the services the JSON API uses.

A new host's token is shown once in the response to the form post (``no-store``), since
only its hash is kept; see :mod:`app.web.profile`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.i18n import lazy_gettext as _l
from app.api.deps import SessionDep, WriteSessionDep
from app.errors import AppError, InvalidInput
from app.models import Device, User, utcnow
from app.schemas.host import HostUpdate
from app.services import credentials
from app.services import device_names
from app.services import devices as device_service
from app.services import groups as group_service
from app.services import device_claims
from app.services import hosts as host_service
from app.services import quarantine as quarantine_service
from app.services import users as user_service
from app.web.deps import AdminFormViewer, AdminPageViewer, FormBody, Viewer, form_str
from app.web.render import page
from app.web.routing import page_router

router = page_router()

NO_STORE = {"Cache-Control": "no-store"}
DONE = {
    "user-created": _l("User created."), "user-changed": _l("User changed."), "group-created": _l("Group created."),
    "members-added": _l("Members added."), "member-removed": _l("Member removed."), "host-changed": _l("Host settings saved."),
    "device-changed": _l("Device changed."),
    "device-moved": _l("Device moved to its new host."),
    "quarantine-cleared": _l("Quarantine cleared: the device is bookable again."),
    "password-set": _l("Password set; that user's browser sessions were ended."),
}


def _names(value: str) -> list[str]:
    """Comma- or whitespace-separated names, without empties or repeats."""
    return list(dict.fromkeys(n for n in value.replace(",", " ").split() if n))


def admin_context(session: Session, *, viewer: Viewer, **extra: Any) -> dict[str, Any]:
    """Users, groups, hosts and devices (retired ones too) for the admin template."""
    now = utcnow()
    users = list(session.scalars(select(User).order_by(User.username)))
    devices = list(session.scalars(select(Device).options(selectinload(Device.host))))
    by_id = {d.id: d for d in devices}
    devices.sort(key=lambda d: (d.host.name, (by_id[d.parent_id] if d.parent_id in by_id else d).index or 0,
                                d.parent_id is not None, d.gpu_instance_id or 0))
    return {
        "viewer": viewer, "active": "admin", "users": users, "groups": group_service.list_groups(session),
        "hosts": device_service.list_hosts(session, now=now), "devices": devices, "parents": by_id,
        "labels": {d.id: device_names.device_label(d, by_id.get(d.parent_id) if d.parent_id else None) for d in devices},
        "now": now, "conflicts": device_claims.list_conflicts(session),
        "quarantines": quarantine_service.history(session, limit=50), **extra,
    }


def _failed(request: Request, session: Session, viewer: Viewer, e: AppError, section: str) -> Response:
    session.rollback()  # nothing of a refused change is kept
    ctx = admin_context(session, viewer=viewer, error=e.detail, error_title=e.title, error_field=e.field,
                        error_section=section)
    return page(request, "admin.html", ctx, status=e.status)


def _done(what: str, section: str) -> Response:
    return RedirectResponse(f"/admin?done={what}#{section}", status_code=303)


@router.get("/admin")
def admin_page(
    request: Request, viewer: AdminPageViewer, session: SessionDep,
    done: Annotated[str | None, Query(max_length=32)] = None,
) -> Response:
    """Users, groups, hosts and devices, with their forms."""
    return page(request, "admin.html", admin_context(session, viewer=viewer, notice=DONE.get(done or "")))


def _uid(form) -> int | None:  # noqa: ANN001 - the parsed form
    """The form's ``unix_uid`` as an int, ``None`` when empty; InvalidInput naming the field."""
    text = form_str(form, "unix_uid").strip()
    if not text:
        return None
    if not text.isdigit():
        raise InvalidInput("unix_uid: a whole number from 0 to 4294967294", field="unix_uid")
    return int(text)


@router.post("/admin/users")
def create_user(request: Request, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Create a user (password optional: without one the account signs in with API tokens only)."""
    try:
        user_service.create_user(
            session, username=form_str(form, "username"), password=form_str(form, "password") or None,
            email=form_str(form, "email") or None, unix_name=form_str(form, "unix_name") or None,
            display_name=form_str(form, "display_name") or None, admin=form_str(form, "admin") == "1",
            actor=f"user:{viewer.user.username}", unix_uid=_uid(form),
        )
    except AppError as e:
        return _failed(request, session, viewer, e, "users")
    return _done("user-created", "users")


@router.post("/admin/users/{username}")
def change_user(
    request: Request, username: str, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody
) -> Response:
    """Change a user's role, Unix name and Unix uid (empty clears it), or (``active``)
    deactivate or reactivate them."""
    active = form_str(form, "active")
    try:
        uid = {"unix_uid": _uid(form)} if "unix_uid" in form else {}
        user_service.update_user(
            session, actor=viewer.user, username=username, role=form_str(form, "role") or None,
            unix_name=form_str(form, "unix_name") or None, active={"1": True, "0": False}.get(active), **uid,
        )
    except AppError as e:
        return _failed(request, session, viewer, e, "users")
    return _done("user-changed", "users")


@router.post("/admin/users/{username}/password")
def set_password(
    request: Request, username: str, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody
) -> Response:
    """Set a user's password (a reset): every web session of that user ends."""
    value = form.get("password")
    try:
        user = user_service.get_user(session, username)
        credentials.set_password(session, actor=f"user:{viewer.user.username}", user=user,
                                 password=value if isinstance(value, str) else "")
    except AppError as e:
        return _failed(request, session, viewer, e, "users")
    if user.id == viewer.user.id:
        return RedirectResponse("/login", status_code=303)  # the admin's own session ended too
    return _done("password-set", "users")


@router.post("/admin/groups")
def create_group(request: Request, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Create a group with optional initial members."""
    try:
        group_service.create_group(
            session, name=form_str(form, "name"), description=form_str(form, "description") or None,
            members=_names(form_str(form, "members")), actor=viewer.user,
        )
    except AppError as e:
        return _failed(request, session, viewer, e, "groups")
    return _done("group-created", "groups")


@router.post("/admin/groups/{name}/members")
def add_members(request: Request, name: str, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Add users (comma-separated usernames) to a group."""
    try:
        users = _names(form_str(form, "users"))
        if not users:
            raise InvalidInput("users: give at least one username", field="users")
        group_service.add_members(session, name=name, usernames=users, actor=viewer.user)
    except AppError as e:
        return _failed(request, session, viewer, e, "groups")
    return _done("members-added", "groups")


@router.post("/admin/groups/{name}/members/remove")
def remove_member(request: Request, name: str, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Remove one user from a group."""
    try:
        group_service.remove_member(session, name=name, username=form_str(form, "user"), actor=viewer.user)
    except AppError as e:
        return _failed(request, session, viewer, e, "groups")
    return _done("member-removed", "groups")


@router.post("/admin/hosts")
def create_host(request: Request, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Register a host and show its host token once (for the agent's ``--token-file``)."""
    try:
        host, token = host_service.create_host(session, name=form_str(form, "name"), actor=f"user:{viewer.user.username}")
    except AppError as e:
        return _failed(request, session, viewer, e, "hosts")
    ctx = admin_context(session, viewer=viewer, new_host=host.name, new_host_token=token)
    return page(request, "admin.html", ctx, status=201, headers=NO_STORE)


def _host_update(form) -> HostUpdate:
    fields: dict[str, Any] = {"policy": form_str(form, "policy") or None}
    grace = form_str(form, "grace_seconds")
    if grace:
        try:
            fields["grace_seconds"] = int(grace)
        except ValueError:
            raise InvalidInput(f"grace_seconds: {grace!r} is not a whole number of seconds", field="grace_seconds") from None
    fields["exempt_users"] = _names(form_str(form, "exempt_users"))
    names = _names(form_str(form, "exempt_process_names"))
    fields["exempt_process_names"] = names or None  # empty: the agent's default list
    fields = {k: v for k, v in fields.items() if v is not None or k == "exempt_process_names"}
    try:
        return HostUpdate(**fields)
    except ValidationError as e:
        first = e.errors()[0]
        name = str(first["loc"][0]) if first.get("loc") else "form"
        raise InvalidInput(f"{name}: {first['msg']}", field=name) from None


@router.post("/admin/hosts/{name}")
def change_host(request: Request, name: str, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Set the host's policy, grace period and exempt lists."""
    try:
        host_service.update_host(
            session, actor=viewer.user, name=name, changes=_host_update(form).model_dump(exclude_unset=True)
        )
    except AppError as e:
        return _failed(request, session, viewer, e, "hosts")
    return _done("host-changed", "hosts")


@router.post("/admin/devices")
def change_device(request: Request, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Retire a device (no longer bookable or shown on Now) or bring it back."""
    retired = {"1": True, "0": False}.get(form_str(form, "retired"))
    try:
        if retired is None:
            raise InvalidInput("retired: '1' to retire, '0' to bring back", field="retired")
        device_service.update_device(
            session, uuid=form_str(form, "uuid"), retired=retired, is_open=None,
            actor=f"user:{viewer.user.username}", now=utcnow(),
        )
    except AppError as e:
        return _failed(request, session, viewer, e, "devices")
    return _done("device-changed", "devices")


@router.post("/admin/devices/move")
def move_device(request: Request, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Register a GPU to another host (after a conflict, or a GPU really moved); audited."""
    try:
        device_claims.move_device(session, actor=viewer.user, uuid=form_str(form, "uuid"), to_host=form_str(form, "host"))
    except AppError as e:
        return _failed(request, session, viewer, e, "devices")
    return _done("device-moved", "devices")


@router.post("/admin/devices/clear-quarantine")
def clear_quarantine(request: Request, viewer: AdminFormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Lift a device's health quarantine once it is repaired (audited), as the API does."""
    try:
        quarantine_service.clear(session, actor=f"user:{viewer.user.username}", uuid=form_str(form, "uuid"),
                                 note=form_str(form, "note") or None, now=utcnow())
    except AppError as e:
        return _failed(request, session, viewer, e, "quarantines")
    return _done("quarantine-cleared", "quarantines")
