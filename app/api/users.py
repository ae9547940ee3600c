"""``/api/v1/users``, ``/api/v1/tokens`` and ``/api/v1/me``."""

from __future__ import annotations

from fastapi import Response
from sqlalchemy import select

from app.routes import api_router
from app.api.deps import AdminUser, CurrentUser, PageDep, RowId, SessionDep, WriteSessionDep, WriteUser
from app.errors import Forbidden
from app.models import ApiToken, User
from app.schemas.user import (
    LanguageChoice,
    PasswordChange,
    PasswordChanged,
    TokenCreate,
    TokenCreated,
    TokenRead,
    UserCreate,
    UserRead,
    UserUpdate,
)
from app.services import credentials
from app.services import users as user_service

router = api_router(tags=["users"])


def _user_read(session, u: User) -> UserRead:
    return UserRead(
        username=u.username, display_name=u.display_name, email=u.email, unix_name=u.unix_name, unix_uid=u.unix_uid, role=u.role,
        active=u.active, groups=user_service.group_names_of(session, u), created_at=u.created_at, language=u.language,
    )


@router.get("/me", response_model=UserRead)
def me(user: CurrentUser, session: SessionDep) -> UserRead:
    """The caller's account."""
    return _user_read(session, user)


@router.put("/me/language", response_model=UserRead, responses={422: {}})
def set_my_language(data: LanguageChoice, user: WriteUser, session: WriteSessionDep) -> UserRead:
    """Choose the caller's language for pages and notices (``en``, ``zh_CN``, or ``null`` for
    the browser's ``Accept-Language``)."""
    return _user_read(session, user_service.set_language(session, user=user, language=data.language))


@router.post("/me/password", response_model=PasswordChanged, responses={403: {}, 422: {}})
def change_my_password(data: PasswordChange, user: WriteUser, session: WriteSessionDep) -> PasswordChanged:
    """Change the caller's password (``current_password`` required; 403 when wrong). Every web
    session of the caller ends; API tokens keep working."""
    return PasswordChanged(sessions_ended=credentials.change_own_password(
        session, user=user, current=data.current_password, new=data.new_password))


@router.get("/users", response_model=list[UserRead])
def list_users(user: CurrentUser, session: SessionDep, page: PageDep, response: Response) -> list[UserRead]:
    """All accounts (lab members see who is who; e-mail addresses only for admins);
    paginated (``limit``, ``offset``; total in ``X-Total-Count``)."""
    rows = page.apply(list(session.scalars(select(User).order_by(User.username))), response)
    out = [_user_read(session, u) for u in rows]
    if not user.is_admin:
        for r in out:
            r.email = None
    return out


@router.post("/users", status_code=201, response_model=UserRead)
def create_user(data: UserCreate, admin: AdminUser, session: WriteSessionDep) -> UserRead:
    u = user_service.create_user(
        session, username=data.username, password=data.password, email=data.email, unix_name=data.unix_name,
        display_name=data.display_name, admin=data.role == "admin", actor=f"user:{admin.username}", unix_uid=data.unix_uid,
    )
    return _user_read(session, u)


@router.patch("/users/{username}", response_model=UserRead)
def update_user(username: str, data: UserUpdate, admin: AdminUser, session: WriteSessionDep) -> UserRead:
    """Admins change a user's role, Unix name, Unix uid, e-mail, password, or deactivate them."""
    given = data.model_dump(exclude_unset=True)
    optional = {k: given[k] for k in ("email", "display_name", "unix_uid") if k in given}
    u = user_service.update_user(
        session, actor=admin, username=username, role=given.get("role"), unix_name=given.get("unix_name"),
        active=given.get("active"), password=given.get("password"), **optional,
    )
    return _user_read(session, u)


def _token_read(t: ApiToken) -> TokenRead:
    return TokenRead(id=t.id, name=t.name, prefix=t.prefix, created_at=t.created_at, last_used_at=t.last_used_at,
                     expires_at=t.expires_at, revoked_at=t.revoked_at)


@router.get("/tokens", response_model=list[TokenRead])
def list_tokens(user: CurrentUser, session: SessionDep) -> list[TokenRead]:
    """The caller's API tokens (never the secrets)."""
    rows = session.scalars(select(ApiToken).where(ApiToken.user_id == user.id).order_by(ApiToken.id))
    return [_token_read(t) for t in rows]


@router.post("/tokens", status_code=201, response_model=TokenCreated)
def create_token(data: TokenCreate, user: WriteUser, session: WriteSessionDep) -> TokenCreated:
    """Create an API token for the caller (admins: for ``user``); the secret is shown once."""
    owner = user
    if data.user and data.user != user.username:
        if not user.is_admin:
            raise Forbidden("user: only admins may create tokens for another user", field="user")
        owner = user_service.get_user(session, data.user)
    row, plain = user_service.create_api_token(session, user=owner, name=data.name, expires_days=data.expires_days)
    return TokenCreated(**_token_read(row).model_dump(), token=plain)


@router.delete("/tokens/{token_id}", response_model=TokenRead)
def revoke_token(token_id: RowId, user: WriteUser, session: WriteSessionDep) -> TokenRead:
    return _token_read(user_service.revoke_api_token(session, user=user, token_id=token_id))
