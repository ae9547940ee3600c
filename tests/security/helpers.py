"""Small helpers shared by the security tests."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

PASSWORD = "correct horse battery"
CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    m = CSRF_RE.search(html)
    assert m, "page has no CSRF token"
    return m.group(1)


def sign_in(client: TestClient, username: str, password: str = PASSWORD) -> str:
    """Sign ``client`` in through the form; returns the session's CSRF token."""
    r = client.post("/login", data={"username": username, "password": password, "csrf_token": csrf_of(client.get("/login").text),
                                    "next": "/"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return csrf_of(client.get("/profile").text)
