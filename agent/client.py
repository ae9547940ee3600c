"""Posting snapshots to the service over one long-lived ``httpx.Client``.

``POST {server}/api/v1/agent/snapshots`` with ``Authorization: Bearer <host token>``.
Outcomes: ``ok`` (200, a :class:`~agent.schema.SnapshotAck`, also for a duplicate seq),
``retry`` (connection errors, timeouts, 5xx, 429 with its ``Retry-After``) and ``reject``
(400, 401, 403, 413, 422 and other 4xx but 404/408: that snapshot will never be
accepted; it goes to the dead-letter file). A duplicate ack with ``conflict`` set means the
seq was used before by another snapshot: logged as an error by the loop.
"""

from __future__ import annotations

import email.utils
import random
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from pydantic import ValidationError

from agent import __version__
from agent.httpx_lean import httpx, tls_verify  # httpx without its own CLI (click, rich, pygments)
from agent.schema import SnapshotAck

SNAPSHOT_PATH = "/api/v1/agent/snapshots"
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
# 404: the service (or this route) is not deployed yet; 408: the server timed out reading.
# Both are about the service, not the snapshot, so the snapshot stays spooled.
_RETRY_4XX = {404, 408}


@dataclass(slots=True)
class PostResult:
    """What one POST came to. ``retry_after`` in seconds (from the header), if given."""

    outcome: Literal["ok", "retry", "reject"]
    status: int | None = None
    ack: SnapshotAck | None = None
    retry_after: float | None = None
    detail: str | None = None


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


def backoff_delay(attempt: int, retry_after: float | None = None, *, rng: random.Random | None = None) -> float:
    """Seconds before retry number ``attempt`` (1-based): full-jitter exponential backoff
    (1 s, 2 s, 4 s ... capped at 60 s); a ``Retry-After`` is honoured, also capped at 60 s."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(0, attempt - 1))
    delay = (rng or random).uniform(ceiling / 2, ceiling)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(BACKOFF_CAP_S, delay)


class ServiceClient:
    """One ``httpx.Client`` for the agent's whole life, with explicit timeouts (seconds).

    ``transport`` lets tests plug in ``httpx.MockTransport``.
    """

    def __init__(self, server: str, token: str, *, transport: httpx.BaseTransport | None = None,
                 connect_timeout: float = 5.0, read_timeout: float = 15.0) -> None:
        self._client = httpx.Client(
            base_url=server.rstrip("/"),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "User-Agent": f"gpuroster-agent/{__version__}",
            },
            timeout=httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=connect_timeout),
            transport=transport,
            verify=tls_verify(server),
            follow_redirects=False,
        )

    def post(self, body: bytes) -> PostResult:
        """POST one serialized snapshot (``Snapshot.model_dump_json()``)."""
        try:
            response = self._client.post(SNAPSHOT_PATH, content=body)
        except httpx.RequestError as exc:  # connection refused, DNS, timeouts: the service is away
            return PostResult("retry", detail=f"{type(exc).__name__}: {exc}")
        status = response.status_code
        if status == 200:
            try:
                return PostResult("ok", status=status, ack=SnapshotAck.model_validate_json(response.content))
            except ValidationError as exc:
                # The service took it (200) but its answer is unusable: do not resend.
                return PostResult("ok", status=status, detail=f"unreadable ack: {exc.errors()[:1]}")
        detail = response.text[:500]
        if status == 429 or status >= 500 or status in _RETRY_4XX or 300 <= status < 400:
            return PostResult("retry", status=status, retry_after=parse_retry_after(response.headers.get("Retry-After")), detail=detail)
        return PostResult("reject", status=status, detail=detail)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
