"""Signed one-click answer links for notices: "keep it" and "release now" of one reservation.

A link is ``{base_url}/answer/{token}``; the token names the reservation, the answer and an
expiry (the reservation's end, UNIX seconds) and carries an HMAC-SHA256 of them under the
service's ``secret_key``, so it speaks for the holder of that reservation only, for that
answer only, until the reservation ends. Opening it shows one button: answering needs a POST,
because mail scanners and link previews open links on their own and must not keep or release
anything.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime

from app.config import Settings
from app.errors import InvalidInput

ANSWERS = ("keep", "release")


def _mac(settings: Settings, payload: str) -> str:
    digest = hmac.new(settings.secret_key.encode(), f"answer:{payload}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:18]).decode().rstrip("=")


def token(settings: Settings, *, reservation_id: int, answer: str, expires: datetime) -> str:
    """The token for ``answer`` (``keep`` | ``release``) to reservation ``reservation_id``,
    valid until ``expires`` (UTC)."""
    payload = f"{reservation_id}.{answer}.{int(expires.timestamp())}"
    return f"{payload}.{_mac(settings, payload)}"


def link(settings: Settings, *, reservation_id: int, answer: str, expires: datetime) -> str:
    """The absolute URL of the answer page for :func:`token`."""
    return f"{settings.base_url.rstrip('/')}/answer/{token(settings, reservation_id=reservation_id, answer=answer, expires=expires)}"


def verify(settings: Settings, value: str, *, now: datetime) -> tuple[int, str]:
    """``(reservation id, answer)`` of a genuine, unexpired token; raises InvalidInput (422,
    field ``token``) for a forged, altered, malformed or expired one."""
    parts = value.split(".")
    if len(parts) != 4 or not parts[0].isdigit() or parts[1] not in ANSWERS or not parts[2].isdigit():
        raise InvalidInput("token: not an answer link of this service", field="token")
    payload = ".".join(parts[:3])
    if not hmac.compare_digest(parts[3], _mac(settings, payload)):
        raise InvalidInput("token: not an answer link of this service", field="token")
    if datetime.fromtimestamp(int(parts[2]), UTC) <= now:
        raise InvalidInput("token: this link expired with its reservation", field="token")
    return int(parts[0]), parts[1]


__all__ = ["ANSWERS", "link", "token", "verify"]
