"""Applying and inspecting the Alembic migrations programmatically."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

HERE = Path(__file__).resolve().parent  # alembic.ini and migrations/ ship inside the package


def alembic_config(url: str | None = None) -> Config:
    """Alembic config for the package's ``app/migrations/``; ``url`` overrides the settings' URL."""
    cfg = Config(str(HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(HERE / "migrations"))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Apply pending migrations (creates ``btree_gist`` and the exclusion constraints on PostgreSQL)."""
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()
