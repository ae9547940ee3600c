"""A request queues for its SQLite write turn no longer than the busy timeout: past it, 503
busy with ``Retry-After`` and nothing written. On PostgreSQL there is no turn to wait for.

The turn is held the way a long writer holds it: the test takes this process's write gate on
the client's own event loop (``TestClient.portal``), so the booking and the snapshot that
follow queue behind it exactly as concurrent requests would.
"""

from __future__ import annotations

import pytest

import time

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.conftest import Actor, book, future, gpu, snapshot_body

pytestmark = pytest.mark.commits  # applications of its own, writing concurrently

WAIT_MS = 300  # the busy timeout under test: short, so that the test waits little


def _app(db_url, tmp_path):
    from app.config import Settings
    from app.main import create_app

    return create_app(Settings(database_url=db_url, data_dir=tmp_path, environment="test",
                               sqlite_busy_timeout_ms=WAIT_MS))


def _reservations(app) -> int:
    from app.models import Reservation

    with app.state.session_factory() as s:
        return s.scalar(select(func.count()).select_from(Reservation))


def test_a_request_waits_for_its_write_turn_at_most_the_busy_timeout(db_url, tmp_path):
    from app.db import run_in_transaction, write_gate_for
    from app.services import hosts as host_service
    from app.services import users as user_service

    app = _app(db_url, tmp_path)
    with TestClient(app) as client:
        def setup(s):
            u = user_service.create_user(s, username="alice")
            return user_service.create_api_token(s, user=u, name="t")[1], host_service.create_host(s, name="node-01")[1]

        user_token, host_token = run_in_transaction(app.state.session_factory, setup)
        alice = Actor("alice", user_token)
        host_h = {"Authorization": f"Bearer {host_token}"}
        devices = [gpu("GPU-aaaaaaaa-0000-0000-0000-000000000000", 0)]
        assert client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, devices),
                           headers=host_h).status_code == 200

        async def gate():
            return write_gate_for(app)

        held = client.portal.call(gate)
        if held is None:  # PostgreSQL: writers are serialised by the database's row locks only
            assert db_url.startswith("postgresql")
            r = book(client, alice, [0], future(2))
            assert r.status_code == 201, r.text
            return

        client.portal.call(held.acquire)
        try:
            t0 = time.monotonic()
            r = book(client, alice, [0], future(2))
            waited = time.monotonic() - t0
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["type"] == "/problems/busy"
            assert WAIT_MS / 1000 <= waited < 10, waited
            assert _reservations(app) == 0  # nothing was written

            # the agent's snapshot queues for the same turn, under the same bound
            r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, devices), headers=host_h)
            assert r.status_code == 503, r.text
            assert r.json()["type"] == "/problems/busy"
        finally:
            client.portal.call(held.release)

        # the turn free again, the same requests go through
        r = book(client, alice, [0], future(2))
        assert r.status_code == 201, r.text
        assert _reservations(app) == 1
        assert client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, devices),
                           headers=host_h).status_code == 200
