"""The web UI: server-rendered pages (``app/templates/``) with htmx fragments.

:func:`install` is called by :func:`app.main.create_app`: it adds the page routers, lets
the JSON API accept the browser session (``app.state.cookie_user_resolver``), and wraps
the error handlers so that a page gets an HTML error page while the API keeps its
problem+json documents. A request is a page request when it was routed to a
:class:`~app.web.routing.PageRoute` (every page router is built by
:func:`~app.web.routing.page_router`); a signed-out browser gets the sign-in redirect from
the handler of :class:`~app.web.routing.SignInRequired`, which only the pages' viewer
dependencies raise.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.i18n import lazy_gettext as _l
from app.errors import AppError, localize_instants
from app.problems import validation_problem
from app.routes import mount
from app.web.deps import Viewer, cookie_user_resolver, viewer_for
from app.web.render import is_htmx, page
from app.web.routing import SignInRequired, routed_to_page

def sign_in_redirect(request: Request) -> Response:
    """Send a visitor without a session to the sign-in page, then back to where they were."""
    if is_htmx(request):
        current = urlsplit(request.headers.get("hx-current-url", "/"))
        target = current.path + (f"?{current.query}" if current.query else "")
    elif request.method == "GET":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    else:
        target = "/"
    url = "/login?next=" + quote(target, safe="/")
    if is_htmx(request):
        return Response(status_code=401, headers={"HX-Redirect": url, "Vary": "HX-Request"})
    return RedirectResponse(url, status_code=303, headers={"Vary": "HX-Request"})


def _viewer_for_error(request: Request) -> Viewer | None:
    factory = getattr(request.app.state, "session_factory", None)
    if factory is None:
        return None
    with factory() as session:
        try:
            return viewer_for(request, session)
        except Exception:  # noqa: BLE001 - the error page must render even if the database is down
            return None


async def error_page(
    request: Request, *, status: int, title: str, detail: str, errors: list[dict] | None = None, lookup_viewer: bool = True
) -> Response:
    """The HTML error page (htmx: the error block, retargeted into the page's message area).

    ``lookup_viewer=False`` renders it without looking up the signed-in user (the database is away).
    """
    viewer = await run_in_threadpool(_viewer_for_error, request) if lookup_viewer else None
    headers = {"HX-Retarget": "#flash", "HX-Reswap": "innerHTML"} if is_htmx(request) else None
    ctx = {"viewer": viewer, "status": status, "title": title, "detail": detail, "errors": errors or []}
    return page(request, "error.html", ctx, block="error", status=status, headers=headers)


def install_page_error_handlers(app: FastAPI) -> None:
    """Pages get HTML error pages, the API keeps problem+json; :class:`SignInRequired` gets the sign-in redirect."""
    api_app_error = app.exception_handlers[AppError]
    api_validation = app.exception_handlers[RequestValidationError]
    api_http = app.exception_handlers[StarletteHTTPException]
    api_integrity = app.exception_handlers[IntegrityError]

    async def sign_in_required(request: Request, exc: Exception):
        return sign_in_redirect(request)

    async def app_error(request: Request, exc: Exception):
        if not routed_to_page(request) or not isinstance(exc, AppError):
            return await api_app_error(request, exc)
        tz = request.app.state.settings.tz
        return await error_page(request, status=exc.status, title=exc.title, detail=localize_instants(exc.detail, tz))

    async def validation(request: Request, exc: Exception):
        if not routed_to_page(request) or not isinstance(exc, RequestValidationError):
            return await api_validation(request, exc)
        doc = validation_problem(list(exc.errors()))
        return await error_page(request, status=422, title="Invalid input", detail=doc["detail"], errors=doc["errors"])

    async def http_error(request: Request, exc: Exception):
        if not routed_to_page(request) or not isinstance(exc, StarletteHTTPException):
            return await api_http(request, exc)
        title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "Error")
        detail = _l("there is no page at %(path)s", path=request.url.path) if exc.status_code == 404 else str(exc.detail)
        return await error_page(request, status=exc.status_code, title=title, detail=detail)

    async def integrity(request: Request, exc: Exception):
        if not routed_to_page(request):
            return await api_integrity(request, exc)
        return await error_page(
            request, status=409, title="Conflict",
            detail="the change conflicts with existing data (a duplicate or a referenced row); nothing was saved",
        )

    app.add_exception_handler(SignInRequired, sign_in_required)
    app.add_exception_handler(AppError, app_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(IntegrityError, integrity)


def install(app: FastAPI) -> None:
    """Add the page routers, the cookie resolver for the API and the page error handlers."""
    from app.web import (admin, answer, approvals, auth, book, findings, mine, notify, now, oidc, profile, reports,
                         timeline, waitlist)

    mount(app, auth.router, oidc.router, now.router, timeline.router, book.router, mine.router, findings.router,
          admin.router, profile.router, notify.router, reports.router, approvals.router, waitlist.router,
          answer.router)
    app.state.cookie_user_resolver = cookie_user_resolver
    install_page_error_handlers(app)
