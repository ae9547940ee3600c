"""The feed-token migration on both databases: plain tokens become their SHA-256 (existing
URLs keep working), the schema matches the models (autogenerate finds nothing), and the
migration goes down and up again."""

from __future__ import annotations

import hashlib

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text

from app.config import normalize_database_url
from app.migrate import upgrade
from tests.conftest import PG_SERVER, _create_pg_database, _drop_pg_database, require_pg


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    require_pg()
    name = _create_pg_database()
    yield f"{PG_SERVER}/{name}"
    _drop_pg_database(name)


def test_feed_tokens_are_hashed_in_place_and_the_schema_matches(empty_db):
    from alembic import command

    from app.migrate import alembic_config
    from app.models import Base

    upgrade(empty_db, "0002")
    engine = create_engine(normalize_database_url(empty_db))
    with engine.begin() as c:
        c.execute(text("INSERT INTO users (username, unix_name, role, active, feed_token, created_at) "
                       "VALUES ('alice', 'alice', 'member', true, 'plain-feed-token', CURRENT_TIMESTAMP)"))
    upgrade(empty_db)
    with engine.connect() as c:
        stored = c.execute(text("SELECT feed_token_hash FROM users WHERE username = 'alice'")).scalar_one()
        assert stored == hashlib.sha256(b"plain-feed-token").hexdigest()
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []
    command.downgrade(alembic_config(empty_db), "0002")
    upgrade(empty_db)
    engine.dispose()
