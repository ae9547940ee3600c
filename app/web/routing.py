"""What makes a route a page: its router's route class, and the page-only error.

Every page router is built by :func:`page_router`, whose routes are :class:`PageRoute`.
The error handlers installed by :func:`app.web.install` render HTML for a request routed
to a ``PageRoute`` and leave every other route to the API's problem+json handlers, so a
page is a page because of how it was registered, not because of a label on it.
:class:`SignInRequired` is raised only by the pages' viewer dependencies and has its own
handler (the redirect to the sign-in page); the API's :class:`~app.errors.Unauthorized`
never reaches it.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.requests import Request


class PageRoute(APIRoute):
    """A route that answers with HTML pages (errors included); see :func:`page_router`."""


def page_router() -> APIRouter:
    """A router for pages: its routes are :class:`PageRoute` and stay out of the OpenAPI schema."""
    return APIRouter(route_class=PageRoute, include_in_schema=False)


def routed_to_page(request: Request) -> bool:
    """True when ``request`` was routed to a :class:`PageRoute`, or asks with a browser's
    ``Accept: text/html`` for a URL outside ``/api/`` and ``/static/`` that no route serves."""
    route = request.scope.get("route")
    if route is not None:
        return isinstance(route, PageRoute)
    path = request.url.path
    return not path.startswith(("/api/", "/static/")) and "text/html" in request.headers.get("accept", "")


class SignInRequired(Exception):
    """A page was asked for without a (valid) browser session: answered with the sign-in redirect.

    Not an :class:`~app.errors.AppError`, so it can never be rendered as API problem details.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
