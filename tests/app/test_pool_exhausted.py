"""A server process whose connection pool stays in use answers 503 busy with Retry-After,
names no outage and writes nothing; the next request after a connection frees up works.
Both databases (the pool is the same QueuePool on each)."""

from __future__ import annotations

import pytest

import logging
import time

from fastapi.testclient import TestClient

pytestmark = pytest.mark.commits  # engines with pools of their own

PAGE = {"Accept": "text/html", "Cookie": "gpuroster_session=" + "s" * 43}
BOGUS = {"Authorization": "Bearer " + "x" * 40}


def test_pool_exhausted_is_503_busy_then_recovers(settings, caplog):
    from app.main import create_app

    app = create_app(settings.model_copy(update={"db_pool_size": 1, "db_pool_overflow": 0, "db_pool_timeout_seconds": 0.2}))
    with TestClient(app) as c:
        assert app.state.engine.pool.size() == 1
        held = app.state.engine.connect()  # the pool's only connection, as a long request would hold it
        try:
            with caplog.at_level(logging.WARNING, logger="gpuroster.db"):
                api = c.get("/api/v1/reservations", headers=BOGUS)
                page = c.get("/", headers=PAGE)
        finally:
            held.close()
        # the periodic rounds (expiry, sweep, waitlist) share the one connection: a client told
        # busy retries after Retry-After, and within a few tries gets its turn
        for _ in range(50):
            after = c.get("/api/v1/reservations", headers=BOGUS)
            if after.status_code != 503:
                break
            time.sleep(0.1)
    assert api.status_code == 503, api.text
    assert api.headers["content-type"].startswith("application/problem+json")
    assert api.headers["Retry-After"] == "1"
    assert api.json()["type"] == "/problems/busy" and "connection" in api.json()["detail"]
    assert page.status_code == 503 and page.headers["Retry-After"] == "1"
    assert page.headers["content-type"].startswith("text/html") and "Service busy" in page.text
    assert after.status_code == 401, after.text  # a connection again: the bogus token is looked up and refused
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "connection pool exhausted" in logged and "database unavailable" not in logged


def test_pool_settings_reach_the_engine(settings):
    from app.db import build_engine

    engine = build_engine(settings.model_copy(update={"db_pool_size": 3, "db_pool_overflow": 4, "db_pool_timeout_seconds": 7.5}))
    try:
        assert (engine.pool.size(), engine.pool._max_overflow, engine.pool._timeout) == (3, 4, 7.5)
    finally:
        engine.dispose()
