"""Exactly-once creating requests: ``Idempotency-Key``.

A client that may retry a POST sends a key of its choosing (the CLI one per invocation,
a booking form one per page render). The first request with that key runs and its answer
(status, body, ``Location``) is stored with the key *in the same transaction* as what it
created, so either both are committed or neither is. Within :data:`KEY_TTL` after that:

* the same key with the same request (method, path, body) gets the stored answer and
  creates nothing;
* the same key with a different request is refused (422, field ``Idempotency-Key``);
* the same key while the first request is still running is refused (409) on PostgreSQL,
  where requests run side by side: the first holds a transaction-scoped advisory lock on
  (user, key) until it commits. On SQLite, writers are serialised (``BEGIN IMMEDIATE``),
  so a second request waits for the first and then gets its stored answer.

Only successful answers are stored: a refused request (4xx) leaves no key behind and may
be retried with the same key, e.g. once a conflicting reservation is gone.

Keys belong to a user: two users may use the same key. Expired keys are pruned when a new
key is stored (an index on ``expires_at`` keeps that cheap).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from app.db import is_sqlite
from app.errors import Conflict, InvalidInput
from app.models import IdempotencyKey, User

HEADER = "Idempotency-Key"
FORM_FIELD = "idempotency_key"
KEY_TTL = timedelta(hours=24)
MAX_KEY = 255
# First key of PostgreSQL's two-int advisory lock space, reserved for idempotency keys.
# (The two-int and the one-bigint key spaces do not overlap, so the quota locks never collide.)
LOCK_CLASS = 0x1DE4


@dataclass(frozen=True)
class StoredAnswer:
    """The first answer given for a key: HTTP status, JSON body (``None`` for a redirect) and ``Location``."""

    status_code: int
    body: Any
    location: str | None


class Replay(Exception):
    """Raised when a request repeats a stored one: the caller answers with ``answer`` again."""

    def __init__(self, answer: StoredAnswer) -> None:
        super().__init__("idempotent replay")
        self.answer = answer


def validate_key(key: str) -> str:
    """The key if it is 1..255 printable ASCII characters; InvalidInput naming the header otherwise."""
    if not key or len(key) > MAX_KEY or not all(32 < ord(c) < 127 for c in key):
        raise InvalidInput(f"{HEADER}: 1 to {MAX_KEY} printable ASCII characters without spaces", field=HEADER)
    return key


def request_hash(method: str, path: str, body: Any) -> str:
    """SHA-256 (hex) of the method, the path and the body as canonical JSON (sorted keys)."""
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(f"{method.upper()} {path}\n{canon}".encode()).hexdigest()


def _lock_id(user_id: int, key: str) -> int:
    digest = hashlib.sha256(f"{user_id}\0{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def begin(session: Session, *, user: User, key: str, digest: str, now: datetime) -> None:
    """Check ``key`` before the request does its work, in the request's write transaction.

    Raises :class:`Replay` with the stored answer when the same request was answered,
    InvalidInput (422) when the key came with a different request, Conflict (409) when a
    request with this key is still running (PostgreSQL). Returns when the request may run.
    """
    if not is_sqlite(session):
        got = session.scalar(text("SELECT pg_try_advisory_xact_lock(:c, :o)"), {"c": LOCK_CLASS, "o": _lock_id(user.id, key)})
        if not got:
            raise Conflict(f"{HEADER}: a request with this key is still being processed; retry in a moment", field=HEADER)
    row = session.scalar(select(IdempotencyKey).where(IdempotencyKey.user_id == user.id, IdempotencyKey.key == key))
    if row is None:
        return
    if row.expires_at <= now:
        session.delete(row)
        session.flush()
        return
    if row.request_hash != digest:
        raise InvalidInput(
            f"{HEADER}: {key!r} was already used for a different request ({row.method} {row.path}, "
            f"first answered {row.status_code}); use a new key for a new request",
            field=HEADER,
        )
    raise Replay(StoredAnswer(row.status_code, row.response_body, row.location))


def record(
    session: Session, *, user: User, key: str, digest: str, method: str, path: str, answer: StoredAnswer,
    now: datetime,
) -> None:
    """Store the first answer for ``key`` in the request's transaction, pruning expired keys."""
    session.execute(delete(IdempotencyKey).where(IdempotencyKey.expires_at <= now))
    session.add(IdempotencyKey(
        user_id=user.id, key=key, method=method.upper(), path=path[:512], request_hash=digest,
        status_code=answer.status_code, response_body=answer.body, location=answer.location,
        created_at=now, expires_at=now + KEY_TTL,
    ))
    session.flush()


__all__ = ["HEADER", "FORM_FIELD", "KEY_TTL", "Replay", "StoredAnswer", "begin", "record", "request_hash", "validate_key"]
