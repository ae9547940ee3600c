"""Fixtures for the pages: users with passwords signed in through the real sign-in form,
one browser-like TestClient each (own cookie jar), a host with four GPUs."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.conftest import FRESH_FOR, gpu, snapshot_body

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')
PASSWORD = "correct horse battery"


def csrf_of(html: str) -> str:
    """The CSRF token of the first form in a page."""
    m = CSRF_RE.search(html)
    assert m, "page has no CSRF token"
    return m.group(1)


def sign_in(client: TestClient, username: str, password: str = PASSWORD) -> str:
    """Sign in through the form; returns the session's CSRF token."""
    r = client.get("/login")
    assert r.status_code == 200, r.text
    r = client.post(
        "/login", data={"username": username, "password": password, "csrf_token": csrf_of(r.text), "next": "/"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    return csrf_of(client.get("/profile").text)


@dataclass
class Browser:
    """A signed-in user's client and CSRF token."""

    username: str
    client: TestClient
    csrf: str

    def get(self, url: str, **kw):
        return self.client.get(url, **kw)

    def post(self, url: str, data: dict | None = None, **kw):
        """A form post with the session's CSRF token; redirects are not followed."""
        body = {"csrf_token": self.csrf, **(data or {})}
        return self.client.post(url, data=body, follow_redirects=False, **kw)


@dataclass
class WebLab:
    admin: Browser
    alice: Browser
    bob: Browser
    host_token: str
    devices: list[str]


def open_session_for(app, client: TestClient, username: str) -> str:
    """Give ``client`` a web session of ``username`` opened by the service the sign-in form
    ends in (:func:`app.web.sessions.open_session`); returns its CSRF token. The form itself
    (password, throttle, directory) is what ``sign_in`` and the sign-in tests go through."""
    from app.db import run_in_transaction
    from app.models.base import utcnow
    from app.services.users import get_user
    from app.web import sessions as web_sessions

    def work(s):
        signed = web_sessions.open_session(s, user=get_user(s, username), settings=app.state.settings, now=utcnow())
        return signed.cookie_value, signed.web_session.csrf_token

    value, csrf = run_in_transaction(app.state.session_factory, work)
    client.cookies.set(web_sessions.SESSION_COOKIE, value)
    return csrf


@pytest.fixture
def browser_for(app, client):
    """``browser_for(username) -> Browser``: a separate signed-in client for an existing user
    (a session opened directly, :func:`open_session_for`); ``browser_for(username, password)``
    signs in through the form instead."""
    opened: list[TestClient] = []

    def _open(username: str, password: str | None = None) -> Browser:
        c = TestClient(app)
        opened.append(c)
        csrf = open_session_for(app, c, username) if password is None else sign_in(c, username, password)
        return Browser(username, c, csrf)

    yield _open
    for c in opened:
        c.close()


@pytest.fixture
def weblab(client, make_user, make_host, browser_for) -> WebLab:
    """Admin ``boss``, members ``alice`` and ``bob`` (signed in), host ``node-01`` with 4 GPUs."""
    for name, admin in (("boss", True), ("alice", False), ("bob", False)):
        make_user(name, admin=admin, password=PASSWORD, email=f"{name}@lab.example")
    host = make_host("node-01")
    devices = [gpu(f"GPU-{i}{i}{i}{i}aaaa-0000-0000-0000-00000000000{i}", i) for i in range(4)]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, devices, interval_seconds=FRESH_FOR),
                    headers=host.headers)  # fresh however long the test runs (tests.conftest.FRESH_FOR)
    assert r.status_code == 200, r.text
    return WebLab(
        admin=browser_for("boss"), alice=browser_for("alice"), bob=browser_for("bob"), host_token=host.token,
        devices=[d["uuid"] for d in devices],
    )


def count(session_factory, model, *where) -> int:
    """Rows of ``model`` (matching ``where``) as the database sees them."""
    with session_factory() as s:
        return s.scalar(select(func.count()).select_from(model).where(*where)) or 0
