"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) from vendored assets, so the API reference
works on a lab network without internet access.

The assets are copied unmodified from the npm packages ``swagger-ui-dist`` and ``redoc``
into ``app/static/vendor/`` with their licences. FastAPI's own doc pages load them from a
CDN and start Swagger UI with an inline script; here the start-up lives in the static
``swagger-init.js`` (the pages allow no inline script) and reads the schema URL from a
``data-`` attribute. Both pages are public, like ``/openapi.json``.
"""

from __future__ import annotations

from html import escape

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

VENDOR = "/static/vendor"


def _page(title: str, head: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{escape(title)}</title>\n<link rel=\"icon\" href=\"/static/favicon.svg\" type=\"image/svg+xml\">\n"
        f"{head}</head>\n<body>\n{body}</body>\n</html>\n"
    )


def install(app: FastAPI) -> None:
    """Serve ``GET /docs`` and ``GET /redoc`` for ``app.openapi_url`` (create the app with
    ``docs_url=None, redoc_url=None`` so FastAPI's CDN pages are not registered too)."""
    spec = escape(app.openapi_url or "/openapi.json")
    title = escape(app.title)

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        """Swagger UI: try the API from the browser (paste a token under Authorize)."""
        return _page(
            f"{title} · API",
            f'<link rel="stylesheet" href="{VENDOR}/swagger-ui/swagger-ui.css">\n',
            f'<div id="swagger-ui" data-spec-url="{spec}"></div>\n'
            f'<script src="{VENDOR}/swagger-ui/swagger-ui-bundle.js"></script>\n'
            f'<script src="/static/swagger-init.js"></script>\n',
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        """ReDoc: the API reference as one readable page."""
        return _page(
            f"{title} · API reference", "",
            f'<redoc spec-url="{spec}"></redoc>\n<script src="{VENDOR}/redoc/redoc.standalone.js"></script>\n',
        )
