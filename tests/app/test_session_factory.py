"""Sessions from :func:`app.db.build_session_factory` bound to a connection that is already in
a transaction (as the test suite binds every application's) work inside savepoints."""

from __future__ import annotations

from sqlalchemy import func, select

from app.config import Settings
from app.db import build_engine, build_session_factory
from app.models import Group


def test_a_session_on_a_connection_in_a_transaction_commits_and_rolls_back_only_its_own_work(db_url, tmp_path):
    engine = build_engine(Settings(database_url=db_url, data_dir=tmp_path, environment="test"))
    try:
        with engine.connect() as conn:
            outer = conn.begin()
            factory = build_session_factory(conn)
            with factory() as s:
                s.add(Group(name="kept", description=""))
                s.commit()  # releases its savepoint: the row stays in the outer transaction
            with factory() as s:
                s.add(Group(name="dropped", description=""))
                s.flush()
                s.rollback()  # back to its savepoint, not the end of the owner's transaction
            assert outer.is_active
            assert conn.scalars(select(Group.name)).all() == ["kept"]
            outer.rollback()
            assert conn.scalar(select(func.count()).select_from(Group)) == 0
    finally:
        engine.dispose()
