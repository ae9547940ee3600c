"""The ``Idempotency-Key`` dependency for every POST that creates something.

A creating route takes :data:`IdempotencyDep` (API, bearer token or session cookie) or
:data:`app.web.idempotency.FormIdempotencyDep` (a page's form), does its work, and calls
``done(status, body, location)`` with its answer before returning. A repeated request
never reaches the route: :func:`install` registers the handler that answers it with the
stored status, body and ``Location`` and the header ``Idempotent-Replayed: true``. See
:mod:`app.services.idempotency` for the rules (24 h, same body, 409 while in flight).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from app.api.deps import WriteSessionDep, WriteUser
from app.models import User, utcnow
from app.services import idempotency as svc

REPLAYED_HEADER = "Idempotent-Replayed"
# Form fields that change between two submissions of the same page without changing the request.
_VOLATILE_FIELDS = frozenset({"csrf_token", svc.FORM_FIELD})


@dataclass(frozen=True)
class RequestKey:
    """The request's key and the hash of what it asks (method, path, canonical body)."""

    key: str
    digest: str


async def request_key(request: Request) -> RequestKey | None:
    """The ``Idempotency-Key`` header (or, for a form, its ``idempotency_key`` field) with the
    request's hash; ``None`` without a key. Raises InvalidInput (422) for a malformed key."""
    key = request.headers.get(svc.HEADER)
    ctype = request.headers.get("content-type", "")
    body: Any
    if ctype.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        if key is None and isinstance(form.get(svc.FORM_FIELD), str):
            key = str(form.get(svc.FORM_FIELD))
        body = sorted((k, v) for k, v in form.multi_items() if k not in _VOLATILE_FIELDS and isinstance(v, str))
    else:
        if not key:
            return None  # a request without a key reads and parses nothing here
        return json_request_key(request, await request.body())
    if key is None or key == "":
        return None
    svc.validate_key(key)
    return RequestKey(key, svc.request_hash(request.method, request.url.path, body))


def json_request_key(request: Request, raw: bytes) -> RequestKey | None:
    """:func:`request_key` of a JSON request whose body ``raw`` has been read: the
    ``Idempotency-Key`` header with the hash of the request, ``None`` without a key. Raises
    InvalidInput (422) for a malformed key."""
    key = request.headers.get(svc.HEADER)
    if not key:
        return None
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode("utf-8", "replace")
    svc.validate_key(key)
    return RequestKey(key, svc.request_hash(request.method, request.url.path, body))


RequestKeyDep = Annotated[RequestKey | None, Depends(request_key)]


@dataclass
class Idempotency:
    """What a creating route needs: ``done()`` stores its answer with the key (no-op without one)."""

    session: Session
    user: User
    found: RequestKey | None
    method: str
    path: str
    now: datetime = field(default_factory=utcnow)

    @property
    def key(self) -> str | None:
        return self.found.key if self.found else None

    def done(self, status_code: int, body: Any, location: str | None = None) -> None:
        """Store the answer in the route's transaction: ``body`` JSON-ready, a pydantic model
        (dumped in JSON mode only here, when there is a key to store it with) or ``None`` for
        a redirect."""
        if self.found is None:
            return
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        svc.record(self.session, user=self.user, key=self.found.key, digest=self.found.digest, method=self.method,
                   path=self.path, answer=svc.StoredAnswer(status_code, body, location), now=self.now)


def guard(request: Request, session: Session, user: User, found: RequestKey | None) -> Idempotency:
    """Check the key for ``user`` before the route runs (raises Replay, 409 or 422); see the service."""
    out = Idempotency(session=session, user=user, found=found, method=request.method, path=request.url.path)
    if found is not None:
        svc.begin(session, user=user, key=found.key, digest=found.digest, now=out.now)
    return out


async def api_idempotency(request: Request, user: WriteUser, session: WriteSessionDep, found: RequestKeyDep) -> Idempotency:
    """The dependency for JSON API routes. Most requests carry no key and need no database
    here, so it runs on the event loop and hands only a key's check to the thread pool."""
    if found is None:
        return guard(request, session, user, found)
    return await run_in_threadpool(guard, request, session, user, found)


IdempotencyDep = Annotated[Idempotency, Depends(api_idempotency)]


async def _replay(request: Request, exc: svc.Replay) -> Response:
    a = exc.answer
    headers = {REPLAYED_HEADER: "true"}
    if a.location:
        headers["Location"] = a.location
    if a.body is None:
        return Response(status_code=a.status_code, headers=headers)
    return JSONResponse(a.body, status_code=a.status_code, headers=headers)


def install(app: FastAPI) -> None:
    """Register the handler that answers a repeated request with its stored answer."""
    app.add_exception_handler(svc.Replay, _replay)
