"""Reads never write: an authenticated GET issues no INSERT/UPDATE/DELETE, so on SQLite it
never waits for the write lock that agents posting snapshots hold; a token's last use is
written later, in its own transaction."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.conftest import book, future, request_statements

READ_PATHS = [
    "/api/v1/me",
    "/api/v1/reservations",
    "/api/v1/devices",
    "/api/v1/hosts",
    "/api/v1/hosts/node-01",
    "/api/v1/me/usage",
    "/api/v1/rules",
    "/api/v1/groups",
    "/api/v1/tokens",
    "/api/v1/findings",
    "/metrics",
]
WRITE_VERBS = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")


def _writes_during(engine, fn) -> list[str]:
    with request_statements(engine, keep=lambda s: s.lstrip().upper().startswith(WRITE_VERBS)) as seen:
        fn()
    return seen


def _last_used(factory, token_prefix: str):
    from app.models import ApiToken

    with factory() as s:
        return s.scalar(select(ApiToken.last_used_at).where(ApiToken.prefix == token_prefix[:10]))


def test_get_requests_issue_no_write_and_token_use_is_flushed_apart(app, client, lab, session_factory):
    assert book(client, lab.alice, [lab.devices[0]], future(2)).status_code == 201
    app.state.token_usage.flush(session_factory)  # the booking's own token use, written apart
    assert _last_used(session_factory, lab.bob.token) is None

    def reads():
        for path in READ_PATHS:
            r = client.get(path, headers=lab.bob.headers)
            assert r.status_code == 200, (path, r.status_code, r.text)

    assert _writes_during(app.state.engine, reads) == []
    # the use was noted, not lost: one flush writes it, in its own transaction
    assert _last_used(session_factory, lab.bob.token) is None
    assert app.state.token_usage.flush(session_factory) >= 1
    used = _last_used(session_factory, lab.bob.token)
    assert used is not None
    # a second flush within the interval writes nothing more
    client.get("/api/v1/me", headers=lab.bob.headers)
    assert app.state.token_usage.flush(session_factory) == 0
    assert _last_used(session_factory, lab.bob.token) == used


@pytest.mark.commits  # an app of its own, read after it stops
def test_token_use_is_flushed_at_shutdown(settings, make_user):
    from app.main import create_app

    app = create_app(settings)
    with TestClient(app) as c:
        factory = app.state.session_factory
        from app.db import run_in_transaction
        from app.services import users as user_service

        token = run_in_transaction(factory, lambda s: user_service.create_api_token(
            s, user=user_service.create_user(s, username="carol"), name="t")[1])
        assert c.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert _last_used(factory, token) is None
    # the lifespan's exit flushed it (the engine is disposed, but a new connection reads it)
    assert _last_used(factory, token) is not None


def test_flush_never_moves_last_use_backwards(app, client, lab, session_factory):
    from app.models import utcnow

    usage = app.state.token_usage
    client.get("/api/v1/me", headers=lab.bob.headers)
    usage.flush(session_factory)
    first = _last_used(session_factory, lab.bob.token)
    assert first is not None and usage.pending() == {}
    from app.models import ApiToken

    with session_factory() as s:
        tid = s.scalar(select(ApiToken.id).where(ApiToken.prefix == lab.bob.token[:10]))
    usage.note(tid, None, first - timedelta(hours=1))  # a late, older note
    usage.flush(session_factory)
    assert _last_used(session_factory, lab.bob.token) == first
    assert first <= utcnow()


@pytest.mark.commits  # another process holds the write lock
def test_reads_answer_while_another_process_holds_the_sqlite_write_lock(db_url, tmp_path, make_user):
    """Agents posting snapshots hold SQLite's one write lock most of the time; a read that
    tried to write (a token's last use) waited for it and failed with 503 'database is busy'."""
    if not db_url.startswith("sqlite"):
        pytest.skip("SQLite's single write lock; PostgreSQL reads never block on writers")
    from app.config import Settings
    from app.main import create_app

    settings = Settings(database_url=db_url, data_dir=tmp_path, environment="test", sqlite_busy_timeout_ms=300)
    app = create_app(settings)
    with TestClient(app) as c:
        from app.db import run_in_transaction
        from app.services import users as user_service

        token = run_in_transaction(app.state.session_factory, lambda s: user_service.create_api_token(
            s, user=user_service.create_user(s, username="dave"), name="t")[1])
        writer = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None, timeout=5)
        writer.execute("BEGIN IMMEDIATE")  # another process's write transaction, held open
        try:
            codes = [c.get(p, headers={"Authorization": f"Bearer {token}"}).status_code
                     for p in ("/api/v1/me", "/api/v1/reservations", "/api/v1/devices", "/api/v1/me")]
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        assert codes == [200, 200, 200, 200]
