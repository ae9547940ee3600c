"""The usage report page, ``GET /reports/usage``: the report of ``GET /api/v1/reports/usage``
rendered with links to the previous and next month (query parameters as the API's)."""

from __future__ import annotations

from datetime import datetime, timedelta

from fastapi import Request, Response

from app.api.deps import SessionDep, SettingsDep
from app.api.reports import FromQ, GroupQ, ThresholdQ, ToQ, UserQ
from app.models import utcnow
from app.services import reports as report_service
from app.web.deps import PageViewer
from app.web.render import page
from app.web.routing import page_router

router = page_router()


@router.get("/reports/usage")
def usage_page(request: Request, viewer: PageViewer, session: SessionDep, settings: SettingsDep,
               user: UserQ = None, group: GroupQ = None, from_: FromQ = None, to: ToQ = None,
               threshold: ThresholdQ = report_service.DEFAULT_THRESHOLD_PCT) -> Response:
    """The report as a page, with links to the previous and next month."""
    report = report_service.report_for_request(
        session, tz=settings.tz, viewer_name=viewer.user.username, user=user or None, group=group or None,
        start=from_, end=to, threshold_pct=threshold, now=utcnow(),
    )
    tz = settings.tz
    this_month = report_service.month_start(report.start, tz)
    prev_month = report_service.month_start(this_month - timedelta(microseconds=1), tz)
    next_month = report_service.next_month(this_month, tz)

    def day(t: datetime) -> str:
        return t.astimezone(tz).date().isoformat()

    return page(request, "report.html", {
        "viewer": viewer, "active": "reports", "report": report,
        "prev": {"from": day(prev_month), "to": day(this_month)},
        "next": {"from": day(next_month), "to": day(report_service.next_month(next_month, tz))},
        "form": {"user": user or "", "group": group or "", "from": from_ or "", "to": to or "", "threshold": threshold},
    })
