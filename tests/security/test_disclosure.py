"""Least disclosure (D14) and the /metrics bearer token."""

from __future__ import annotations

import pytest

from sqlalchemy import select

from app.db import run_in_transaction
from app.models import User
from app.services import users as user_service
from tests.app.test_notices import conf, factory, finding, hook, lab, mailbox, post  # noqa: F401 - fixtures


def _token(factory, username: str) -> dict[str, str]:  # noqa: F811
    def work(s):
        u = s.scalar(select(User).where(User.username == username))
        return user_service.create_api_token(s, user=u, name="t")[1]

    return {"Authorization": f"Bearer {run_in_transaction(factory, work)}"}


@pytest.mark.commits  # seeds through a session factory of its own engine
def test_d14_offender_sees_the_holder_by_name_not_email(client, factory, lab, conf, mailbox, hook):  # noqa: F811
    post(factory, conf, 1, [finding(kind="foreign", user="alice", holder="bob")])
    alice, bob, carol = (_token(factory, n) for n in ("alice", "bob", "carol"))
    [f] = client.get("/api/v1/findings", headers=alice).json()["items"]
    assert f["holder"] == "bob"
    seen = {(n["channel"], n["recipient"]) for n in f["notices"]}
    assert ("email", "bob") in seen and ("email", "alice@lab.example") in seen
    assert "bob@lab.example" not in client.get(f"/api/v1/findings/{f['id']}", headers=alice).text
    # the holder sees their own address; a bystander sees no recipients
    assert ("email", "bob@lab.example") in {(n["channel"], n["recipient"]) for n in
                                            client.get(f"/api/v1/findings/{f['id']}", headers=bob).json()["notices"]}
    assert "@lab.example" not in client.get(f"/api/v1/findings/{f['id']}", headers=carol).text


@pytest.mark.commits  # apps of its own, with and without a token
def test_metrics_bearer_token_when_configured(settings):
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app(settings.model_copy(update={"metrics_token": "scrape-secret-0123456789"}))) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        r = c.get("/metrics", headers={"Authorization": "Bearer scrape-secret-0123456789"})
        assert r.status_code == 200 and "gpuroster_" in r.text
    with TestClient(create_app(settings)) as c:  # not configured: open, as before
        assert c.get("/metrics").status_code == 200


def test_calendar_feed_tokens_are_stored_hashed_and_rotated_from_profile(app, client, make_user, session_factory):
    import re
    from urllib.parse import urlsplit

    from fastapi.testclient import TestClient

    from app.security import token_hash
    from tests.security.helpers import PASSWORD, sign_in

    make_user("alice", password=PASSWORD)
    with TestClient(app) as browser:
        csrf = sign_in(browser, "alice")
        assert "No calendar feed yet." in browser.get("/profile").text
        r = browser.post("/profile/feed", data={"csrf_token": csrf}, follow_redirects=False)
        assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
        first = re.search(r'id="new-feed">([^<]+)<', r.text).group(1)
        token = urlsplit(first).path.rsplit("/", 1)[1].removesuffix(".ics")
        with session_factory() as s:
            stored = s.scalar(select(User.feed_token_hash).where(User.username == "alice"))
        assert stored == token_hash(token) and token not in stored
        assert client.get(urlsplit(first).path).status_code == 200
        page = browser.get("/profile").text
        assert "You have a calendar feed." in page and token not in page
        second = re.search(r'id="new-feed">([^<]+)<',
                           browser.post("/profile/feed", data={"csrf_token": csrf}).text).group(1)
        assert second != first
        assert client.get(urlsplit(first).path).status_code == 404
        assert client.get(urlsplit(second).path).status_code == 200
        assert browser.post("/profile/feed", data={}, follow_redirects=False).status_code == 403


def test_feed_api_shows_a_url_once(client, make_user):
    alice = make_user("alice")
    first = client.get("/api/v1/me/feed", headers=alice.headers).json()
    assert first["url"].endswith(".ics")
    again = client.get("/api/v1/me/feed", headers=alice.headers).json()
    assert again["url"] is None and "rotate" in again["detail"]
