"""One error family: the expected failures services raise, each with its HTTP status.

Services raise :class:`AppError` subclasses; :mod:`app.problems` renders them as RFC 9457
``application/problem+json`` for the API (pages render an error fragment instead, see
``app.web``). This module imports no web framework, so the administrator's commands and
other users of the services load neither FastAPI nor Starlette.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo


class AppError(Exception):
    """Base of every expected failure: an HTTP status, a short title and a detail message.

    ``extra`` members are added to the problem document (e.g. ``conflicts``, ``rule``).
    """

    status: int = 400
    title: str = "Bad request"
    type_: str = "about:blank"

    def __init__(self, detail: str, *, field: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.extra = extra

    def to_problem(self, instance: str | None = None) -> dict[str, Any]:
        """The RFC 9457 document: ``type``, ``title``, ``status``, ``detail``, ``instance``;
        with a field, ``field`` and ``errors`` (``[{"field", "message"}]``), the same two
        members a request that fails validation gets, so a client reads either one way."""
        doc: dict[str, Any] = {"type": self.type_, "title": self.title, "status": self.status, "detail": self.detail}
        if instance:
            doc["instance"] = instance
        if self.field:
            doc["field"] = self.field
            message = self.detail.removeprefix(f"{self.field}: ")
            doc["errors"] = [{"field": self.field, "message": message}]
        doc.update(self.extra)
        return doc


class BadRequest(AppError):
    status, title = 400, "Bad request"


class Unauthorized(AppError):
    status, title = 401, "Authentication required"


class Forbidden(AppError):
    status, title = 403, "Forbidden"


class NotFound(AppError):
    status, title = 404, "Not found"


class Conflict(AppError):
    status, title = 409, "Conflict"


class ReservationConflict(Conflict):
    """The requested devices are already reserved for part of the interval."""

    title = "Reservation conflict"
    type_ = "/problems/reservation-conflict"


class HistoryImmutable(Conflict):
    title = "Reservation is history"
    type_ = "/problems/reservation-history"


class InvalidInput(AppError):
    """422: the request is well-formed but a field's value is unacceptable (the problem type
    of a request that fails validation, :func:`app.problems.validation_problem`)."""

    status, title = 422, "Invalid input"
    type_ = "/problems/validation"


class RuleViolation(Forbidden):
    """403: a sharing rule refuses the request; ``rule``, ``limit`` and what is left are named."""

    title = "Refused by a sharing rule"
    type_ = "/problems/rule-violation"


class PayloadTooLarge(AppError):
    status, title = 413, "Request body too large"


_INSTANT = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:\d{2})")


def localize_instants(text: str, tz: ZoneInfo) -> str:
    """``text`` with every ISO-8601 instant that carries an offset (as services write them:
    ``2031-05-04T07:00:00+00:00``) given in the lab's zone instead (``2031-05-04 09:00 CEST``),
    so people read the times of a message as they read the pages. Machine-readable members of
    a problem (``conflicts``, ``earliest_free_start``) stay in UTC."""

    def local(m: re.Match[str]) -> str:
        try:
            t = datetime.fromisoformat(m.group(0).replace("Z", "+00:00"))
        except ValueError:
            return m.group(0)
        t = t.astimezone(tz)
        return t.strftime("%Y-%m-%d %H:%M" + (":%S" if t.second else "") + " %Z")

    return _INSTANT.sub(local, text)
