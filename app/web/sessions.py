"""Browser sign-in: server-side sessions, CSRF tokens and sign-in throttling.

A session is a random cookie value; the database keeps only its SHA-256
(``web_sessions.token_hash``) with the user, a per-session CSRF token and the expiry, so
any number of app processes share sessions. Failed sign-ins are recorded in
``login_attempts`` and throttled per account, per address and per pair
(:mod:`app.services.signin_throttle`, shared with the CLI sign-in): 429 until the window
has passed. The sign-in form itself is protected by a
double-submit token: a random nonce in a short-lived cookie and its HMAC (keyed with
``settings.secret_key``) in a hidden field.

Like the services, these functions take the request's session, raise domain errors and
never commit.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import AppError, Unauthorized
from app.models import User, WebSession
from app.security import constant_time_equal, token_hash, verify_password
from app.services import signin_throttle
from app.services import ldap_auth

SESSION_COOKIE = "gpuroster_session"
LOGIN_COOKIE = "gpuroster_signin"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"


class TooManyAttempts(AppError):
    """429: too many failed sign-ins for this username from this address."""

    status, title = 429, "Too many sign-in attempts"


class SignInFailed(Unauthorized):
    """401: the username or the password is wrong (never says which)."""

    title = "Sign-in failed"


class CsrfRefused(AppError):
    """403: a form or htmx request came without the session's CSRF token."""

    status, title = 403, "Form refused"


@dataclass(frozen=True)
class SignedIn:
    """A new browser session: the row, and the cookie value (known only to the browser)."""

    web_session: WebSession
    cookie_value: str
    user: User


def sign_in(
    session: Session, *, username: str, password: str, address: str | None, settings: Settings, now: datetime
) -> SignedIn:
    """Check the password (argon2id) and open a session.

    Raises :class:`TooManyAttempts` (429) when the throttle is reached, before the password
    is even checked; :class:`SignInFailed` (401) for a wrong username or password or a
    deactivated account, after recording the attempt (the caller must keep that write).
    """
    username = username.strip()[:64]
    throttled = signin_throttle.check(session, username=username, address=address, settings=settings, now=now)
    if throttled is not None:
        raise TooManyAttempts(throttled.message(username), field="username", retry_after=throttled.retry_after)
    user = session.scalar(select(User).where(User.username == username)) if username else None
    ok = verify_password(password, user.password_hash if user is not None and user.active else None)
    if not ok and ldap_auth.enabled(settings) and (user is None or user.auth_source == "ldap"):
        # local accounts are checked first, so they keep working while the directory is down
        user = ldap_auth.sign_in_user(session, settings=settings, username=username, password=password)
        ok = user is not None
    if not ok or user is None:
        signin_throttle.record_failure(session, username=username, address=address, now=now)
        raise SignInFailed("wrong username or password", field="password")
    signin_throttle.clear(session, username=username, address=address, settings=settings, now=now)
    return open_session(session, user=user, settings=settings, now=now)


def session_for_cookie(session: Session, *, cookie_value: str | None, now: datetime) -> tuple[WebSession, User] | None:
    """The live session and its active user for a cookie value, or ``None``."""
    if not cookie_value or len(cookie_value) > 128:
        return None
    row = session.execute(
        select(WebSession, User)
        .join(User, User.id == WebSession.user_id)
        .where(WebSession.token_hash == token_hash(cookie_value), WebSession.expires_at > now, User.active.is_(True))
    ).first()
    if row is None:
        return None
    return row[0], row[1]


def sign_out(session: Session, *, cookie_value: str | None) -> None:
    """End the session of ``cookie_value`` (no-op when there is none)."""
    if cookie_value:
        session.execute(delete(WebSession).where(WebSession.token_hash == token_hash(cookie_value)))


def csrf_matches(expected: str, given: str | None) -> bool:
    """Constant-time comparison of the session's CSRF token with the one a request sent."""
    return bool(given) and constant_time_equal(expected, given or "")


def new_signin_nonce() -> str:
    """A random nonce for the sign-in form's double-submit cookie."""
    return secrets.token_urlsafe(24)


def signin_token(settings: Settings, nonce: str) -> str:
    """The hidden-field token that goes with ``nonce`` (HMAC-SHA-256 keyed with the secret key)."""
    return hmac.new(settings.secret_key.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def signin_token_ok(settings: Settings, nonce: str | None, given: str | None) -> bool:
    """True when the sign-in form's hidden token belongs to the nonce in its cookie."""
    if not nonce or not given:
        return False
    return constant_time_equal(signin_token(settings, nonce), given)


def open_session(session: Session, *, user: User, settings: Settings, now: datetime) -> SignedIn:
    """Open a browser session for ``user``, already authenticated (by password, the
    directory or single sign-on); sessions of the user that have expired are removed."""
    session.execute(delete(WebSession).where(WebSession.user_id == user.id, WebSession.expires_at <= now))
    value = secrets.token_urlsafe(32)
    ws = WebSession(token_hash=token_hash(value), user_id=user.id, csrf_token=secrets.token_urlsafe(32), created_at=now,
                    expires_at=now + timedelta(hours=settings.session_hours))
    session.add(ws)
    session.flush()
    return SignedIn(web_session=ws, cookie_value=value, user=user)
