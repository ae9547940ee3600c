"""POST /api/v1/reservations authenticates in the same worker-thread call as it books, and
still answers in a FastAPI route's order: bad credentials (401/403) before the
Idempotency-Key and the body are judged, as every route taking WriteUser does. A client with a
revoked token must hear that, not what is wrong with its body (the CLI maps 401 and 422 to
different exit codes)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

P = "/api/v1/reservations"
BAD_BODY = {"host": "node-01", "start": "x"}  # neither end nor duration, no devices


def _refused(r, status, words):
    assert r.status_code == status, r.text
    assert words in r.json()["detail"], r.text
    if status == 401:
        assert r.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize("who", ["unknown", "revoked", "expired", "deactivated"])
def test_a_bad_token_is_401_whatever_the_body(client, make_user, session_factory, who):
    from app.models import ApiToken, User, utcnow

    actor = make_user("eve")
    headers = actor.headers if who != "unknown" else {"Authorization": "Bearer gpr_not-a-token"}
    uid = select(User.id).where(User.username == "eve").scalar_subquery()
    with session_factory() as s:
        if who == "revoked":
            s.execute(update(ApiToken).where(ApiToken.user_id == uid).values(revoked_at=utcnow()))
        if who == "expired":
            s.execute(update(ApiToken).where(ApiToken.user_id == uid).values(expires_at=utcnow() - timedelta(hours=1)))
        if who == "deactivated":
            s.execute(update(User).where(User.username == "eve").values(active=False))
        s.commit()
    words = "deactivated" if who == "deactivated" else "invalid, expired or revoked token"
    for body in (BAD_BODY, {}):
        _refused(client.post(P, json=body, headers=headers), 401, words)


def test_a_host_token_is_403_whatever_the_body(client, weblab):
    h = {"Authorization": f"Bearer {weblab.host_token}"}
    _refused(client.post(P, json=BAD_BODY, headers=h), 403, "host tokens reach only the agent endpoints")


def test_a_session_cookie_without_the_csrf_header_is_403_whatever_the_body(weblab):
    for headers in ({}, {"X-CSRF-Token": "wrong"}):
        _refused(weblab.bob.client.post(P, json=BAD_BODY, headers=headers), 403, "X-CSRF-Token")


def test_a_cookie_that_is_no_session_is_401_whatever_the_body(app, weblab):
    anon = TestClient(app)
    for cookie in ("gpuroster_session=" + "s" * 43, "lang=de"):
        _refused(anon.post(P, json=BAD_BODY, headers={"Cookie": cookie}), 401, "sign in")


def test_a_malformed_idempotency_key_does_not_answer_before_authentication(client, weblab):
    good = {"host": "node-01", "devices": [0], "start": "now", "duration": "PT1H"}
    _refused(client.post(P, json=good, headers={"Authorization": "Bearer gpr_nope", "Idempotency-Key": "a b"}),
             401, "invalid, expired or revoked token")
    _refused(client.post(P, json=good, headers={"Authorization": f"Bearer {weblab.host_token}", "Idempotency-Key": "a b"}),
             403, "host tokens")


def test_a_key_reused_with_another_invalid_body_names_the_key(client, lab):
    from tests.conftest import future

    h = {**lab.alice.headers, "Idempotency-Key": "k1"}
    good = {"host": "node-01", "devices": [0], "start": future(3).isoformat(), "duration": "PT1H"}
    assert client.post(P, json=good, headers=h).status_code == 201
    r = client.post(P, json=BAD_BODY, headers=h)
    assert r.status_code == 422 and r.json()["field"] == "Idempotency-Key", r.text


def test_the_booking_body_is_still_documented(client):
    """The route reads its own body, so its schema is declared for the OpenAPI document."""
    doc = client.get("/openapi.json").json()
    body = doc["paths"][P]["post"]["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ReservationCreate"}
    assert {"host", "devices", "start", "end", "duration"} <= set(doc["components"]["schemas"]["ReservationCreate"]["properties"])


def test_a_body_that_is_not_json_is_422_before_authentication(client):
    """As FastAPI answers a body parameter it cannot decode: at once, whoever sends it."""
    r = client.post(P, content=b'{"host": ', headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "body" and "not valid JSON" in r.json()["detail"], r.text
