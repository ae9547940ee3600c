"""The profile's notice settings: the kinds a user wants, and their own apprise URLs."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import RowId, WriteSessionDep
from app.errors import AppError
from app.models import NOTICE_KINDS
from app.services import channels
from app.web.deps import FormBody, FormViewer, form_str
from app.web.profile import profile_context
from app.web.render import page
from app.web.routing import page_router

router = page_router()


@router.post("/profile/notices")
def save_preferences(viewer: FormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Store the checked kinds as wanted and the others as not."""
    checked = set(form.getlist("kind"))
    channels.set_preferences(session, user=viewer.user, choices={k: k in checked for k in NOTICE_KINDS})
    return RedirectResponse("/profile#notices", status_code=303)


@router.post("/profile/notify-targets")
def add_own_target(request: Request, viewer: FormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Add one of the viewer's own notification URLs (the form again with the reason on a 4xx)."""
    try:
        channels.add_target(session, actor=viewer.user, user=viewer.user, url=form_str(form, "url"),
                            label=form_str(form, "label") or None)
    except AppError as e:
        session.rollback()
        ctx = profile_context(session, viewer=viewer, error=e.detail, error_title=e.title, error_field=e.field)
        return page(request, "profile.html", ctx, status=e.status)
    return RedirectResponse("/profile#notices", status_code=303)


@router.post("/profile/notify-targets/{target_id}/remove")
def remove_own_target(target_id: RowId, viewer: FormViewer, session: WriteSessionDep) -> Response:
    """Remove one of the viewer's own notification URLs (404 for anyone else's)."""
    channels.remove_target(session, actor=viewer.user, target_id=target_id)
    return RedirectResponse("/profile#notices", status_code=303)
