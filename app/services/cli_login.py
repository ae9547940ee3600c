"""Password sign-in for the CLI: a username and password buy an API token.

Throttled exactly like a web sign-in, across app processes, by
:mod:`app.services.signin_throttle` (per account, per address and per pair; 429 until the
oldest counted failure leaves the window). A success clears that pair's failures.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import AppError, Unauthorized
from app.models import ApiToken, User, utcnow
from app.security import verify_password
from app.services import signin_throttle
from app.services import users as user_service
from app.services.audit import record_audit


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
    throttled = signin_throttle.check(session, username=username, address=address, settings=settings, now=now)
    if throttled is not None:
        return LoginOutcome(
            error=TooManyAttempts(throttled.message(username), retry_after=throttled.retry_after),
            retry_after=throttled.retry_after,
        )
    user = session.scalar(select(User).where(User.username == username))
    ok = verify_password(password, user.password_hash if user is not None else None)
    if not ok or user is None or not user.active:
        signin_throttle.record_failure(session, username=username, address=address, now=now)
        return LoginOutcome(error=Unauthorized("wrong username or password"))
    signin_throttle.clear(session, username=username, address=address, settings=settings, now=now)
    row, plain = user_service.create_api_token(session, user=user, name=name, expires_days=expires_days)
    record_audit(session, actor=f"user:{username}", action="token.create_by_password", target=f"user:{username}",
                 detail={"name": name, "address": address})
    return LoginOutcome(token=plain, row=row)
