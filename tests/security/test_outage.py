"""The database away (D5): 503 problem details with Retry-After for the API, an HTML 503
for pages, never a plain 500, logged once per outage, recovered without a restart."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from tests.conftest import _create_pg_database, _drop_pg_database, _pg_admin_url, PG_SERVER, require_pg

pytestmark = pytest.mark.commits  # applications on their own engines, whose database goes away

# a page request of a browser with a session cookie: looking the session up needs the database
PAGE = {"Accept": "text/html", "Cookie": "gpuroster_session=" + "s" * 43}


def _admin(sql: str) -> None:
    eng = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(sql))
    eng.dispose()


def _rename(old: str, new: str) -> None:
    """Rename a database a live server is using: new connections are refused first, so the
    server's periodic work cannot reconnect between the ending of its sessions and the
    rename (which needs none open); the renamed database takes connections again."""
    eng = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'ALTER DATABASE "{old}" WITH ALLOW_CONNECTIONS false'))
        c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{old}'"
                       " AND pid <> pg_backend_pid()"))
        c.execute(text(f'ALTER DATABASE "{old}" RENAME TO "{new}"'))
        c.execute(text(f'ALTER DATABASE "{new}" WITH ALLOW_CONNECTIONS true'))
    eng.dispose()


def _assert_api_503(r) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert int(r.headers["Retry-After"]) >= 1
    assert r.json()["title"] == "Service unavailable" and "database" in r.json()["detail"]


def _assert_page_503(r) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("text/html") and "Retry-After" in r.headers
    assert "Service unavailable" in r.text and "<html" in r.text


@pytest.fixture
def pg_database():
    require_pg()
    from app.migrate import upgrade

    name = _create_pg_database()
    upgrade(f"{PG_SERVER}/{name}")
    names = {"current": name}
    yield names
    _drop_pg_database(names["current"])


def test_d5_renamed_database_is_503_then_recovers_without_restart(pg_database, tmp_path, caplog, make_pg_app):
    name = pg_database["current"]
    c, actor = make_pg_app(name)
    assert c.get("/api/v1/reservations", headers=actor).status_code == 200
    _rename(name, name + "_away")
    pg_database["current"] = name + "_away"
    with caplog.at_level(logging.WARNING, logger="gpuroster.db"):
        for _ in range(3):
            _assert_api_503(c.get("/api/v1/reservations", headers=actor))
        _assert_api_503(c.post("/api/v1/reservations", headers=actor, json={"host": "x", "devices": [0], "start": "now",
                                                                            "duration": "PT1H"}))
        _assert_page_503(c.get("/", headers=PAGE))
        _assert_page_503(c.get("/timeline", headers=PAGE))
        assert c.get("/readyz").status_code == 503
        _rename(name + "_away", name)
        pg_database["current"] = name
        assert c.get("/api/v1/reservations", headers=actor).status_code == 200
    down = [r for r in caplog.records if "database unavailable" in r.getMessage()]
    up = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(down) == 1 and len(up) == 1


def test_d5_dropped_database_is_503(pg_database, make_pg_app):
    name = pg_database["current"]
    c, actor = make_pg_app(name)
    _admin(f'DROP DATABASE "{name}" WITH (FORCE)')
    _assert_api_503(c.get("/api/v1/hosts", headers=actor))
    _assert_page_503(c.get("/me/reservations", headers=PAGE))
    _admin(f'CREATE DATABASE "{name}"')  # so that the fixture's drop finds it


def test_d5_wrong_port_is_503_not_500(tmp_path):
    from app.config import Settings
    from app.main import create_app

    settings = Settings(database_url="postgresql://postgres@127.0.0.1:1/nowhere", data_dir=tmp_path, environment="test")
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        _assert_api_503(c.get("/api/v1/reservations", headers={"Authorization": "Bearer gpr_x"}))
        _assert_page_503(c.get("/findings", headers=PAGE))


@pytest.fixture
def make_pg_app(tmp_path):
    from app.config import Settings
    from app.db import run_in_transaction
    from app.main import create_app
    from app.services import users as user_service

    clients = []

    def _make(name: str):
        settings = Settings(database_url=f"{PG_SERVER}/{name}", data_dir=tmp_path, environment="test")
        c = TestClient(create_app(settings), raise_server_exceptions=False)
        c.__enter__()
        clients.append(c)

        def work(s):
            u = user_service.create_user(s, username="alice")
            return user_service.create_api_token(s, user=u, name="t")[1]

        token = run_in_transaction(c.app.state.session_factory, work)
        return c, {"Authorization": f"Bearer {token}"}

    yield _make
    for c in clients:
        c.__exit__(None, None, None)
