"""The Approvals page: pending reservations and quota boosts the viewer may decide (admins:
all; group managers: their groups'), each with approve and deny and a reason told to the
requester."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from app.i18n import lazy_gettext as _l
from app.api.deps import SessionDep, SettingsDep, WriteSessionDep
from app.errors import AppError, InvalidInput
from app.models import utcnow
from app.services import approvals as svc
from app.services import boosts as boost_service
from app.services import reservations as reservation_service
from app.services.conflicts import loaded_options
from app.web import boost_forms
from app.web.deps import FormBody, FormViewer, PageViewer, Viewer, form_str
from app.web.render import page, page_locale
from app.web.routing import page_router

router = page_router()


def _page(request: Request, session: Session, viewer: Viewer, *, status: int = 200, **extra) -> Response:
    now = utcnow()
    pending = svc.list_pending(session, actor=viewer.user, now=now, load_options=loaded_options())
    ctx = {"viewer": viewer, "active": "approvals", "pending": pending, "now": now,
           "refs": lambda r: reservation_service.to_read(r, now).devices,
           **boost_forms.approvals_context(session, viewer=viewer, locale=page_locale(request, {"viewer": viewer})), **extra}
    return page(request, "approvals.html", ctx, status=status)


@router.get("/approvals")
def approvals_page(request: Request, viewer: PageViewer, session: SessionDep,
                   done: Annotated[str | None, Query(max_length=32)] = None) -> Response:
    """Pending reservations the viewer may approve or deny."""
    notice = {"approve": _l("Reservation approved; its owner was told."),
              "deny": _l("Reservation denied; its owner was told."),
              "boost-approve": _l("Boost approved; it applies now and its member was told."),
              "boost-deny": _l("Boost denied; its member was told.")}.get(done or "")
    return _page(request, session, viewer, notice=notice)


@router.post("/approvals/{reservation_id}")
def decide(request: Request, reservation_id: int, viewer: FormViewer, session: WriteSessionDep,
           settings: SettingsDep, form: FormBody) -> Response:
    """Approve or deny (form field ``decision``) with an optional ``reason``."""
    decision = form_str(form, "decision")
    reason = form_str(form, "reason")[:1024] or None
    try:
        if decision not in ("approve", "deny"):
            raise InvalidInput("decision: approve or deny", field="decision")
        svc.decide(session, actor=viewer.user, reservation_id=reservation_id, approve=decision == "approve",
                   reason=reason, settings=settings, now=utcnow(), load=reservation_service.load_locked)
    except AppError as e:
        return _page(request, session, viewer, status=e.status, error=f"#{reservation_id}: {e.detail}",
                     error_title=e.title)
    return RedirectResponse(f"/approvals?done={decision}", status_code=303)


@router.post("/approvals/boosts/{boost_id}")
def decide_boost(request: Request, boost_id: int, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep,
           form: FormBody) -> Response:
    """Approve or deny (form field ``decision``) a boost with an optional ``reason``."""
    decision = form_str(form, "decision")
    reason = form_str(form, "reason")[:1024] or None
    try:
        if decision not in ("approve", "deny"):
            raise InvalidInput("decision: approve or deny", field="decision")
        boost_service.decide(session, actor=viewer.user, boost_id=boost_id, approve=decision == "approve", reason=reason,
                   settings=settings, now=utcnow())
    except AppError as e:
        session.rollback()
        return _page(request, session, viewer, status=e.status, error=f"boost {boost_id}: {e.detail}",
                      error_title=e.title)
    return RedirectResponse(f"/approvals?done=boost-{decision}", status_code=303)


__all__ = ["router"]
