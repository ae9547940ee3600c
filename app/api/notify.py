"""``/api/v1/notify-targets`` (apprise URLs) and ``/api/v1/me/notice-preferences``."""

from __future__ import annotations

from fastapi import Response

from app.routes import api_router
from app.api.deps import CurrentUser, RowId, SessionDep, WriteSessionDep, WriteUser
from app.errors import InvalidInput
from app.models import Group, NotifyTarget, User
from app.schemas.notify import NoticePreferences, NotifyTargetCreate, NotifyTargetRead
from app.services import channels
from app.services.groups import get_group
from app.services.users import get_user

router = api_router(tags=["notices"])


def _read(session, t: NotifyTarget) -> NotifyTargetRead:
    if t.user_id is not None:
        owner = f"user:{session.get(User, t.user_id).username}"
    elif t.group_id is not None:
        owner = f"group:{session.get(Group, t.group_id).name}"
    else:
        owner = "deployment"
    return NotifyTargetRead(id=t.id, url=channels.redact(t.url), label=t.label, owner=owner, created_at=t.created_at)


@router.get("/notify-targets", response_model=list[NotifyTargetRead])
def list_targets(user: CurrentUser, session: SessionDep) -> list[NotifyTargetRead]:
    """Admins see every target; members their own."""
    return [_read(session, t) for t in channels.visible_targets(session, viewer=user)]


@router.post("/notify-targets", status_code=201, response_model=NotifyTargetRead)
def add_target(data: NotifyTargetCreate, user: WriteUser, session: WriteSessionDep) -> NotifyTargetRead:
    """Add an apprise URL (422 naming ``url`` when apprise does not accept it; 403 for
    another owner than yourself unless admin)."""
    if sum(bool(x) for x in (data.group, data.user, data.deployment)) > 1:
        raise InvalidInput("group, user, deployment: give at most one owner", field="owner")
    owner_user = None if (data.group or data.deployment) else (get_user(session, data.user) if data.user else user)
    group_id = get_group(session, data.group).id if data.group else None
    row = channels.add_target(session, actor=user, url=data.url, label=data.label, user=owner_user, group_id=group_id)
    return _read(session, row)


@router.delete("/notify-targets/{target_id}", status_code=204)
def remove_target(target_id: RowId, user: WriteUser, session: WriteSessionDep) -> Response:
    """Remove a target (its owner or an admin)."""
    channels.remove_target(session, actor=user, target_id=target_id)
    return Response(status_code=204)


@router.get("/me/notice-preferences", response_model=dict[str, bool])
def get_preferences(user: CurrentUser, session: SessionDep) -> dict[str, bool]:
    """The caller's choice per notice kind."""
    return channels.preferences(session, user=user)


@router.put("/me/notice-preferences", response_model=dict[str, bool])
def put_preferences(data: NoticePreferences, user: WriteUser, session: WriteSessionDep) -> dict[str, bool]:
    """Change some of the caller's choices (kinds left out keep theirs)."""
    return channels.set_preferences(session, user=user, choices=data.model_dump(exclude_none=True))


__all__ = ["router"]
