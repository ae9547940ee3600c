"""Dependencies of the pages: the signed-in viewer, CSRF checks, form bodies.

``PageViewer`` resolves the session cookie on a read session; ``FormViewer`` does so on
the write session of a form post and refuses it (403) unless it carries the session's CSRF
token, as the hidden ``csrf_token`` field or, from htmx, the ``X-CSRF-Token`` header.
Without a session both raise :class:`~app.web.routing.SignInRequired`, whose handler
answers with the redirect to the sign-in page (never problem details).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session
from starlette.datastructures import FormData, QueryParams

from app.api.deps import SessionDep, WriteSessionDep
from app.errors import Forbidden
from app.models import User, utcnow
from app.web import sessions as web_sessions
from app.web.routing import SignInRequired

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass
class Viewer:
    """The signed-in user of a page request, the session's CSRF token and the session's row id."""

    user: User
    csrf_token: str
    session_id: int | None = None


def viewer_for(request: Request, session: Session) -> Viewer | None:
    """The viewer of ``request`` from its session cookie, or ``None`` when not signed in."""
    found = web_sessions.session_for_cookie(
        session, cookie_value=request.cookies.get(web_sessions.SESSION_COOKIE), now=utcnow()
    )
    if found is None:
        return None
    ws, user = found
    return Viewer(user=user, csrf_token=ws.csrf_token, session_id=ws.id)


async def form_body(request: Request) -> FormData:
    """The request's form fields (empty for a request without a form body)."""
    if request.method in SAFE_METHODS:
        return FormData()
    return await request.form()


FormBody = Annotated[FormData, Depends(form_body)]


def page_viewer(request: Request, session: SessionDep) -> Viewer:
    """The signed-in viewer; raises SignInRequired (redirect to sign-in) otherwise."""
    viewer = viewer_for(request, session)
    if viewer is None:
        raise SignInRequired("sign in to see this page")
    return viewer


def form_viewer(request: Request, session: WriteSessionDep, form: FormBody) -> Viewer:
    """The signed-in viewer of a form post, after checking its CSRF token (403 otherwise)."""
    viewer = viewer_for(request, session)
    if viewer is None:
        raise SignInRequired("your session has ended; sign in again")
    given = request.headers.get(web_sessions.CSRF_HEADER) or form.get(web_sessions.CSRF_FIELD)
    if not web_sessions.csrf_matches(viewer.csrf_token, given if isinstance(given, str) else None):
        raise web_sessions.CsrfRefused(
            "the form's security token is missing or out of date; reload the page and submit it again",
            field=web_sessions.CSRF_FIELD,
        )
    return viewer


PageViewer = Annotated[Viewer, Depends(page_viewer)]
FormViewer = Annotated[Viewer, Depends(form_viewer)]


def admin_page_viewer(viewer: PageViewer) -> Viewer:
    """The viewer if an admin; raises Forbidden (403 page) otherwise."""
    if not viewer.user.is_admin:
        raise Forbidden("this page is for admins only")
    return viewer


def admin_form_viewer(viewer: FormViewer) -> Viewer:
    """The viewer of an admin form post (CSRF checked) if an admin; 403 otherwise."""
    if not viewer.user.is_admin:
        raise Forbidden("only admins may do this")
    return viewer


AdminPageViewer = Annotated[Viewer, Depends(admin_page_viewer)]
AdminFormViewer = Annotated[Viewer, Depends(admin_form_viewer)]


def cookie_user_resolver(request: Request, session: Session) -> User | None:
    """``app.state.cookie_user_resolver``: lets the JSON API accept the browser session.

    Unsafe methods must also send the session's CSRF token in ``X-CSRF-Token``; a cookie
    alone never changes anything (raises Forbidden).
    """
    viewer = viewer_for(request, session)
    if viewer is None:
        return None
    if request.method not in SAFE_METHODS and not web_sessions.csrf_matches(
        viewer.csrf_token, request.headers.get(web_sessions.CSRF_HEADER)
    ):
        raise Forbidden(f"with a session cookie, send the session's CSRF token in {web_sessions.CSRF_HEADER}")
    return viewer.user


def form_str(form: FormData, name: str, default: str = "") -> str:
    """A form field as stripped text (``default`` when missing; uploads are ignored)."""
    value = form.get(name)
    return value.strip() if isinstance(value, str) else default


def form_list(form: FormData | QueryParams, name: str) -> list[str]:
    """All non-empty values of a repeated form field or query parameter (checkboxes)."""
    return [v.strip() for v in form.getlist(name) if isinstance(v, str) and v.strip()]
