"""Least disclosure (D14) and the /metrics bearer token."""

from __future__ import annotations

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
