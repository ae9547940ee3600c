"""PostgreSQL for tests and benchmarks: the server (``GPUROSTER_TEST_PG``, default
127.0.0.1:5432 with trust auth) and throw-away databases on it."""

from __future__ import annotations

import os
import uuid

from sqlalchemy import create_engine, text

PG_SERVER = os.environ.get("GPUROSTER_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


def _pg_admin_url() -> str:
    return PG_SERVER.replace("postgresql://", "postgresql+psycopg://", 1) + "/postgres"


def pg_available() -> str | None:
    """None if PostgreSQL answers, else the reason it does not."""
    try:
        eng = create_engine(_pg_admin_url(), connect_args={"connect_timeout": 3})
        with eng.connect() as c:
            c.execute(text("SELECT 1"))
        eng.dispose()
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "not available"
        return f"{e.__class__.__name__}: {e}".splitlines()[0]


def _create_pg_database() -> str:
    name = f"gpuroster_test_{uuid.uuid4().hex[:10]}"
    eng = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    eng.dispose()
    return name


def _drop_pg_database(name: str) -> None:
    eng = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    eng.dispose()
