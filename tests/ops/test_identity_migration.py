"""Every migration, the directory/notices one last: the models match the migrated schema (what ``alembic
check`` checks), and it downgrades and upgrades again. Both databases."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect


def test_models_match_the_migrations_and_every_migration_round_trips(db_url):
    from app.config import normalize_database_url
    from app.migrate import alembic_config, upgrade
    from app.models import Base

    engine = create_engine(normalize_database_url(db_url))
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        command.downgrade(alembic_config(db_url), "0002")
        assert "notify_targets" not in inspect(engine).get_table_names()
        assert "unix_uid" not in {c["name"] for c in inspect(engine).get_columns("users")}
        upgrade(db_url)
        assert {"notify_targets", "notice_preferences"} <= set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        engine.dispose()
