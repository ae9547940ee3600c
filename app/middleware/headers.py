"""Browser security headers on every response (pure ASGI, so errors and static files get them too).

The Content-Security-Policy allows scripts and styles only from this origin: the pages
carry no inline script or event handler (``static/app.js`` wires behaviour by data
attributes), htmx runs with ``allowEval`` off and its indicator styles off (set in the
``htmx-config`` meta tag), and only ``style`` attributes, which the timeline positions its
bars with, are allowed inline. The OpenAPI explorer pages (``/docs``, ``/redoc``) load
their scripts from a CDN and run an inline boot script, so they get only the framing
part of the policy. ``form-action`` also names the OpenID provider's origin when single
sign-on is configured: signing out is a form post that the service answers with a redirect to
the provider's end-session page, and browsers apply ``form-action`` to that redirect too.
"""

from __future__ import annotations

from collections.abc import Iterable

_PAGE_CSP_PARTS = (
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "style-src-attr 'unsafe-inline'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "font-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
)
PAGE_CSP = "; ".join(_PAGE_CSP_PARTS)
DOCS_CSP = "frame-ancestors 'none'"
DOCS_PATHS = ("/docs", "/redoc")


def page_csp(form_targets: Iterable[str] = ()) -> str:
    """The pages' policy, with ``form_targets`` (origins such as ``https://sso.lab.example``)
    added to ``form-action``."""
    extra = " ".join(t for t in form_targets if t)
    if not extra:
        return PAGE_CSP
    return "; ".join(p + " " + extra if p == "form-action 'self'" else p for p in _PAGE_CSP_PARTS)


def security_headers(*, path: str, https: bool, hsts_seconds: int, form_targets: Iterable[str] = ()) -> list[tuple[bytes, bytes]]:
    """The headers for a response to ``path``: CSP, ``X-Frame-Options: DENY``, ``nosniff``,
    ``Referrer-Policy``, and ``Strict-Transport-Security`` (``hsts_seconds``) when the
    request came over HTTPS; ``form_targets`` as :func:`page_csp`."""
    csp = DOCS_CSP if path.startswith(DOCS_PATHS) else page_csp(form_targets)
    headers = [
        (b"content-security-policy", csp.encode()),
        (b"x-frame-options", b"DENY"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"strict-origin-when-cross-origin"),
        (b"cross-origin-opener-policy", b"same-origin"),
    ]
    if https and hsts_seconds > 0:
        headers.append((b"strict-transport-security", f"max-age={hsts_seconds}; includeSubDomains".encode()))
    return headers


class SecurityHeaders:
    """Pure ASGI middleware adding :func:`security_headers` to every HTTP response, without
    overriding a header a route set itself. HTTPS is the scope's scheme, which a trusted
    proxy's ``X-Forwarded-Proto`` has already set (see ``GPUROSTER_TRUSTED_PROXIES``)."""

    def __init__(self, app, *, hsts_seconds: int, form_targets: tuple[str, ...] = ()) -> None:
        self.app = app
        self.hsts_seconds = hsts_seconds
        self.form_targets = form_targets

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        extra = security_headers(path=scope.get("path", ""), https=scope.get("scheme") == "https",
                                 hsts_seconds=self.hsts_seconds, form_targets=self.form_targets)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", ())}
                message = dict(message)
                message["headers"] = list(message.get("headers", ())) + _missing(extra, present)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _missing(extra: Iterable[tuple[bytes, bytes]], present: set[bytes]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in extra if k not in present]
