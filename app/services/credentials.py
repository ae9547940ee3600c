"""Credentials follow the account: passwords, and the web sessions they opened.

A browser session is only as good as the account state it was opened under. So:

* a password set by an admin (a reset) ends every web session of that user;
* a member changing their own password (current password required) ends every other web
  session of theirs and keeps the one that made the change;
* deactivation ends every web session; API tokens are refused while the account is
  inactive (:func:`app.services.users.user_for_token`) and work again on re-activation,
  since they were suspended, not revoked; ended web sessions never come back (the rows
  are deleted);
* losing the admin role ends every web session, so no page opened as admin stays open.

Functions take the request's session, never commit, and audit what they did.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.errors import Forbidden, InvalidInput
from app.models import User, WebSession
from app.security import hash_password, verify_password
from app.services.audit import record_audit

MIN_PASSWORD = 8
MAX_PASSWORD = 1024


def check_new_password(password: str, *, field: str = "password") -> None:
    """Refuse a password shorter than 8 or longer than 1024 characters (InvalidInput naming ``field``)."""
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"{field}: at least {MIN_PASSWORD} characters", field=field)
    if len(password) > MAX_PASSWORD:
        raise InvalidInput(f"{field}: at most {MAX_PASSWORD} characters", field=field)


def end_web_sessions(
    session: Session, *, user: User, reason: str, actor: str, keep_session_id: int | None = None
) -> int:
    """Delete ``user``'s web sessions (all, or all but ``keep_session_id``); returns how many.

    ``reason`` (e.g. ``"password reset"``) goes into the audit entry ``user.sessions_ended``,
    written even when no session was open, so the log shows the account change was applied.
    """
    q = delete(WebSession).where(WebSession.user_id == user.id)
    count_q = select(func.count()).select_from(WebSession).where(WebSession.user_id == user.id)
    if keep_session_id is not None:
        q = q.where(WebSession.id != keep_session_id)
        count_q = count_q.where(WebSession.id != keep_session_id)
    n = int(session.scalar(count_q) or 0)
    session.execute(q)
    record_audit(session, actor=actor, action="user.sessions_ended", target=f"user:{user.username}",
                 detail={"reason": reason, "sessions": n})
    return n


def after_account_change(
    session: Session, *, user: User, actor: str, was_active: bool, was_admin: bool, password_changed: bool
) -> int:
    """End ``user``'s web sessions when an admin's change calls for it (password set,
    deactivation, loss of the admin role); returns how many ended (0 when none was due)."""
    reasons = []
    if password_changed:
        reasons.append("password reset")
    if was_active and not user.active:
        reasons.append("deactivated")
    if was_admin and not user.is_admin:
        reasons.append("admin role removed")
    if not reasons:
        return 0
    return end_web_sessions(session, user=user, reason=", ".join(reasons), actor=actor)


def set_password(session: Session, *, actor: str, user: User, password: str) -> int:
    """An admin (or the server CLI) sets ``user``'s password: argon2id hash stored, every
    web session of the user ended. Returns the number of sessions ended.
    Raises InvalidInput (``password``) for a too short or too long password."""
    check_new_password(password)
    user.password_hash = hash_password(password)
    record_audit(session, actor=actor, action="user.password_set", target=f"user:{user.username}", detail={})
    return end_web_sessions(session, user=user, reason="password reset", actor=actor)


def change_own_password(
    session: Session, *, user: User, current: str, new: str, keep_session_id: int | None = None
) -> int:
    """A user changes their own password, proving the current one.

    Ends every other web session of the user (``keep_session_id``: the browser that made
    the change stays signed in; ``None`` ends them all). Returns how many ended.
    Raises Forbidden (403, field ``current_password``) for a wrong current password,
    InvalidInput (``new_password``) for a bad new one or one equal to the current.
    """
    if not verify_password(current, user.password_hash):
        raise Forbidden("current_password: wrong password", field="current_password")
    check_new_password(new, field="new_password")
    if new == current:
        raise InvalidInput("new_password: must differ from the current password", field="new_password")
    user.password_hash = hash_password(new)
    who = f"user:{user.username}"
    record_audit(session, actor=who, action="user.password_change", target=who, detail={})
    return end_web_sessions(session, user=user, reason="password change", actor=who, keep_session_id=keep_session_id)
