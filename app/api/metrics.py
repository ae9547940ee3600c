"""``GET /metrics``: Prometheus text exposition, built from the database at scrape time.

Mounted at the root (``/metrics``), unauthenticated like ``/healthz`` unless
``GPUROSTER_METRICS_TOKEN`` is set (then a bearer token, :mod:`app.api.metrics_auth`):
keep it on the internal network or behind the reverse proxy (see docs/deploy.md). Each scrape is
written by the application's :class:`~app.services.metrics_cache.MetricsCache` (what
:class:`~app.services.metrics.DatabaseCollector` writes, with per-host text reused under keys
read from the database on every scrape), so every worker and replica answers from the same
database state.

:func:`install` also records refused bookings (409 reservation conflicts) for the
``gpuroster_reservation_conflicts_total`` counter: the request's transaction is rolled back
with the refusal, so the handler writes one ``audit_log`` row in a transaction of its own
and then renders the error exactly as the handler it stands in front of would.
"""

from __future__ import annotations

import inspect
import logging

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from app.api.deps import SessionDep
from app.api.metrics_auth import require_metrics_token
from app.db import run_in_transaction
from app.errors import ReservationConflict
from app.problems import problem_response
from app.routes import mount
from app.models import utcnow
from app.services import metrics as metrics_service
from app.services.metrics_cache import MetricsCache

log = logging.getLogger(__name__)

router = APIRouter(tags=["ops"])


@router.get("/metrics", include_in_schema=False, response_class=Response, dependencies=[Depends(require_metrics_token)])
def metrics(request: Request, session: SessionDep) -> Response:
    """Per-device gauges, per-host freshness and row-count counters in Prometheus text format."""
    # per-host text reused between snapshots, keyed on what each scrape reads of the database
    cache: MetricsCache = request.app.state.metrics_cache  # built by create_app
    return Response(cache.exposition(session, now=utcnow()), media_type=CONTENT_TYPE_LATEST)


def _conflict_ids(exc: ReservationConflict) -> list[int]:
    out = []
    for c in exc.extra.get("conflicts") or []:
        if isinstance(c, dict) and isinstance(c.get("id"), int):
            out.append(c["id"])
    return out


def install(app: FastAPI) -> None:
    """Mount ``/metrics`` and count reservation conflicts (see the module docstring)."""
    mount(app, router)

    def _next_handler(exc: Exception):
        for cls in type(exc).__mro__[1:]:
            handler = app.exception_handlers.get(cls)
            if handler is not None:
                return handler
        return None

    def _record(path: str, exc: ReservationConflict) -> None:
        run_in_transaction(
            app.state.session_factory,
            lambda s: metrics_service.record_conflict(s, path=path, conflicts=_conflict_ids(exc), detail=exc.detail),
        )

    async def count_conflict(request: Request, exc: Exception):
        assert isinstance(exc, ReservationConflict)
        try:
            await run_in_threadpool(_record, request.url.path, exc)
        except Exception:  # noqa: BLE001 - counting must never turn a 409 into a 500
            log.exception("could not record a reservation conflict for the metrics")
        handler = _next_handler(exc)
        if handler is None:
            return problem_response(exc.status, exc.to_problem(request.url.path))
        if inspect.iscoroutinefunction(handler):
            return await handler(request, exc)
        return await run_in_threadpool(handler, request, exc)

    app.add_exception_handler(ReservationConflict, count_conflict)
