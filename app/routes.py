"""How routers join an application: their route objects, built once per process.

FastAPI wraps an included router (``app.include_router``) and builds each of its routes'
request handling (dependency analysis, parameter and response models) anew for every
application, on that application's first requests: about a quarter of a second of CPU for
this service's routes, paid by every serve process on its first request and by every test
that builds an application. A route object of a module-level router is built once, when its
module is imported, and holds nothing of any one application (each request carries its
own), so :func:`mount` adds those same objects to each application instead. For that the
routers carry their whole path: API routers come from :func:`api_router`, under
:data:`API_PREFIX`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI

#: Where the REST API lives; every API router's paths start with it.
API_PREFIX = "/api/v1"


def api_router(path: str = "", **kwargs: Any) -> APIRouter:
    """An API router whose routes live under ``/api/v1`` + ``path`` (``path`` is ``""`` or
    starts with ``/``); ``kwargs`` go to :class:`fastapi.APIRouter` (``tags``, …)."""
    return APIRouter(prefix=API_PREFIX + path, **kwargs)


def mount(app: FastAPI, *routers: APIRouter) -> None:
    """Add every route of ``routers`` to ``app`` as it is, in order (see the module docstring)."""
    for router in routers:
        app.router.routes.extend(router.routes)
