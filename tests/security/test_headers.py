"""Browser security headers (D11), the Book check's CSRF token (D13) and chunked bodies."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tests.security.helpers import PASSWORD, sign_in

PAGES = ["/", "/timeline", "/timeline?view=week", "/book", "/me/reservations", "/findings", "/admin", "/profile",
         "/reports/usage", "/login"]
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I)
EVENT_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.I)


@pytest.fixture
def admin_browser(app, client, make_user):
    make_user("boss", admin=True, password=PASSWORD)
    c = TestClient(app)
    sign_in(c, "boss")
    yield c
    c.close()


def _assert_headers(r, *, https: bool = False) -> None:
    h = r.headers
    csp = h["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "'unsafe-eval'" not in csp
    assert "script-src 'self' 'unsafe-inline'" not in csp
    assert h["X-Frame-Options"] == "DENY" and h["X-Content-Type-Options"] == "nosniff"
    assert h["Referrer-Policy"] == "strict-origin-when-cross-origin"
    assert ("Strict-Transport-Security" in h) is https


def test_d11_every_page_has_the_headers_and_no_inline_script(admin_browser):
    for path in PAGES:
        r = admin_browser.get(path)
        assert r.status_code == 200, path
        _assert_headers(r)
        assert not INLINE_SCRIPT.search(r.text), f"{path} has an inline script"
        assert not EVENT_HANDLER.search(r.text), f"{path} has an inline event handler"
        assert "javascript:" not in r.text, path


def test_d11_api_errors_and_static_files_have_the_headers(client):
    for r in (client.get("/api/v1/reservations"), client.get("/static/app.js"), client.get("/healthz"),
              client.get("/no-such-page", headers={"Accept": "text/html"})):
        _assert_headers(r)


def test_d11_hsts_only_over_https(app, client):
    with TestClient(app, base_url="https://testserver") as c:
        r = c.get("/healthz")
    _assert_headers(r, https=True)
    assert r.headers["Strict-Transport-Security"].startswith("max-age=31536000")
    _assert_headers(client.get("/healthz"), https=False)


@pytest.mark.commits  # apps of its own, behind and not behind a proxy
def test_d11_hsts_from_a_trusted_proxy_only(settings):
    from app.main import create_app

    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.5"}
    with TestClient(create_app(settings.model_copy(update={"trusted_proxies": "10.0.0.1"})), client=("10.0.0.1", 1)) as c:
        assert "Strict-Transport-Security" in c.get("/healthz", headers=forwarded).headers
    with TestClient(create_app(settings), client=("10.0.0.1", 1)) as c:
        assert "Strict-Transport-Security" not in c.get("/healthz", headers=forwarded).headers


def test_d13_book_check_sends_the_csrf_token_in_the_body_never_the_url(admin_browser):
    html = admin_browser.get("/book").text
    form = re.search(r"<form[^>]*data-book[^>]*>", html, re.S).group(0)
    assert 'hx-post="/book/check"' in form and "hx-get" not in form
    assert 'formmethod="get" formaction="/book/check"' not in html
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    r = admin_browser.post("/book/check", data={"csrf_token": csrf, "mode": "devices", "host": "", "length": "1"},
                           headers={"HX-Request": "true"})
    assert r.status_code == 200
    refused = admin_browser.post("/book/check", data={"mode": "devices"}, headers={"HX-Request": "true"})
    assert refused.status_code == 403


def test_htmx_runs_without_eval():
    from pathlib import Path

    base = (Path(__file__).resolve().parents[2] / "app" / "templates" / "base.html").read_text()
    assert '"allowEval":false' in base and '"includeIndicatorStyles":false' in base
    for template in (Path(__file__).resolve().parents[2] / "app" / "templates").glob("*.html"):
        text = template.read_text()
        assert not re.search(r'hx-trigger="[^"]*\[', text), f"{template.name}: a trigger filter needs eval"
        assert "hx-on" not in text and "js:" not in text, template.name


def test_oversized_chunked_body_is_413_like_a_sized_one(client, settings):
    limit = settings.max_body_bytes
    big = b'{"note": "' + b"x" * (limit + 10) + b'"}'

    def chunks():
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]

    sized = client.post("/api/v1/reservations", content=big, headers={"Content-Type": "application/json"})
    chunked = client.post("/api/v1/reservations", content=chunks(), headers={"Content-Type": "application/json"})
    assert sized.status_code == chunked.status_code == 413
    assert chunked.headers["content-type"].startswith("application/problem+json")
    assert str(limit) in chunked.json()["detail"]
