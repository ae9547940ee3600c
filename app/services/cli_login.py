"""Password sign-in for the CLI: a username and password buy an API token.

Throttled like a web sign-in, across app processes: failed attempts are rows of
``login_attempts`` keyed by (username, client address); at ``settings.login_max_attempts``
failures within ``settings.login_window_seconds`` further attempts are refused (429) until
the oldest failure leaves the window. A success clears that pair's failures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import AppError, Unauthorized
from app.models import ApiToken, AuditLog, LoginAttempt, User, utcnow
from app.security import verify_password
from app.services import users as user_service


class TooManyAttempts(AppError):
    """429: too many failed sign-ins for this user from this address."""

    status, title = 429, "Too many sign-in attempts"
    type_ = "/problems/too-many-attempts"


@dataclass
class LoginOutcome:
    """Either ``token`` and ``row`` (success) or ``error`` (the failure to send back).

    A failure is returned rather than raised so that the recorded attempt is committed.
    """

    token: str | None = None
    row: ApiToken | None = None
    error: AppError | None = None
    retry_after: int | None = None


def _address_clause(address: str | None):
    return LoginAttempt.address.is_(None) if address is None else LoginAttempt.address == address


def issue_token(
    session: Session, *, username: str, password: str, address: str | None, name: str,
    expires_days: int | None, settings: Settings, now: datetime | None = None,
) -> LoginOutcome:
    """Check the password (argon2) and create an API token named ``name``.

    Returns an outcome whose ``error`` is :class:`TooManyAttempts` (with ``retry_after``
    seconds) or :class:`Unauthorized` (unknown user, wrong password, deactivated or
    token-only account: one message for all, no user enumeration).
    """
    now = now or utcnow()
    since = now - timedelta(seconds=settings.login_window_seconds)
    where = (LoginAttempt.username == username, _address_clause(address), LoginAttempt.at > since)
    failures = session.scalar(select(func.count()).select_from(LoginAttempt).where(*where)) or 0
    if failures >= settings.login_max_attempts:
        oldest = session.scalar(select(func.min(LoginAttempt.at)).where(*where)) or now
        wait = max(1, math.ceil((oldest + timedelta(seconds=settings.login_window_seconds) - now).total_seconds()))
        return LoginOutcome(
            error=TooManyAttempts(f"too many failed sign-ins for {username!r}; try again in {wait} s", retry_after=wait),
            retry_after=wait,
        )
    user = session.scalar(select(User).where(User.username == username))
    ok = verify_password(password, user.password_hash if user is not None else None)
    if not ok or user is None or not user.active:
        session.add(LoginAttempt(username=username, address=address, at=now))
        session.flush()
        return LoginOutcome(error=Unauthorized("wrong username or password"))
    session.execute(delete(LoginAttempt).where(LoginAttempt.username == username, _address_clause(address)))
    row, plain = user_service.create_api_token(session, user=user, name=name, expires_days=expires_days)
    session.add(AuditLog(actor=f"user:{username}", action="token.create_by_password", target=f"user:{username}",
                         detail={"name": name, "address": address}))
    return LoginOutcome(token=plain, row=row)
