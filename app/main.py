"""Builds the FastAPI application: settings, lifespan (engine, sessions), routers, errors."""

from __future__ import annotations

import asyncio
import logging
import weakref
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from app import __version__, web
from app.api import (agent, approvals, boosts, checkin, feeds, findings, hosts, json_body, metrics, notify, quarantines,
                     reports, reservations, rules, users, waitlist)
from app.web import apidocs
from app.config import Settings, get_settings
from app.db import build_engine, build_session_factory, write_turn
from app.errors import PayloadTooLarge
from app.periodic import mark_background
from app.problems import install_error_handlers, problem_response
from app.routes import mount

log = logging.getLogger("gpuroster")

STATIC_DIR = Path(__file__).resolve().parent / "static"


class BodySizeLimit:
    """Pure ASGI middleware: refuse request bodies over ``max_bytes`` with 413 problem details."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    too_big = int(v) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    return await self._reject(scope, receive, send)
        seen = 0
        limit = self.max_bytes

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._reject(scope, receive, send)

    async def _reject(self, scope, receive, send):
        err = PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes")
        resp = problem_response(413, err.to_problem(scope.get("path")))
        await resp(scope, receive, send)


class _TooLarge(StarletteHTTPException):
    """Raised while a body without ``Content-Length`` (chunked) is read past the limit.

    An ``HTTPException``, so that FastAPI's body parsing lets it through to the error
    handlers (any other exception there becomes a 400) and it is answered as a 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body exceeds {max_bytes} bytes")


# API tokens' last use is written this often (seconds), apart from the requests that note it.
TOKEN_USAGE_FLUSH_SECONDS = 30.0


async def _flush_token_usage(app: FastAPI) -> None:
    """Write the noted API-token uses in their own short transaction, taking this process's
    SQLite write turn like a write request (so it never contends with one in the process)."""
    async with write_turn(app, wait=None):
        await asyncio.to_thread(app.state.token_usage.flush, app.state.session_factory)


async def _flush_token_usage_every(app: FastAPI, seconds: float) -> None:
    """Flush every ``seconds``; the first flush waits for the settings'
    ``background_start_delay_seconds`` too, as the other periodic jobs do."""
    mark_background("flushing token use")
    await asyncio.sleep(max(seconds, app.state.settings.background_start_delay_seconds))
    while True:
        await _flush_token_usage(app)
        await asyncio.sleep(seconds)


def install_caches(state: Any) -> None:
    """Empty per-process caches of the lab's current state on an application's ``state``
    (Now, the device list, ``/metrics`` and the holders they share), each keyed on what every
    request reads of the database, so replicas agree; the holders are computed once for all
    three readers. Benchmarks call it again to time a cold view."""
    from app.services.device_list_cache import DeviceListCache
    from app.services.lab_holds import HoldsCache
    from app.services.metrics_cache import MetricsCache
    from app.services.now_state import NowCache

    state.holds_cache = HoldsCache()
    state.now_cache = NowCache()
    state.device_list_cache = DeviceListCache(state.holds_cache)
    state.metrics_cache = MetricsCache(state.holds_cache)


def create_app(settings: Settings | None = None, *, engine: Engine | None = None,
               session_factory: sessionmaker[Session] | None = None) -> FastAPI:
    """The application. ``settings`` default to the environment (``GPUROSTER_*``).

    ``engine``: one the caller built with :func:`app.db.build_engine` for these settings and
    keeps; the application uses it while it runs and leaves it open at shutdown. By default
    each start builds its own engine and disposes of it at shutdown. An engine compiles each
    statement shape once (its compiled cache), so applications started one after another on
    one engine (as the test suite does) skip compiling again what the last one compiled.

    ``session_factory``: where the application's sessions come from, instead of one built on
    the engine (:func:`app.db.build_session_factory`). The test suite passes sessions that join
    one outer transaction, which it rolls back after each test.
    """
    settings = settings or get_settings()
    borrowed = engine

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = borrowed or build_engine(settings)
        app.state.engine = engine
        app.state.session_factory = session_factory or build_session_factory(engine)
        app.state.write_gates = weakref.WeakKeyDictionary() if engine.dialect.name == "sqlite" else None
        app.state.snapshot_batchers = weakref.WeakKeyDictionary()  # per event loop: app.api.snapshot_batch
        from app.services.token_usage import TokenUsage

        app.state.token_usage = TokenUsage()
        flusher = asyncio.create_task(_flush_token_usage_every(app, TOKEN_USAGE_FLUSH_SECONDS))
        try:
            yield
        finally:
            flusher.cancel()
            await _flush_token_usage(app)
            if borrowed is None:
                engine.dispose()

    app = FastAPI(
        title="gpuroster",
        version=__version__,
        description="GPU reservations for shared lab servers. Authenticate with `Authorization: Bearer <token>`.",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc from vendored assets: app.web.apidocs
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.settings = settings
    install_caches(app.state)
    install_error_handlers(app)
    from app.api import idempotency

    idempotency.install(app)

    # Every router by name: the whole surface in one place, and a renamed module fails here.
    mount(app, reservations.router, hosts.router, users.router, agent.router, findings.router,
          rules.router, feeds.router, notify.router, approvals.router, boosts.router,
          quarantines.router, waitlist.router, checkin.router)
    json_body.install_schema(app)  # request schemas of the routes that read their own bodies (snapshot, booking)
    reports.install(app)  # /api/v1/reports/usage and the history pruner in the lifespan
    approvals.install_expiry(app)  # pending reservations that reach their start unapproved expire
    from app.services import waitlist_serving

    waitlist_serving.install(app)  # freed devices serve the waitlist, first come first served
    checkin.install_sweep(app)  # no-shows warned then released, idle holders asked
    metrics.install(app)  # /metrics and the conflict counter (before the page handlers wrap it)
    web.install(app)  # the pages, the cookie resolver for the API, the page error handlers
    from app.middleware.outage import install_outage_handler

    install_outage_handler(app)  # database away: 503 problem details / HTML 503, logged once per outage
    apidocs.install(app)  # /docs and /redoc, offline

    @app.get("/healthz", tags=["ops"], include_in_schema=False)
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], include_in_schema=False)
    def readyz():
        """The database answers and its schema is at the migrations' head."""
        from app.migrate import current_revision, head_revision

        try:
            with app.state.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
                current = current_revision(conn)
        except Exception as e:  # the database is down: not ready, never a 500
            return problem_response(503, {"title": "Not ready", "status": 503, "detail": f"database unreachable: {e.__class__.__name__}"})
        head = head_revision()
        if current != head:
            return problem_response(503, {"title": "Not ready", "status": 503, "detail": f"schema at {current}, head is {head}: run 'gpuroster migrate'"})
        return {"status": "ready", "schema": current}

    if STATIC_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

        @app.get("/favicon.ico", include_in_schema=False)
        def favicon() -> RedirectResponse:
            """Browsers ask for /favicon.ico whatever a page links (JSON and API documents too)."""
            return RedirectResponse("/static/favicon.svg", status_code=301)
    # The Now fragment of a large lab is ~2 MB of HTML every 5 s per open tab: compress.
    from app.middleware import compression

    app.add_middleware(GZipMiddleware, minimum_size=compression.MINIMUM_SIZE, compresslevel=compression.LEVEL)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    from app.middleware.headers import SecurityHeaders

    sso = urlsplit(settings.oidc_discovery_url) if settings.oidc_discovery_url else None
    app.add_middleware(SecurityHeaders, hsts_seconds=settings.hsts_seconds,
                       form_targets=(f"{sso.scheme}://{sso.netloc}",) if sso and sso.netloc else ())
    if settings.trusted_proxy_list:
        # client address and scheme from X-Forwarded-For/-Proto, only when a configured proxy sent them
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxy_list)
    return app
