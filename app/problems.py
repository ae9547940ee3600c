"""One handler: RFC 9457 problem details (``application/problem+json``) for the API.

:func:`install_error_handlers` renders the :class:`~app.errors.AppError` family and the
framework's own errors. Expected failures are never 500: validation errors become 422 naming
the fields, database integrity errors that escaped a service become 409, a database that is
busy a 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
from typing import Any
from zoneinfo import ZoneInfo

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.db import WriteTurnBusy
from app.errors import AppError, localize_instants

log = logging.getLogger(__name__)

PROBLEM = "application/problem+json"


def _lab_zone(request: Request) -> ZoneInfo | None:
    settings = getattr(request.app.state, "settings", None)
    return getattr(settings, "tz", None)


def problem_response(status: int, doc: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(doc, status_code=status, media_type=PROBLEM, headers=headers)


def busy_response(detail: str, instance: str | None = None) -> JSONResponse:
    """503 busy problem details with ``Retry-After: 1``: the service is up but could not get
    its turn at the database (SQLite locked, every pooled connection in use); nothing was
    written, so the client may simply send the request again."""
    doc = {"type": "/problems/busy", "title": "Service busy", "status": 503, "detail": detail}
    if instance is not None:
        doc["instance"] = instance
    return problem_response(503, doc, {"Retry-After": "1"})


def _field_of(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "cookie")]
    return ".".join(parts) or "body"


def _item(error: dict[str, Any]) -> dict[str, str]:
    """One invalid field of a validation error. A body that is not JSON at all is the field
    ``body``: the parser's location is a character offset, which names no field."""
    loc = error.get("loc", ())
    if error.get("type") == "json_invalid":
        where = loc[-1] if loc and isinstance(loc[-1], int) else None
        reason = (error.get("ctx") or {}).get("error") or "invalid JSON"
        at = f" at character {where}" if where is not None else ""
        return {"field": "body", "message": f"not valid JSON{at}: {reason}"}
    return {"field": _field_of(loc), "message": error.get("msg", "invalid")}


def validation_problem(errors: list[dict[str, Any]], instance: str | None = None) -> dict[str, Any]:
    """422 problem document listing each invalid field (``errors[].field`` and message), and
    the first one as ``field``, as an :class:`~app.errors.InvalidInput` names its one."""
    items = [_item(e) for e in errors]
    detail = "; ".join(f"{i['field']}: {i['message']}" for i in items[:5])
    doc = {"type": "/problems/validation", "title": "Invalid input", "status": 422, "detail": detail, "errors": items}
    if items:
        doc["field"] = items[0]["field"]
    if instance:
        doc["instance"] = instance
    return doc


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers for AppError, validation errors, HTTP errors and IntegrityError."""

    @app.exception_handler(AppError)
    async def _app_error(request: Request, exc: AppError):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        doc = exc.to_problem(request.url.path)
        tz = _lab_zone(request)
        if tz is not None:
            doc["detail"] = localize_instants(doc["detail"], tz)
            for item in doc.get("errors", ()):
                item["message"] = localize_instants(item["message"], tz)
        return problem_response(exc.status, doc, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return problem_response(422, validation_problem(list(exc.errors()), request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        doc = {"type": "about:blank", "title": str(exc.detail), "status": exc.status_code, "detail": str(exc.detail)}
        return problem_response(exc.status_code, doc, getattr(exc, "headers", None))

    @app.exception_handler(OverflowError)
    @app.exception_handler(DataError)
    async def _out_of_range(request: Request, exc: Exception):
        # a number or string the database cannot hold (ids beyond 2^63, values out of range)
        log.info("value out of range for the database: %s", exc)
        doc = {"type": "/problems/validation", "title": "Invalid input", "status": 422,
               "detail": "a value in the request is out of the range the database accepts"}
        return problem_response(422, doc)

    @app.exception_handler(OperationalError)
    async def _busy(request: Request, exc: OperationalError):
        from app.db import is_retryable

        if not is_retryable(exc):
            raise exc
        log.warning("database busy after retries: %s", exc.orig)
        return busy_response("the database is busy; retry shortly")

    @app.exception_handler(WriteTurnBusy)
    async def _no_write_turn(request: Request, exc: WriteTurnBusy):
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return busy_response("the database is busy with other writes; retry shortly", request.url.path)

    @app.exception_handler(IntegrityError)
    async def _integrity(request: Request, exc: IntegrityError):
        log.warning("integrity error escaped a service: %s", exc.orig)
        doc = {
            "type": "/problems/integrity",
            "title": "Conflict",
            "status": 409,
            "detail": "the change conflicts with existing data (duplicate or referenced row)",
        }
        return problem_response(409, doc)
