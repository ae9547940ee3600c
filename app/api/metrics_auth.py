"""Optional bearer token for ``/metrics`` (``GPUROSTER_METRICS_TOKEN``).

Unset, ``/metrics`` stays open like ``/healthz`` (for a scrape on an internal network).
Set, a scrape must send ``Authorization: Bearer <token>`` (Prometheus:
``authorization: {credentials_file: …}``, see docs/security.md); anything else is a 401.
"""

from __future__ import annotations

from fastapi import Request

from app.errors import Unauthorized
from app.security import constant_time_equal


def require_metrics_token(request: Request) -> None:
    """FastAPI dependency: raise :class:`Unauthorized` (401) unless the configured metrics
    token was sent as a bearer token (constant-time comparison); no-op when none is set."""
    expected = request.app.state.settings.metrics_token
    if not expected:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not constant_time_equal(given.strip(), expected):
        raise Unauthorized("/metrics needs the scrape token: 'Authorization: Bearer <GPUROSTER_METRICS_TOKEN>'")
