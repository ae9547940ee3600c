"""The usage report page, ``GET /reports/usage``: the report of ``GET /api/v1/reports/usage``
rendered with links to the previous and next month (query parameters as the API's), and the
viewer's own limits and quota boosts (:mod:`app.web.boost_forms`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import Query, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from app.api.boosts import parse_end
from app.api.deps import SessionDep, SettingsDep, WriteSessionDep
from app.api.reports import FromQ, GroupQ, ThresholdQ, ToQ, UserQ
from app.errors import AppError, InvalidInput
from app.i18n import lazy_gettext as _l
from app.models import utcnow
from app.services import boosts as boost_service
from app.services import reports as report_service
from app.config import Settings
from app.web import boost_forms
from app.web.deps import FormBody, FormViewer, PageViewer, Viewer, form_str
from app.web.idempotency import FormIdempotencyDep
from app.web.render import page, page_locale
from app.web.routing import page_router

router = page_router()


@router.get("/reports/usage")
def usage_page(request: Request, viewer: PageViewer, session: SessionDep, settings: SettingsDep,
               user: UserQ = None, group: GroupQ = None, from_: FromQ = None, to: ToQ = None,
               threshold: ThresholdQ = report_service.DEFAULT_THRESHOLD_PCT,
               done: Annotated[str | None, Query(max_length=16)] = None) -> Response:
    """The report as a page, with links to the previous and next month, and the viewer's own
    limits, quota boosts and the form to ask for one."""
    notice = _l("Boost asked; you will be told when it is decided.") if done == "boost" else None
    return render_usage(request, viewer=viewer, session=session, settings=settings, user=user, group=group,
                        from_=from_, to=to, threshold=threshold, extra={"notice": notice})


def render_usage(request: Request, *, viewer: Viewer, session: Session, settings: Settings, user: str | None = None,
                 group: str | None = None, from_: str | None = None, to: str | None = None,
                 threshold: float = report_service.DEFAULT_THRESHOLD_PCT, extra: dict | None = None,
                 status: int = 200) -> Response:
    """The Usage page (``extra`` adds to its context: an error, the boost form's values)."""
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
        **boost_forms.usage_context(session, viewer=viewer, settings=settings, locale=page_locale(request, {"viewer": viewer})),
        **(extra or {}),
    }, status=status)


@router.post("/boosts")
def ask(request: Request, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep, form: FormBody,
        idem: FormIdempotencyDep) -> Response:
    """Ask for a boost from the Usage page; 303 back to it, or the page again naming the field."""
    values = {f: form_str(form, f)[:1024] for f in boost_forms.FIELDS}
    now = utcnow()
    try:
        if not values["end"]:
            raise InvalidInput("end: give the last day of the boost", field="end")
        end = parse_end(values["end"], tz=settings.timezone, lab_tz=settings.tz, now=now)
        value = boost_forms.form_value(values["limit"], values["value"])
        boost_service.ask(session, user=viewer.user, limit_name=values["limit"], value=value, reason=values["reason"],
                          ends_at=end, now=now)
    except AppError as e:
        session.rollback()
        return render_usage(request, viewer=viewer, session=session, settings=settings, status=e.status,
                            extra={"error": e.detail, "error_title": e.title, "boost_form": values,
                                   "boost_error_field": e.field})
    idem.done(303, None, "/reports/usage?done=boost")
    return RedirectResponse("/reports/usage?done=boost", status_code=303)
