"""Sign-in throttling (D10): per account, per address and per pair; X-Forwarded-For believed
only from configured proxies; the right password works again after the window; the web
form and the CLI/API token sign-in count the same failures."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

pytestmark = pytest.mark.commits  # an app per client address, sharing the users through the database

PASSWORD = "correct horse battery"


@pytest.fixture
def make_client(settings):
    """``make_client(peer, **settings) -> TestClient`` whose TCP peer address is ``peer``."""
    from app.main import create_app

    opened = []

    def _make(peer: str, **overrides) -> TestClient:
        c = TestClient(create_app(settings.model_copy(update=overrides)), client=(peer, 40000))
        c.__enter__()
        opened.append(c)
        return c

    yield _make
    for c in opened:
        c.__exit__(None, None, None)


def _token(c: TestClient, username: str, password: str, xff: str | None = None):
    headers = {"X-Forwarded-For": xff} if xff else {}
    return c.post("/api/v1/auth/token", json={"username": username, "password": password}, headers=headers)


def test_d10_rotating_forwarded_for_from_an_untrusted_peer_changes_nothing(make_client, make_user):
    make_user("alice", password=PASSWORD)
    c = make_client("198.51.100.7")  # no trusted proxies configured
    codes = [_token(c, "alice", "wrong", xff=f"203.0.113.{i}").status_code for i in range(24)]
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}
    r = _token(c, "alice", PASSWORD, xff="192.0.2.99")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert "alice" in r.json()["detail"]


def test_d10_right_password_after_the_sixth_wrong_one_works_after_the_window(make_client, make_user):
    make_user("alice", password=PASSWORD)
    c = make_client("198.51.100.7", login_window_seconds=2)
    assert [_token(c, "alice", "wrong").status_code for _ in range(6)] == [401] * 5 + [429]
    assert _token(c, "alice", PASSWORD).status_code == 429
    time.sleep(2.2)
    assert _token(c, "alice", PASSWORD).status_code == 201


def test_d10_per_account_limit_holds_across_addresses_named_by_a_trusted_proxy(make_client, make_user):
    make_user("alice", password=PASSWORD)
    c = make_client("10.0.0.5", trusted_proxies="10.0.0.0/24", login_max_attempts_per_account=20)
    codes = [_token(c, "alice", "wrong", xff=f"203.0.113.{i}").status_code for i in range(24)]
    # every address is new, so the per-address limits never trip: the per-account one does
    assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}
    assert "alice" in _token(c, "alice", PASSWORD, xff="203.0.113.200").json()["detail"]


def test_d10_a_trusted_proxy_address_is_not_the_client(make_client, make_user):
    """Behind a trusted proxy each client has its own pair limit: one client's failures do
    not throttle another client's right password."""
    make_user("alice", password=PASSWORD)
    c = make_client("10.0.0.5", trusted_proxies="10.0.0.5")
    assert {_token(c, "alice", "wrong", xff="203.0.113.1").status_code for _ in range(6)} == {401, 429}
    assert _token(c, "alice", PASSWORD, xff="203.0.113.2").status_code == 201


def test_d10_spraying_usernames_from_one_address_is_slowed(make_client, make_user):
    make_user("alice", password=PASSWORD)
    c = make_client("198.51.100.8", login_max_attempts_per_address=10)
    codes = [_token(c, f"user{i:02d}", "Winter2026!").status_code for i in range(20)]
    assert codes[:10] == [401] * 10 and set(codes[10:]) == {429}
    r = _token(c, "alice", PASSWORD)
    assert r.status_code == 429 and "this address" in r.json()["detail"]
    # another address is not affected
    assert _token(make_client("198.51.100.9"), "alice", PASSWORD).status_code == 201


def test_web_form_and_token_sign_in_share_the_throttle(make_client, make_user):
    import re

    make_user("alice", password=PASSWORD)
    c = make_client("198.51.100.10")
    assert {_token(c, "alice", "wrong").status_code for _ in range(5)} == {401}
    page = c.get("/login")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    r = c.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": csrf, "next": "/"},
               follow_redirects=False)
    assert r.status_code == 429 and "Too many sign-in attempts" in r.text and int(r.headers["Retry-After"]) >= 1
