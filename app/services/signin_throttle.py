"""Sign-in throttling shared by the web form and the CLI/API password sign-in.

Failed sign-ins are rows of ``login_attempts`` (username, client address, time), so every
app process sees the same counts. Inside ``settings.login_window_seconds`` a sign-in is
refused (429, before the password is checked) when any of these is reached:

- ``login_max_attempts`` failures for this username from this address;
- ``login_max_attempts_per_account`` failures for this username from any address (a
  botnet rotating addresses against one account);
- ``login_max_attempts_per_address`` failures from this address for any username
  (spraying one password across many usernames).

The window slides: once the oldest counted failure leaves it, the right password works
again, so nobody is locked out for good. The address is the TCP peer, or the client that
a proxy listed in ``GPUROSTER_TRUSTED_PROXIES`` names in ``X-Forwarded-For``; a header from
anyone else is ignored, so rotating it changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.models import LoginAttempt


@dataclass(frozen=True)
class Throttled:
    """Why a sign-in is refused: ``scope`` (``account+address``, ``account`` or ``address``)
    and ``retry_after`` seconds until the oldest counted failure leaves the window."""

    scope: str
    retry_after: int

    def message(self, username: str) -> str:
        """The user-facing sentence (names the username, never whether it exists)."""
        if self.scope == "address":
            return f"too many failed sign-ins from this address; try again in {self.retry_after} s"
        return f"too many failed sign-ins for {username!r}; try again in {self.retry_after} s"


def _same_address(address: str | None):
    return LoginAttempt.address.is_(None) if address is None else LoginAttempt.address == address


def check(session: Session, *, username: str, address: str | None, settings: Settings, now: datetime) -> Throttled | None:
    """``None`` when a sign-in may be tried now, else the :class:`Throttled` limit that holds."""
    window = timedelta(seconds=settings.login_window_seconds)
    since = now - window
    limits = (
        ("account+address", and_(LoginAttempt.username == username, _same_address(address)), settings.login_max_attempts),
        ("account", LoginAttempt.username == username, settings.login_max_attempts_per_account),
        ("address", _same_address(address), settings.login_max_attempts_per_address),
    )
    for scope, where, limit in limits:
        if address is None and scope == "address":
            continue  # no address known (in-process callers): only the account limits apply
        count, oldest = session.execute(
            select(func.count(), func.min(LoginAttempt.at)).where(where, LoginAttempt.at > since)
        ).one()
        if int(count or 0) >= limit:
            oldest = oldest or now
            wait = max(1, math.ceil((oldest + window - now).total_seconds()))
            return Throttled(scope=scope, retry_after=wait)
    return None


def record_failure(session: Session, *, username: str, address: str | None, now: datetime) -> None:
    """Store one failed sign-in (the caller's transaction must be committed, not rolled back)."""
    session.add(LoginAttempt(username=username, address=address, at=now))
    session.flush()


def clear(session: Session, *, username: str, address: str | None, settings: Settings, now: datetime) -> None:
    """After a successful sign-in: forget this username's failures from this address and
    every failure older than the window. Failures from other addresses stay counted."""
    window_start = now - timedelta(seconds=settings.login_window_seconds)
    session.execute(delete(LoginAttempt).where(
        (LoginAttempt.at <= window_start) | ((LoginAttempt.username == username) & _same_address(address))
    ))
