"""API tokens' last use, noted by requests and written apart from them, in batches.

A request that authenticates with an API token must not write: on SQLite a read
transaction that turns into a write waits for the single write lock, which agents posting
snapshots hold most of the time, and fails with "database is busy" when the wait runs out.
So a request only notes the use here, in process memory; :meth:`TokenUsage.flush` writes
the noted times in one short write transaction of its own, at most once per token per
``interval`` (the application's lifespan calls it periodically and at shutdown).
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from sqlalchemy import bindparam, or_, update
from sqlalchemy.orm import Session, sessionmaker

from app.models import ApiToken

log = logging.getLogger("gpuroster.tokens")

# How stale a token's stored ``last_used_at`` may get before a use is noted again.
DEFAULT_INTERVAL = timedelta(minutes=5)


class TokenUsage:
    """Pending ``last_used_at`` updates of API tokens, shared by the threads of one process.

    ``interval``: a use is noted only when the stored ``last_used_at`` is older than this
    (or unset), so a busy token costs one write per interval, not one per request.
    """

    def __init__(self, interval: timedelta = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        self._pending: dict[int, datetime] = {}
        self._lock = threading.Lock()

    def note(self, token_id: int, stored: datetime | None, now: datetime) -> bool:
        """Note that token ``token_id`` (stored ``last_used_at``: ``stored``, UTC) was used at
        ``now`` (UTC). Returns True when a write is now pending for it. Never touches the
        database."""
        if stored is not None and now - stored <= self.interval:
            return False
        with self._lock:
            prev = self._pending.get(token_id)
            if prev is None or prev < now:
                self._pending[token_id] = now
        return True

    def pending(self) -> dict[int, datetime]:
        """A copy of the pending updates: token id -> last use (UTC)."""
        with self._lock:
            return dict(self._pending)

    def flush(self, factory: sessionmaker[Session]) -> int:
        """Write the pending uses in one write transaction (one batched UPDATE, never moving
        a ``last_used_at`` backwards); returns how many tokens were written.

        On a database error the uses stay pending for the next flush and the error is
        logged, not raised: losing a last-use time for a while must not break anything.
        """
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        from app.db import run_in_transaction

        used = bindparam("used", type_=ApiToken.__table__.c.last_used_at.type)
        stmt = (
            update(ApiToken)
            .where(ApiToken.id == bindparam("tid"))
            .where(or_(ApiToken.last_used_at.is_(None), ApiToken.last_used_at < used))
            .values(last_used_at=used)
        )
        params = [{"tid": tid, "used": at} for tid, at in sorted(batch.items())]

        def work(session: Session) -> None:
            session.connection().execute(stmt, params)

        try:
            run_in_transaction(factory, work)
        except Exception as e:  # noqa: BLE001 - keep them pending; a request never depends on it
            log.warning("could not record API tokens' last use (%s: %s); will retry", e.__class__.__name__, e)
            with self._lock:
                for tid, used in batch.items():
                    if tid not in self._pending or self._pending[tid] < used:
                        self._pending[tid] = used
            return 0
        return len(batch)
