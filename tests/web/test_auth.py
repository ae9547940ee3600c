"""Sign-in, sessions, CSRF and throttling, on both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.db import transaction
from app.models import LoginAttempt, Reservation, User, WebSession, utcnow
from app.security import token_hash
from app.web.sessions import SESSION_COOKIE
from tests.conftest import future
from tests.web.conftest import PASSWORD, count, csrf_of, sign_in


def _login_post(client: TestClient, username: str, password: str, **headers):
    page = client.get("/login")
    return client.post(
        "/login", data={"username": username, "password": password, "csrf_token": csrf_of(page.text), "next": "/book"},
        follow_redirects=False, headers=headers,
    )


@pytest.mark.parametrize("path", ["/", "/timeline", "/book", "/me/reservations", "/findings", "/admin", "/profile"])
def test_page_without_session_redirects_to_sign_in(client, path):
    r = client.get(path, follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == f"/login?next={path}"


def test_htmx_request_without_session_gets_hx_redirect(client):
    r = client.get("/", headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/timeline?view=week"})
    assert r.status_code == 401
    assert r.headers["hx-redirect"].startswith("/login?next=/timeline")


def test_sign_in_sets_httponly_lax_cookie_and_stores_only_its_hash(client, make_user, session_factory):
    make_user("alice", password=PASSWORD)
    r = _login_post(client, "alice", PASSWORD)
    assert r.status_code == 303 and r.headers["location"] == "/book"
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith(SESSION_COOKIE + "="))
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Secure" not in cookie
    value = cookie.split(";", 1)[0].split("=", 1)[1]
    with session_factory() as s:
        rows = list(s.scalars(select(WebSession)))
    assert len(rows) == 1
    assert rows[0].token_hash == token_hash(value) and rows[0].token_hash != value
    assert len(rows[0].csrf_token) >= 32
    assert client.get("/", follow_redirects=False).status_code == 200


def test_cookie_is_secure_behind_https_proxy(client, make_user):
    make_user("alice", password=PASSWORD)
    r = _login_post(client, "alice", PASSWORD, **{"X-Forwarded-Proto": "https"})
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith(SESSION_COOKIE + "="))
    assert "Secure" in cookie


def test_wrong_password_is_refused_with_message_and_recorded(client, make_user, session_factory):
    make_user("alice", password=PASSWORD)
    r = _login_post(client, "alice", "not the password")
    assert r.status_code == 401
    assert "wrong username or password" in r.text
    assert count(session_factory, LoginAttempt, LoginAttempt.username == "alice") == 1
    assert count(session_factory, WebSession) == 0
    assert client.get("/", follow_redirects=False).status_code == 303


def test_sign_in_throttled_after_max_attempts_even_with_right_password(client, make_user, session_factory, settings):
    make_user("alice", password=PASSWORD)
    for _ in range(settings.login_max_attempts):
        assert _login_post(client, "alice", "guess").status_code == 401
    r = _login_post(client, "alice", PASSWORD)
    assert r.status_code == 429
    assert "too many failed sign-ins" in r.text and "try again in" in r.text
    assert count(session_factory, WebSession) == 0
    # another username from the same address is not throttled
    make_user("bob", password=PASSWORD)
    assert _login_post(client, "bob", PASSWORD).status_code == 303


def test_throttle_window_passes(client, make_user, session_factory, settings):
    make_user("alice", password=PASSWORD)
    for _ in range(settings.login_max_attempts):
        _login_post(client, "alice", "guess")
    with transaction(session_factory, write=True) as s:
        s.execute(update(LoginAttempt).values(at=utcnow() - timedelta(seconds=settings.login_window_seconds + 1)))
    assert _login_post(client, "alice", PASSWORD).status_code == 303


def test_sign_in_form_without_its_token_is_refused(client, make_user, session_factory):
    make_user("alice", password=PASSWORD)
    client.get("/login")
    r = client.post("/login", data={"username": "alice", "password": PASSWORD}, follow_redirects=False)
    assert r.status_code == 403 and "security token" in r.text
    r = client.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": "forged"}, follow_redirects=False)
    assert r.status_code == 403
    assert count(session_factory, WebSession) == 0


def test_form_post_without_csrf_token_is_refused_and_writes_nothing(weblab, session_factory):
    body = {"mode": "devices", "host": "node-01", "devices": weblab.devices[0], "when": "now", "length": "1"}
    c = weblab.alice.client
    r = c.post("/book", data=body, follow_redirects=False)
    assert r.status_code == 403 and "security token" in r.text
    r = c.post("/book", data={**body, "csrf_token": weblab.bob.csrf}, follow_redirects=False)
    assert r.status_code == 403
    assert count(session_factory, Reservation) == 0
    # htmx sends the token as a header
    r = c.post("/book", data=body, headers={"X-CSRF-Token": weblab.alice.csrf}, follow_redirects=False)
    assert r.status_code == 303
    assert count(session_factory, Reservation) == 1


def test_sign_out_deletes_the_session(weblab, session_factory):
    c = weblab.alice.client
    value = c.cookies.get(SESSION_COOKIE)
    r = weblab.alice.post("/logout")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    with session_factory() as s:
        assert s.scalar(select(WebSession).where(WebSession.token_hash == token_hash(value))) is None
    c.cookies.set(SESSION_COOKIE, value)  # replaying the old cookie does not work either
    assert c.get("/", follow_redirects=False).status_code == 303


def test_expired_or_deactivated_sessions_stop_working(weblab, session_factory):
    with transaction(session_factory, write=True) as s:
        s.execute(update(WebSession).where(WebSession.user_id == s.scalar(select(User.id).where(User.username == "alice")))
                  .values(expires_at=utcnow() - timedelta(seconds=1)))
        s.execute(update(User).where(User.username == "bob").values(active=False))
    assert weblab.alice.get("/", follow_redirects=False).status_code == 303
    assert weblab.bob.get("/", follow_redirects=False).status_code == 303
    assert weblab.admin.get("/", follow_redirects=False).status_code == 200


def test_api_accepts_session_cookie_but_unsafe_methods_need_the_csrf_header(weblab):
    c = weblab.alice.client
    assert c.get("/api/v1/me").json()["username"] == "alice"
    body = {"host": "node-01", "devices": [0], "start": future(3).isoformat(), "duration": "PT1H"}
    r = c.post("/api/v1/reservations", json=body)
    assert r.status_code == 403 and "X-CSRF-Token" in r.json()["detail"]
    r = c.post("/api/v1/reservations", json=body, headers={"X-CSRF-Token": weblab.alice.csrf})
    assert r.status_code == 201 and r.json()["user"] == "alice"


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/\\evil.example"])
def test_sign_in_returns_only_to_local_paths(client, make_user, target):
    make_user("alice", password=PASSWORD)
    page = client.get("/login", params={"next": target})
    r = client.post(
        "/login", data={"username": "alice", "password": PASSWORD, "csrf_token": csrf_of(page.text), "next": target},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/"


def test_signed_in_visitor_skips_the_sign_in_form(weblab):
    r = weblab.alice.get("/login?next=/timeline", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/timeline"


def test_forms_carry_the_csrf_token_stored_with_the_session(client, make_user, session_factory):
    make_user("carol", password=PASSWORD)
    token = sign_in(client, "carol")
    with session_factory() as s:
        assert s.scalar(select(WebSession.csrf_token)) == token
