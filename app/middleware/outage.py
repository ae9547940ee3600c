"""The database away (stopped, unreachable, renamed or dropped) is a 503, not a 500.

Connection-level errors of the driver reach the application as SQLAlchemy
``OperationalError``/``InterfaceError`` (or a pool ``TimeoutError``). The handler installed
here answers them with ``503`` and ``Retry-After``: problem details for the API, the HTML
error page for pages. Transient busy errors (SQLite locked, PostgreSQL serialization or
deadlock) keep the handler they had. The outage is logged once, when it starts; the engine's
next successful new connection logs that it is over. Nothing needs a restart: the pool
pre-pings and replaces dead connections by itself.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from fastapi import FastAPI, Request
from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.db import OUTAGE_ERRORS
from app.problems import busy_response, problem_response

log = logging.getLogger("gpuroster.db")


class OutageLog:
    """Logs a database outage once when it begins and once when it ends (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None

    def failed(self, exc: BaseException) -> None:
        """Record a failure; logs a warning only for the first failure of an outage."""
        with self._lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        log.warning("database unavailable, answering 503 until it is back: %s: %s",
                    exc.__class__.__name__, reason[0] if reason else "")

    def recovered(self) -> None:
        """Record a working connection; logs once when an outage ends."""
        if self.since is None:
            return
        with self._lock:
            if self.since is None:
                return
            seconds, self.since = time.monotonic() - self.since, None
        log.warning("database reachable again after %.0f s", seconds)


def watch_recovery(app: FastAPI, outage: OutageLog) -> None:
    """Have the next new connection of ``app``'s engine end ``outage`` (log that the database
    is back). One listener per engine tells every outage log watching it: an engine can
    outlive an application that borrowed it (``create_app(engine=...)``), and the next
    application's log must hear of it too."""
    engine = getattr(app.state, "engine", None)
    if engine is None:
        return
    logs = getattr(engine, "_gpuroster_outage_logs", None)
    if logs is None:
        logs = engine._gpuroster_outage_logs = weakref.WeakSet()

        @event.listens_for(engine, "connect")
        def _connected(_dbapi_conn, _record):
            for each in list(logs):
                each.recovered()
    logs.add(outage)


def install_outage_handler(app: FastAPI) -> None:
    """Answer database connection errors with 503 + ``Retry-After``
    (``settings.db_retry_after_seconds``); keep the previous handler for busy errors."""
    from app.db import is_retryable

    outage = OutageLog()
    app.state.db_outage = outage
    previous = app.exception_handlers.get(OperationalError)
    retry_after = str(app.state.settings.db_retry_after_seconds)

    async def handler(request: Request, exc: Exception):
        if previous is not None and isinstance(exc, OperationalError) and is_retryable(exc):
            return await previous(request, exc)
        if isinstance(exc, PoolTimeout):
            return await _pool_exhausted(request, exc)
        watch_recovery(request.app, outage)
        outage.failed(exc)
        headers = {"Retry-After": retry_after}
        detail = "the database is unavailable; the service recovers by itself when it is back, retry shortly"
        if _is_page(request):
            from app.web import error_page

            resp = await error_page(request, status=503, title="Service unavailable", detail=detail,
                                    lookup_viewer=False)
            resp.headers.update(headers)
            return resp
        doc = {"type": "/problems/database-unavailable", "title": "Service unavailable", "status": 503,
               "detail": detail, "instance": request.url.path}
        return problem_response(503, doc, headers)

    for exc_type in OUTAGE_ERRORS:
        app.add_exception_handler(exc_type, handler)


async def _pool_exhausted(request: Request, exc: Exception):
    """Every connection of this process's pool stayed in use for ``db_pool_timeout_seconds``:
    the database is up but this process is over its load, so the answer is the same 503 busy
    (``Retry-After: 1``) as a locked SQLite file, not an outage. Nothing was written: the
    request never got a connection."""
    engine = getattr(request.app.state, "engine", None)
    pool = engine.pool.status() if engine is not None else "no engine"
    log.warning("connection pool exhausted, answering 503 busy (%s): %s", pool, str(exc).splitlines()[0])
    detail = "every database connection of this server is in use; retry shortly"
    if _is_page(request):
        from app.web import error_page

        resp = await error_page(request, status=503, title="Service busy", detail=detail, lookup_viewer=False)
        resp.headers["Retry-After"] = "1"
        return resp
    return busy_response(detail, request.url.path)


def _is_page(request: Request) -> bool:
    """A page (routed to a page route, or a browser asking for HTML): answered with an HTML 503."""
    from app.web.routing import routed_to_page

    return routed_to_page(request)
