"""Profile (``/profile``): the account, the user's own API tokens (create, revoke) and their
calendar feed URL (rotate: a new URL, shown once).

A new token's secret is shown once, in the response to the form post itself, with
``Cache-Control: no-store``: only its SHA-256 is stored, so it cannot be shown again after
a redirect. This is the one deliberate exception to redirect-after-post (the host token
on the admin page is the other); resubmitting the form creates another token, never
shows the old one.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.i18n import lazy_gettext as _l
from app.api.deps import SessionDep, SettingsDep, WriteSessionDep
from app.errors import AppError, InvalidInput, NotFound
from app.models import ApiToken, utcnow
from app.services import calendar as calendar_service
from app.services import credentials
from app.services import channels
from app.services import users as user_service
from app.web.deps import FormBody, FormViewer, PageViewer, Viewer, form_str
from app.web.render import page
from app.web.routing import page_router

router = page_router()

NO_STORE = {"Cache-Control": "no-store"}


def profile_context(session: Session, *, viewer: Viewer, **extra: Any) -> dict[str, Any]:
    """The viewer's groups and API tokens (newest first) for the profile template."""
    tokens = list(session.scalars(select(ApiToken).where(ApiToken.user_id == viewer.user.id).order_by(ApiToken.id.desc())))
    return {
        "viewer": viewer, "active": "profile", "groups": user_service.group_names_of(session, viewer.user),
        "tokens": tokens, "now": utcnow(),
        "notice_prefs": channels.preferences(session, user=viewer.user),
        "notify_targets": [(t, channels.redact(t.url)) for t in channels.visible_targets(session, viewer=viewer.user)
                           if t.user_id == viewer.user.id],
        **extra,
    }


@router.get("/profile")
def profile_page(
    request: Request, viewer: PageViewer, session: SessionDep,
    done: Annotated[str | None, Query(max_length=16)] = None,
) -> Response:
    """The account and its API tokens."""
    notice = {"revoked": _l("Token revoked."), "password": _l("Password changed; your other sessions were signed out."),
              "language": _l("Language saved.")}.get(done or "")
    return page(request, "profile.html", profile_context(session, viewer=viewer, notice=notice))


def _expires_days(value: str) -> int | None:
    if not value:
        return None
    try:
        days = int(value)
    except ValueError:
        raise InvalidInput(f"expires_days: {value!r} is not a whole number of days", field="expires_days") from None
    if not 1 <= days <= 3650:
        raise InvalidInput("expires_days: between 1 and 3650 days, or empty for no expiry", field="expires_days")
    return days


@router.post("/profile/tokens")
def create_token(request: Request, viewer: FormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Create an API token for the viewer and show its secret once."""
    name = form_str(form, "name") or "token"
    try:
        if len(name) > 128:
            raise InvalidInput("name: at most 128 characters", field="name")
        row, plain = user_service.create_api_token(
            session, user=viewer.user, name=name, expires_days=_expires_days(form_str(form, "expires_days"))
        )
    except AppError as e:
        session.rollback()
        ctx = profile_context(session, viewer=viewer, error=e.detail, error_title=e.title, error_field=e.field)
        return page(request, "profile.html", ctx, status=e.status)
    ctx = profile_context(session, viewer=viewer, new_token=plain, new_token_name=row.name)
    return page(request, "profile.html", ctx, status=201, headers=NO_STORE)


@router.post("/profile/feed")
def rotate_feed(request: Request, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep) -> Response:
    """Make a new calendar feed URL for the viewer (the old one stops working) and show it
    once: like API tokens, only its hash is stored."""
    token = calendar_service.user_feed_token(session, user=viewer.user, rotate=True)
    ctx = profile_context(session, viewer=viewer, new_feed_url=calendar_service.feed_url(settings, "users", token or ""))
    return page(request, "profile.html", ctx, status=201, headers=NO_STORE)


@router.post("/profile/tokens/{token_id}/revoke")
def revoke_token(token_id: int, viewer: FormViewer, session: WriteSessionDep) -> Response:
    """Revoke one of the viewer's tokens (it stops working at once)."""
    row = session.get(ApiToken, token_id)
    if row is None or row.user_id != viewer.user.id:
        raise NotFound(f"token: you have no token {token_id}", field="token")
    user_service.revoke_api_token(session, user=viewer.user, token_id=token_id)
    return RedirectResponse("/profile?done=revoked", status_code=303)


@router.post("/profile/password")
def change_password(request: Request, viewer: FormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Change the viewer's password (current one required); signs out their other sessions."""
    def raw(name: str) -> str:
        value = form.get(name)
        return value if isinstance(value, str) else ""

    try:
        if raw("new_password") != raw("confirm_password"):
            raise InvalidInput("confirm_password: the two new passwords differ", field="confirm_password")
        credentials.change_own_password(
            session, user=viewer.user, current=raw("current_password"), new=raw("new_password"),
            keep_session_id=viewer.session_id,
        )
    except AppError as e:
        session.rollback()
        ctx = profile_context(session, viewer=viewer, error=e.detail, error_title=e.title, error_field=e.field)
        return page(request, "profile.html", ctx, status=e.status)
    return RedirectResponse("/profile?done=password", status_code=303)


@router.post("/profile/language")
def set_language(request: Request, viewer: FormViewer, session: WriteSessionDep, form: FormBody) -> Response:
    """Store the viewer's language (empty: follow the browser); the next page is in it."""
    try:
        user_service.set_language(session, user=viewer.user, language=form_str(form, "language"))
    except AppError as e:
        session.rollback()
        ctx = profile_context(session, viewer=viewer, error=e.detail, error_title=e.title, error_field=e.field)
        return page(request, "profile.html", ctx, status=e.status)
    return RedirectResponse("/profile?done=language#language", status_code=303)
