"""Exactly-once creating requests: ``Idempotency-Key`` on reservations and series, the
booking form's hidden key, and the CLI's key per invocation (retried with the same key)."""

from __future__ import annotations

import threading
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select, text, update

from app.db import transaction
from app.models import IdempotencyKey, Reservation, utcnow
from tests.conftest import future

KEY = "0b7c5e0e-5a8c-4a43-9d0f-idem-test"


def _count(session_factory, model=Reservation) -> int:
    with session_factory() as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def _body(lab, hours: float = 30, device: int = 0) -> dict:
    return {"host": "node-01", "devices": [device], "start": future(hours).isoformat(), "duration": "PT1H"}


def _post(client, actor, body, key=KEY):
    return client.post("/api/v1/reservations", json=body, headers={**actor.headers, "Idempotency-Key": key})


def test_same_key_same_body_returns_first_answer_and_books_once(client, lab, session_factory):
    body = _body(lab)
    first = _post(client, lab.alice, body)
    assert first.status_code == 201, first.text
    again = _post(client, lab.alice, dict(reversed(list(body.items()))))  # same body, keys in another order
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert _count(session_factory) == 1


def test_same_key_different_body_is_422_naming_the_header(client, lab, session_factory):
    assert _post(client, lab.alice, _body(lab)).status_code == 201
    r = _post(client, lab.alice, _body(lab, device=1))
    assert r.status_code == 422
    assert r.json()["field"] == "Idempotency-Key" and "different request" in r.json()["detail"]
    assert _count(session_factory) == 1


def test_keys_belong_to_their_user(client, lab, session_factory):
    assert _post(client, lab.alice, _body(lab, device=0)).status_code == 201
    r = _post(client, lab.bob, _body(lab, device=1))
    assert r.status_code == 201 and r.json()["user"] == "bob"
    assert _count(session_factory) == 2


def test_refused_request_stores_no_key_and_may_be_retried(client, lab, session_factory):
    body = _body(lab)
    blocker = client.post("/api/v1/reservations", json=body, headers=lab.bob.headers)
    assert blocker.status_code == 201
    assert _post(client, lab.alice, body).status_code == 409
    assert _count(session_factory, IdempotencyKey) == 0
    assert client.delete(f"/api/v1/reservations/{blocker.json()['id']}", headers=lab.bob.headers).status_code == 200
    r = _post(client, lab.alice, body)
    assert r.status_code == 201 and r.json()["user"] == "alice"


def test_expired_key_is_pruned_and_books_again(client, lab, session_factory):
    first = _post(client, lab.alice, _body(lab))
    assert first.status_code == 201
    with transaction(session_factory, write=True) as s:
        s.execute(update(IdempotencyKey).values(expires_at=utcnow() - timedelta(seconds=1)))
    second = _post(client, lab.alice, _body(lab, hours=40))
    assert second.status_code == 201 and second.json()["id"] != first.json()["id"]
    with session_factory() as s:
        rows = s.scalars(select(IdempotencyKey)).all()
    assert len(rows) == 1 and rows[0].expires_at > utcnow() + timedelta(hours=23)


def test_malformed_key_is_422(client, lab):
    r = _post(client, lab.alice, _body(lab), key="x" * 256)
    assert r.status_code == 422 and r.json()["field"] == "Idempotency-Key"


def test_series_with_key_books_once(client, lab, session_factory):
    start = future(48)
    body = {"host": "node-01", "devices": [2], "freq": "daily", "count": 3, "start_date": start.strftime("%Y-%m-%d"),
            "start_time": "09:00", "duration": "PT1H", "tz": "Europe/Berlin"}
    first = client.post("/api/v1/series", json=body, headers={**lab.alice.headers, "Idempotency-Key": "series-1"})
    assert first.status_code == 201, first.text
    again = client.post("/api/v1/series", json=body, headers={**lab.alice.headers, "Idempotency-Key": "series-1"})
    assert again.status_code == 201 and again.json() == first.json()
    assert _count(session_factory) == 3


@pytest.mark.commits  # parallel requests, each on its own connection
def test_parallel_identical_any_one_gpu_requests_with_one_key_book_one_gpu(client, lab, session_factory):
    body = {"count": 1, "start": "now", "duration": "PT2H"}
    results: list[httpx.Response] = []
    barrier = threading.Barrier(4)

    def go():
        barrier.wait()
        results.append(client.post("/api/v1/reservations", json=body,
                                   headers={**lab.alice.headers, "Idempotency-Key": "any-one-gpu"}))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert set(codes) <= {201, 409} and 201 in codes, [r.text for r in results]
    created = {r.json()["id"] for r in results if r.status_code == 201}
    assert len(created) == 1
    for r in results:
        if r.status_code == 409:
            assert r.json()["field"] == "Idempotency-Key"
    assert _count(session_factory) == 1


@pytest.mark.commits  # a request in flight on another connection
def test_request_in_flight_with_the_key_is_409(client, lab, session_factory, db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers: a second request waits for the first and gets its answer")
    from app.services.idempotency import LOCK_CLASS, _lock_id

    with session_factory() as s:
        alice_id = s.scalar(text("SELECT id FROM users WHERE username = 'alice'"))
    with session_factory() as holder:  # the first request, still running: it holds the key's lock
        holder.execute(text("SELECT pg_advisory_xact_lock(:c, :o)"), {"c": LOCK_CLASS, "o": _lock_id(alice_id, KEY)})
        r = _post(client, lab.alice, _body(lab))
        # the key is judged before the body, as by a route taking the key as a dependency
        invalid = _post(client, lab.alice, {"host": "node-01", "start": "x"})
        holder.rollback()
    assert r.status_code == 409 and r.json()["field"] == "Idempotency-Key" and "still being processed" in r.json()["detail"]
    assert invalid.status_code == 409 and invalid.json()["field"] == "Idempotency-Key", invalid.text
    assert _count(session_factory) == 0
    assert _post(client, lab.alice, _body(lab)).status_code == 201


def test_cli_retries_a_lost_answer_with_the_same_key_and_books_once(client, lab, session_factory):
    from app.client.api import Api

    sent: list[str] = []
    inner = client._transport

    class LosesFirstAnswer(httpx.BaseTransport):
        def handle_request(self, request):
            sent.append(request.headers.get("idempotency-key"))
            response = inner.handle_request(request)
            if len(sent) == 1:
                response.read()
                raise httpx.ReadTimeout("answer lost", request=request)
            return response

    api = Api("http://testserver", lab.alice.token, transport=LosesFirstAnswer())
    api.retry_pause = 0.01
    out = api.create("/reservations", _body(lab))
    assert out["user"] == "alice"
    assert len(sent) == 2 and sent[0] == sent[1] and sent[0].startswith(api.invocation_key)
    assert _count(session_factory) == 1
    # a second creating request of the same invocation has its own key
    api.create("/reservations", _body(lab, device=1))
    assert sent[-1] != sent[0] and _count(session_factory) == 2
    api.close()
