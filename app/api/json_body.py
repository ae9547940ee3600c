"""A hot route's request body: raw JSON bytes validated straight into a pydantic model, for
the routes that authenticate and write in one worker-thread call (the agent's snapshots,
bookings) and so cannot take the body as a FastAPI parameter, which FastAPI validates before
any of the route's own code runs.

FastAPI's path for a model body is bytes -> ``json.loads`` -> dict -> pydantic in Python
mode; pydantic-core parsing the bytes itself (``model_validate_json``) does the same work in
one pass, at about half the CPU. Only a body that fails that is taken through FastAPI's own
steps again, so that the answers to bad input are FastAPI's: the same 422 errors with the
same ``loc`` (``("body", ...)``), and raised at the same point as a FastAPI route's (a body
that is not JSON at once, before authentication; an invalid one after the route's
dependencies, authentication included: :func:`parse` returns its errors for the route to
raise then).

Such a route's request schema is not derived from a parameter, so :func:`request_body`
declares it (``openapi_extra``) and :func:`install_schema` puts its models into the OpenAPI
document (schemathesis and the client docs read it there).
"""

from __future__ import annotations

import email.message
import json
import inspect
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

# The models declared by request_body(), whose schemas install_schema() adds.
_DECLARED: dict[str, type[BaseModel]] = {}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a route whose body is ``model`` as JSON (for the route's
    ``openapi_extra``); :func:`install_schema` adds ``model``'s schema to the document."""
    _DECLARED[model.__name__] = model
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
            "required": True}


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


def parse(model: type[M], body: bytes, content_type: str | None) -> tuple[M | None, list[dict[str, Any]]]:
    """``(instance of model, [])`` for a valid body, ``(None, errors)`` for an invalid one
    (FastAPI's 422 errors, to raise once the client is authenticated, as FastAPI would:
    :func:`require`).

    Raises :class:`RequestValidationError` at once for a JSON body that does not decode
    (FastAPI's ``json_invalid`` error at the character offset), as FastAPI does before any
    dependency runs.
    """
    json_type = _is_json(content_type)
    if body and json_type:
        try:
            return model.model_validate_json(body), []
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
        return model.model_validate(value, from_attributes=True), []  # as FastAPI validates a body field
    except ValidationError as e:
        return None, _body_errors(e)


def require(parsed: M | None, errors: list[dict[str, Any]]) -> M:
    """The model :func:`parse` gave, or, when it gave none, its ``errors`` raised as FastAPI's
    422 (``RequestValidationError``). Called where FastAPI would raise them: after the
    route's authentication."""
    if parsed is None:
        raise RequestValidationError(errors)
    return parsed


def install_schema(app: FastAPI) -> None:
    """Add the models declared by :func:`request_body`, and the models they use, to ``app``'s
    OpenAPI components, exactly as FastAPI writes them for a body parameter: they are taken
    from the document of a throwaway application with one route per model, declaring it as
    its body (FastAPI's schema generation differs from pydantic's plain ``model_json_schema``
    in details such as ``default: null`` and number formatting)."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = original()
        probe = FastAPI()
        for name, model in sorted(_DECLARED.items()):
            probe.post(f"/{name}")(_declaring(model))

        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in probe.openapi()["components"]["schemas"].items():
            schemas.setdefault(name, schema)
        doc["components"]["schemas"] = dict(sorted(schemas.items()))
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _declaring(model: type[BaseModel]) -> Any:
    """A route function whose one parameter, ``body``, is ``model``: only its signature is
    read, for the schema."""
    def declares(**_: Any) -> None:  # pragma: no cover - never called
        """Declares a body model."""

    body = inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY, annotation=model)
    declares.__signature__ = inspect.Signature([body], return_annotation=None)  # type: ignore[attr-defined]
    return declares
