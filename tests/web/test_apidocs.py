"""``/docs``, ``/redoc`` and the favicon work without internet: every asset they load is
served by the app itself, and no page starts a script inline."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_api_docs_load_only_vendored_assets_and_no_inline_script(client, path):
    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert assets and all(a.startswith("/static/") for a in assets), assets  # nothing from a CDN
    for a in assets:
        got = client.get(a)
        assert got.status_code == 200 and len(got.content) > 0, a
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", r.text), "inline script"
    assert "/openapi.json" in r.text
    assert client.get("/openapi.json").status_code == 200


def test_vendored_assets_ship_with_their_licences(client):
    for path in ("/static/vendor/swagger-ui/LICENSE", "/static/vendor/redoc/LICENSE"):
        r = client.get(path)
        assert r.status_code == 200 and ("License" in r.text or "LICENSE" in r.text), path


def test_favicon_is_linked_from_pages_and_answers_at_favicon_ico(client):
    assert '<link rel="icon" href="/static/favicon.svg"' in client.get("/login").text
    r = client.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    assert r.text.startswith("<svg")
