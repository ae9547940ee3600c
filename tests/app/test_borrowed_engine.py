"""``create_app(engine=...)``: the application runs on an engine its caller keeps, and leaves
it open at shutdown; applications that follow one another on one engine each hear of the
database's return after an outage."""

from __future__ import annotations

import pytest

from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app.db import build_engine
from app.main import create_app
from app.middleware.outage import watch_recovery

pytestmark = pytest.mark.commits  # applications built on their own or a lent engine


def test_a_lent_engine_is_used_and_left_open_while_an_own_engine_is_disposed(settings):
    engine = build_engine(settings)
    try:
        app = create_app(settings, engine=engine)
        with TestClient(app) as c:
            assert c.get("/readyz").status_code == 200
            assert app.state.engine is engine
        assert engine.pool.checkedin() >= 1, "the lent engine keeps its pooled connections"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar_one() == 1

        own = create_app(settings)
        with TestClient(own) as c:
            assert c.get("/readyz").status_code == 200
            assert own.state.engine is not engine
        assert own.state.engine.pool.checkedin() == 0, "an engine the application built is disposed at shutdown"
    finally:
        engine.dispose()


def test_each_application_on_a_lent_engine_hears_that_the_database_is_back(settings):
    engine = build_engine(settings)
    try:
        logs = []
        for _ in range(2):
            app = create_app(settings, engine=engine)
            with TestClient(app) as c:
                assert c.get("/readyz").status_code == 200
                logs.append(app.state.db_outage)
                # the outage handler starts watching the engine when it first answers an outage
                app.state.db_outage.failed(OperationalError("SELECT 1", {}, Exception("connection refused")))
                watch_recovery(app, app.state.db_outage)
        assert all(log.since is not None for log in logs)
        engine.pool.dispose()  # the next connection is a new one, as after an outage
        with engine.connect():
            pass
        assert [log.since for log in logs] == [None, None]
    finally:
        engine.dispose()
