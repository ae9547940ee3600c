"""Usage reports: ``GET /api/v1/reports/usage`` (JSON; the page ``GET /reports/usage`` is
:mod:`app.web.reports`), and the pruning of usage history.

Both take ``user=`` or ``group=`` (default: the caller), ``from=`` and ``to=`` (dates in the
lab's time zone or ISO 8601 instants; default: the current month) and ``threshold=`` (mean
utilization in percent from which a minute with the holder's process counts as used;
default 5); the CSV also ``by=`` (``reservation``, ``user`` or ``host``: what a row is).
Any signed-in lab member may read any report: who booked what and how much of it was used
is as open as the Now page.

:func:`install` mounts the route and adds the history pruner to the app's lifespan: every
process wakes up hourly (the first time ``PRUNE_FIRST_DELAY_S`` after start) and calls
:func:`app.services.reports.prune_history`, which prunes at most once an hour across all
processes and replicas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import FastAPI, Query, Response

from app.routes import api_router, mount
from app.api.deps import CurrentUser, SessionDep, SettingsDep
from app.db import run_in_transaction
from app.models import utcnow
from app.periodic import run_periodically
from app.schemas.report import UsageReport
from app.services import reports as report_service

log = logging.getLogger(__name__)

PRUNE_FIRST_DELAY_S = 300.0  # seconds after start-up before the first pruning attempt
PRUNE_PERIOD_S = report_service.PRUNE_EVERY.total_seconds()

router = api_router(tags=["reports"])

UserQ = Annotated[str | None, Query(max_length=64, description="username (default: the caller)")]
GroupQ = Annotated[str | None, Query(max_length=64, description="group name")]
FromQ = Annotated[str | None, Query(alias="from", max_length=64, description="period start: YYYY-MM-DD (lab zone) or ISO 8601")]
ToQ = Annotated[str | None, Query(max_length=64, description="period end, exclusive: YYYY-MM-DD (lab zone) or ISO 8601")]
ByQ = Annotated[Literal["reservation", "user", "host"],
                Query(description="CSV rows: one per reservation, per user (and a total row), or per host")]
ThresholdQ = Annotated[float, Query(ge=0, le=100, description="utilization % from which the holder's minute counts as used")]


@router.get("/reports/usage", response_model=UsageReport, responses={401: {}, 404: {}, 422: {}})
def usage(caller: CurrentUser, session: SessionDep, settings: SettingsDep, user: UserQ = None,
          group: GroupQ = None, from_: FromQ = None, to: ToQ = None,
          threshold: ThresholdQ = report_service.DEFAULT_THRESHOLD_PCT) -> UsageReport:
    """GPU-hours reserved, used by the holder, idle and unmonitored, and findings, for a user
    or a group over a period."""
    return report_service.report_for_request(
        session, tz=settings.tz, viewer_name=caller.username, user=user or None, group=group or None,
        start=from_, end=to, threshold_pct=threshold, now=utcnow(),
    )


@router.get("/reports/usage.csv", response_class=Response, responses={200: {"content": {"text/csv": {}}}, 401: {}, 404: {},
                                                                       422: {}})
def usage_csv(caller: CurrentUser, session: SessionDep, settings: SettingsDep, user: UserQ = None,
              group: GroupQ = None, from_: FromQ = None, to: ToQ = None,
              threshold: ThresholdQ = report_service.DEFAULT_THRESHOLD_PCT, by: ByQ = "reservation") -> Response:
    """The same report as CSV for a spreadsheet, one row per reservation, user or host
    (``by``); cells that look like formulas are quoted as text."""
    from app.services.report_csv import usage_csv as to_csv

    report = report_service.report_for_request(
        session, tz=settings.tz, viewer_name=caller.username, user=user or None, group=group or None,
        start=from_, end=to, threshold_pct=threshold, now=utcnow(),
    )
    return Response(to_csv(report, by), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="usage-{report.scope}-by-{by}.csv"'})


def prune_once(app: FastAPI) -> bool:
    """One pruning attempt in its own transaction; True if this process pruned."""
    settings = app.state.settings
    return run_in_transaction(
        app.state.session_factory, lambda s: report_service.prune_history(s, settings=settings, now=utcnow())
    )


def _report_prune(app: FastAPI) -> Callable[[bool], None]:
    def report(pruned: bool) -> None:
        if pruned:
            log.info("pruned usage history older than %d days", app.state.settings.rollup_retention_days)
    return report


def install(app: FastAPI, *, first_delay: float = PRUNE_FIRST_DELAY_S, period: float = PRUNE_PERIOD_S) -> None:
    """Mount the API route under ``/api/v1``; run the pruner inside the app's lifespan (after
    the engine exists, cancelled before it is disposed)."""
    mount(app, router)
    run_periodically(app, name="gpuroster-prune-history", what="pruning usage history", work=prune_once,
                     period=period, first_delay=first_delay, report=_report_prune(app))
