"""The snapshot route's request body: raw JSON bytes validated straight into a :class:`Snapshot`.

FastAPI's path for a model body is bytes -> ``json.loads`` -> dict -> pydantic in Python
mode, on every snapshot; pydantic-core parsing the bytes itself (``model_validate_json``)
does the same work in one pass, at about half the CPU. Only a body that fails that is
taken through FastAPI's own steps again, so that the answers to bad input are FastAPI's:
the same 422 errors with the same ``loc`` (``("body", ...)``), raised at the same point
(an undecodable body before authentication, an invalid snapshot after it).

The route's request schema is no longer derived from a parameter, so :func:`install_schema`
puts it back into the OpenAPI document (schemathesis and the client docs read it there).
"""

from __future__ import annotations

import email.message
import json
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from agent.schema import Snapshot

REQUEST_BODY = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Snapshot"}}}, "required": True}


def _is_json(content_type: str | None) -> bool:
    """FastAPI's test: ``application/json`` or ``application/*+json`` (parameters allowed);
    a missing content type is not JSON (FastAPI's strict content type default)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def _body_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors with ``loc`` under ``"body"``, as FastAPI reports a body model's."""
    return [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]


def parse(body: bytes, content_type: str | None) -> tuple[Snapshot | None, list[dict[str, Any]]]:
    """``(snapshot, [])`` for a valid body, ``(None, errors)`` for an invalid one (FastAPI's
    422 errors, to raise once the host is authenticated, as FastAPI would).

    Raises :class:`RequestValidationError` at once for a JSON body that does not decode
    (FastAPI's ``json_invalid`` error at the character offset), as FastAPI does before any
    dependency runs.
    """
    json_type = _is_json(content_type)
    if body and json_type:
        try:
            return Snapshot.model_validate_json(body), []
        except ValidationError:
            pass  # FastAPI's steps below answer it, with FastAPI's errors
    if not body:
        return None, [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
    value: Any = body
    if json_type:
        try:
            value = json.loads(body)
        except json.JSONDecodeError as e:
            raise RequestValidationError(
                [{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {},
                  "ctx": {"error": e.msg}}], body=e.doc) from e
        except UnicodeDecodeError as e:
            # FastAPI answers a body that is not text with a 400 (its catch-all for bodies it cannot read)
            from fastapi import HTTPException

            raise HTTPException(status_code=400, detail="There was an error parsing the body") from e
    try:
        return Snapshot.model_validate(value, from_attributes=True), []  # as FastAPI validates a body field
    except ValidationError as e:
        return None, _body_errors(e)


def install_schema(app: FastAPI) -> None:
    """Add :class:`Snapshot` and the models it uses to ``app``'s OpenAPI components, exactly
    as FastAPI writes them for a body parameter: they are taken from the document of a
    throwaway application whose one route declares that parameter (FastAPI's schema
    generation differs from pydantic's plain ``model_json_schema`` in details such as
    ``default: null`` and number formatting)."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = original()
        probe = FastAPI()

        @probe.post("/")
        def _declares(snapshot: Snapshot) -> None:  # pragma: no cover - never called
            """Only its parameter is read, for its schema."""

        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in probe.openapi()["components"]["schemas"].items():
            schemas.setdefault(name, schema)
        doc["components"]["schemas"] = dict(sorted(schemas.items()))
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
