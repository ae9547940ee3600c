"""A small synchronous HTTP client for the service's API (httpx, explicit timeouts)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from agent.httpx_lean import httpx, tls_verify  # httpx without its own CLI (click, rich, pygments)
from app.i18n import gettext as _
from app import __version__
from app.client.errors import ApiError, NotConfigured, Unreachable

__all__ = ["Api", "ApiError", "NotConfigured", "Unreachable"]

TIMEOUT = httpx.Timeout(30.0, connect=5.0)
IDEMPOTENCY_HEADER = "Idempotency-Key"
CREATE_ATTEMPTS = 3


class Api:
    """``Api(server, token)``: JSON requests under ``/api/v1``; raises ApiError / Unreachable.

    One ``Api`` serves one CLI invocation: :meth:`create` sends that invocation's
    ``Idempotency-Key`` (a random UUID, numbered per creating request), so its retries
    can never book twice.
    """

    def __init__(self, server: str, token: str | None = None, *, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"User-Agent": f"gpuroster-cli/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server + "/api/v1", headers=headers, timeout=TIMEOUT, transport=transport,
                                  verify=tls_verify(self.server))
        self.invocation_key = str(uuid.uuid4())
        self._creates = 0
        self.retry_pause = 1.0  # seconds before the second try, doubled after

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TimeoutException as e:
            raise Unreachable(_("%(server)s did not answer in time (%(error)s)", server=self.server, error=e.__class__.__name__)) from None
        except httpx.TransportError as e:
            raise Unreachable(_("cannot reach %(server)s: %(error)s", server=self.server, error=e)) from None
        if r.status_code >= 400:
            try:
                doc = r.json()
                if not isinstance(doc, dict):
                    doc = {"detail": str(doc)}
            except ValueError:
                doc = {"detail": r.text[:500] or r.reason_phrase}
            if r.status_code == 429 and "retry_after" not in doc and r.headers.get("retry-after"):
                doc["retry_after"] = r.headers["retry-after"]
            raise ApiError(r.status_code, doc)
        if r.status_code == 204 or not r.content:
            return None
        return r.json()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body)

    def create(self, path: str, body: Any) -> Any:
        """POST that creates something, with this invocation's ``Idempotency-Key``.

        Tried up to 3 times with the same key when the answer was lost (no connection,
        timeout) or the service was busy (503) or still processing the first try (409 on
        the key): the service books once and answers every try with the first answer.
        """
        self._creates += 1
        headers = {IDEMPOTENCY_HEADER: f"{self.invocation_key}-{self._creates}"}
        pause = self.retry_pause
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                return self.request("POST", path, json=body, headers=headers)
            except Unreachable:
                if attempt == CREATE_ATTEMPTS:
                    raise
            except ApiError as e:
                retry = e.status == 503 or (e.status == 409 and e.doc.get("field") == IDEMPOTENCY_HEADER)
                if not retry or attempt == CREATE_ATTEMPTS:
                    raise
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable")

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)
