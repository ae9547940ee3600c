"""Users, groups and API tokens."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from app.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from app.models import ApiToken, Group, GroupMember, User, utcnow
from app.security import API_TOKEN_PREFIX, hash_password, new_token, token_hash
from app.services.token_usage import TokenUsage
from app.services import credentials
from app.services.audit import record_audit

NAME_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
MIN_PASSWORD = 8


def validate_name(value: str, *, field: str) -> str:
    """A POSIX-style account name (lower case, digits, ``_.-``; at most 32); raises InvalidInput."""
    if not NAME_RE.match(value or ""):
        raise InvalidInput(
            f"{field}: {value!r} must start with a letter or '_' and use only a-z, 0-9, '_', '.', '-' (max 32)",
            field=field,
        )
    return value


def create_user(
    session: Session,
    *,
    username: str,
    password: str | None = None,
    email: str | None = None,
    unix_name: str | None = None,
    display_name: str | None = None,
    admin: bool = False,
    actor: str = "system",
    unix_uid: int | None = None,
) -> User:
    """Create a user; ``unix_name`` defaults to ``username``. Raises Conflict if either, or
    the Unix uid ``unix_uid``, is taken; InvalidInput for a uid outside 0..2^32-2."""
    validate_name(username, field="username")
    unix = validate_name(unix_name or username, field="unix_name")
    if password is not None and len(password) < MIN_PASSWORD:
        raise InvalidInput(f"password: at least {MIN_PASSWORD} characters", field="password")
    if email is not None and "@" not in email:
        raise InvalidInput("email: not an e-mail address", field="email")
    clash = session.scalar(select(User).where((User.username == username) | (User.unix_name == unix)))
    if clash is not None:
        what = "username" if clash.username == username else "unix_name"
        raise Conflict(f"{what}: {username if what == 'username' else unix!r} is already taken", field=what)
    _check_uid(session, unix_uid, None)
    user = User(
        username=username,
        unix_name=unix,
        unix_uid=unix_uid,
        email=email,
        display_name=display_name,
        role="admin" if admin else "member",
        password_hash=hash_password(password) if password else None,
    )
    session.add(user)
    session.flush()
    record_audit(session, actor=actor, action="user.create", target=f"user:{username}", detail={"admin": admin})
    return user


_UNSET: object = object()


def _check_uid(session: Session, uid: int | None, user_id: int | None) -> None:
    """Raise InvalidInput for a uid outside 0..2^32-2, Conflict when another user has it."""
    if uid is None:
        return
    if isinstance(uid, bool) or not isinstance(uid, int) or not 0 <= uid <= 2**32 - 2:
        raise InvalidInput("unix_uid: a whole number from 0 to 4294967294", field="unix_uid")
    other = session.scalar(select(User.username).where(User.unix_uid == uid, User.id != user_id) if user_id
                           else select(User.username).where(User.unix_uid == uid))
    if other is not None:
        raise Conflict(f"unix_uid: {uid} already belongs to {other}", field="unix_uid")


def update_user(
    session: Session,
    *,
    actor: User,
    username: str,
    role: str | None = None,
    unix_name: str | None = None,
    active: bool | None = None,
    email: str | None | object = _UNSET,
    display_name: str | None | object = _UNSET,
    password: str | None = None,
    unix_uid: int | None | object = _UNSET,
    audit_actor: str | None = None,
) -> User:
    """Admin change of a user: role, Unix name (unique), Unix uid (unique), active flag,
    e-mail, display name, password. ``None`` leaves a field alone (e-mail, display name and
    Unix uid: pass ``None`` to clear).
    Admins cannot demote or deactivate themselves. Audit-logged (the password as "changed") as
    ``user:<actor>``, or ``audit_actor`` (the server CLI logs ``cli``).
    A new password, deactivation or loss of the admin role ends the user's web sessions
    (:func:`app.services.credentials.after_account_change`).
    Raises NotFound, InvalidInput, Conflict (Unix name taken), Forbidden.
    """
    u = get_user(session, username)
    changes: dict[str, object] = {}
    if role is not None:
        if role not in ("member", "admin"):
            raise InvalidInput("role: 'member' or 'admin'", field="role")
        changes["role"] = role
    if unix_name is not None and unix_name != u.unix_name:
        validate_name(unix_name, field="unix_name")
        if session.scalar(select(User.id).where(User.unix_name == unix_name, User.id != u.id)) is not None:
            raise Conflict(f"unix_name: {unix_name!r} is already taken", field="unix_name")
        changes["unix_name"] = unix_name
    if active is not None:
        changes["active"] = active
    if unix_uid is not _UNSET and unix_uid != u.unix_uid:
        _check_uid(session, unix_uid, u.id)  # type: ignore[arg-type]
        changes["unix_uid"] = unix_uid
    if email is not _UNSET:
        if email is not None and "@" not in str(email):
            raise InvalidInput("email: not an e-mail address", field="email")
        changes["email"] = email
    if display_name is not _UNSET:
        changes["display_name"] = display_name
    if password is not None and len(password) < MIN_PASSWORD:
        raise InvalidInput(f"password: at least {MIN_PASSWORD} characters", field="password")
    if u.id == actor.id and (changes.get("active") is False or changes.get("role") == "member"):
        raise Forbidden("admins cannot deactivate or demote themselves")
    was_active, was_admin = u.active, u.is_admin
    for k, v in changes.items():
        setattr(u, k, v)
    if password is not None:
        u.password_hash = hash_password(password)
    detail = dict(changes) | ({"password": "changed"} if password is not None else {})
    who = audit_actor or f"user:{actor.username}"
    record_audit(session, actor=who, action="user.update", target=f"user:{username}", detail=detail)
    credentials.after_account_change(session, user=u, actor=who, was_active=was_active,
                                     was_admin=was_admin, password_changed=password is not None)
    session.flush()
    return u


def get_user(session: Session, username: str) -> User:
    user = session.scalar(select(User).where(User.username == username))
    if user is None:
        raise NotFound(f"user {username!r} not found", field="user")
    return user


def create_api_token(
    session: Session, *, user: User, name: str = "token", expires_days: int | None = None
) -> tuple[ApiToken, str]:
    """Create an API token; returns the row and the plain token (shown once, stored as SHA-256)."""
    if expires_days is not None and expires_days <= 0:
        raise InvalidInput("expires: must be a positive number of days", field="expires")
    plain = new_token(API_TOKEN_PREFIX)
    row = ApiToken(
        user_id=user.id,
        name=name,
        prefix=plain[:10],
        token_hash=token_hash(plain),
        expires_at=utcnow() + timedelta(days=expires_days) if expires_days else None,
    )
    session.add(row)
    session.flush()
    return row, plain


def revoke_api_token(session: Session, *, user: User, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None or (row.user_id != user.id and not user.is_admin):
        raise NotFound(f"token {token_id} not found", field="token")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


# Every API request authenticates through this statement: built once, since building and
# hashing it anew cost more CPU than running it. The token's columns that the check reads,
# not the token as an entity: only the user is handed on.
_TOKEN_AND_USER = (select(ApiToken.id, ApiToken.last_used_at, ApiToken.expires_at, ApiToken.revoked_at, User)
                   .join(User, User.id == ApiToken.user_id)
                   .where(ApiToken.token_hash == bindparam("token_hash")))


def user_for_token(session: Session, plain: str, *, now: datetime | None = None, usage: TokenUsage | None = None) -> User:
    """The active user owning the API token ``plain``; raises Unauthorized otherwise.

    Reads only: the use is noted in ``usage`` (written later, in its own transaction, by
    :meth:`TokenUsage.flush`), never written in the caller's transaction, which may be a read.
    """
    now = now or utcnow()
    found = session.execute(_TOKEN_AND_USER, {"token_hash": token_hash(plain)}).first()
    if found is None:
        raise Unauthorized("invalid, expired or revoked token")
    token_id, last_used_at, expires_at, revoked_at, user = found
    if revoked_at is not None or (expires_at is not None and expires_at <= now):
        raise Unauthorized("invalid, expired or revoked token")
    if not user.active:
        raise Unauthorized("user is deactivated")
    if usage is not None:
        usage.note(token_id, last_used_at, now)
    return user


def group_names_of(session: Session, user: User) -> list[str]:
    rows = session.scalars(
        select(Group.name).join(GroupMember, GroupMember.group_id == Group.id).where(GroupMember.user_id == user.id)
    )
    return list(rows)


def set_language(session: Session, *, user: User, language: str | None) -> User:
    """Store ``user``'s language for pages and notices: a locale of :data:`app.i18n.LANGUAGES`
    (``"en"``, ``"zh_CN"``), or ``None``/``""`` to follow the browser's ``Accept-Language``.
    Raises InvalidInput (field ``language``) for any other value."""
    from app.i18n import LANGUAGES

    value = language or None
    if value is not None and value not in LANGUAGES:
        raise InvalidInput(f"language: {language!r} is not offered (one of {', '.join(LANGUAGES)}, or empty)",
                           field="language")
    user.language = value
    session.flush()
    return user
