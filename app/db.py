"""Engine and session factory.

One engine per process, built by the application's lifespan (never at import time).
SQLite is tuned for a multi-process server: WAL journal, foreign keys on, a busy timeout,
and transactions begun by us (pysqlite's own implicit BEGIN is disabled) so that writers
can take the write lock up front with ``BEGIN IMMEDIATE`` (see :func:`lock_for_write`).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings

T = TypeVar("T")

WRITE_OPTION = "gpuroster_write"


def _pool_args(kwargs: dict[str, Any], settings: Settings, size: int) -> dict[str, Any]:
    """Queue pool sizing from settings (``size`` when ``db_pool_size`` is unset); arguments the
    caller passed win, and a caller's own ``poolclass`` gets none of them."""
    if "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", settings.db_pool_size or size)
        kwargs.setdefault("max_overflow", settings.db_pool_overflow)
        kwargs.setdefault("pool_timeout", settings.db_pool_timeout_seconds)
    return kwargs


def build_engine(settings: Settings, **kwargs: Any) -> Engine:
    """Create the engine for ``settings.sqlalchemy_url``.

    SQLite: WAL, ``foreign_keys=ON``, ``busy_timeout`` from settings, ``synchronous=NORMAL``;
    a transaction on a connection with the ``gpuroster_write`` execution option starts with
    ``BEGIN IMMEDIATE``. PostgreSQL: psycopg 3, pool pre-ping, UTC session time zone (or, behind PgBouncer,
    settings that survive transaction pooling: see :mod:`app.db_pooler`).
    """
    url = make_url(settings.sqlalchemy_url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            from pathlib import Path

            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": settings.sqlite_busy_timeout_ms / 1000},
            **_pool_args(kwargs, settings, 20),
        )
        busy = int(settings.sqlite_busy_timeout_ms)

        @event.listens_for(engine, "connect")
        def _sqlite_on_connect(dbapi_conn, _record):  # pragma: no cover - trivial
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={busy}")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):
            if conn.get_execution_options().get(WRITE_OPTION):
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.exec_driver_sql("BEGIN")

        return engine
    from app.db_pooler import pooler_mode, postgres_connect_args

    url, pooled = pooler_mode(settings, url)
    return create_engine(
        url,
        pool_pre_ping=True,
        connect_args=postgres_connect_args(pooled),
        **_pool_args(kwargs, settings, 10),
    )


def build_session_factory(engine: Engine | Connection) -> sessionmaker[Session]:
    """Sessions with ``expire_on_commit=False`` (objects stay readable after commit).

    Bound to a connection already in a transaction (the test suite's, rolled back after each
    test), a session works inside a savepoint: its commit releases it and its rollback
    returns to it, never ending the owner's transaction."""
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False, join_transaction_mode="create_savepoint")


def is_sqlite(session_or_engine: Session | Engine) -> bool:
    bind = session_or_engine.get_bind() if isinstance(session_or_engine, Session) else session_or_engine
    return bind.dialect.name == "sqlite"


_write_gates: weakref.WeakKeyDictionary[Engine, threading.Lock] = weakref.WeakKeyDictionary()
_gates_lock = threading.Lock()


@contextmanager
def write_gate(engine: Engine) -> Iterator[None]:
    """Serialise SQLite writers of this process on a Python lock, held for the whole write
    transaction (no-op on PostgreSQL).

    SQLite allows one writer; without the gate, the threads of one process contend for the
    file lock through SQLite's busy handler, which sleeps in steps of up to 100 ms, so
    latency collapses under load. With the gate, only one thread per process waits on the
    file lock; the others queue here, woken as soon as it is free.
    """
    if engine.dialect.name != "sqlite":
        yield
        return
    with _gates_lock:
        gate = _write_gates.get(engine)
        if gate is None:
            gate = _write_gates[engine] = threading.Lock()
    with gate:
        yield


def lock_for_write(session: Session) -> None:
    """Begin the session's transaction as a writer.

    Must be the first database use of the session. SQLite: ``BEGIN IMMEDIATE`` takes the
    database write lock before any conflict check is read (waiting up to the busy timeout).
    PostgreSQL: no-op; conflicts are refused by exclusion constraints and quotas by
    transaction-scoped advisory locks.
    """
    session.connection(execution_options={WRITE_OPTION: True})


@contextmanager
def transaction(factory: sessionmaker[Session], *, write: bool) -> Iterator[Session]:
    """A session in its own transaction, committed when the block ends and rolled back if it
    raises; ``write`` begins it as a writer (:func:`lock_for_write`). No retries: the block
    runs once (see :func:`run_in_transaction` for work that may be retried)."""
    with factory() as session:
        try:
            if write:
                lock_for_write(session)
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def advisory_xact_lock(session: Session, key: int) -> None:
    """Take a transaction-scoped PostgreSQL advisory lock (no-op on SQLite, already serialised)."""
    if not is_sqlite(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})


# Errors that mean the database could not be had: stopped, unreachable, every pooled connection
# in use past the pool timeout, SQLite's lock held past the busy timeout (answered 503 busy).
OUTAGE_ERRORS = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)
# PostgreSQL's conflicts between transactions: serialization failure, deadlock
TRANSACTION_CONFLICTS = frozenset({"40001", "40P01"})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error raised through SQLAlchemy (PostgreSQL), else ``None``."""
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else None
    return getattr(orig, "sqlstate", None) or getattr(getattr(orig, "diag", None), "sqlstate", None)


def is_retryable(exc: BaseException) -> bool:
    """True for transient database errors worth retrying: SQLite busy/locked, PostgreSQL
    serialization failure (40001) or deadlock (40P01)."""
    if isinstance(exc, DBAPIError):
        if sqlstate(exc) in TRANSACTION_CONFLICTS:
            return True
        if isinstance(exc, OperationalError):
            msg = str(exc.orig).lower()
            return "database is locked" in msg or "database is busy" in msg
    return False


def database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database could not be had at all (:data:`OUTAGE_ERRORS`),
    not that this transaction lost a conflict with another (:data:`TRANSACTION_CONFLICTS`):
    a next transaction started at once would meet the same."""
    return isinstance(exc, OUTAGE_ERRORS) and sqlstate(exc) not in TRANSACTION_CONFLICTS


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def run_in_transaction(
    factory: sessionmaker[Session], fn: Callable[[Session], T], *, write: bool = True, attempts: int = 8
) -> T:
    """Run ``fn(session)`` in its own transaction and commit; retry transient failures.

    Used for work outside a request (agent ingest in benchmarks, CLI admin commands).
    Raises the last error after ``attempts`` tries.
    """
    import random
    import time

    engine = factory.kw["bind"]
    for attempt in range(attempts):
        with factory() as session, (write_gate(engine) if write else _nothing()):
            try:
                if write:
                    lock_for_write(session)
                result = fn(session)
                session.commit()
                return result
            except Exception as e:
                session.rollback()
                if attempt + 1 < attempts and is_retryable(e):
                    time.sleep(min(0.5, 0.01 * 2**attempt) * random.random())
                    continue
                raise
    raise RuntimeError("unreachable")


class WriteTurnBusy(Exception):
    """This process's SQLite write turn did not come within the wait allowed: the writes queued
    ahead of the request (usually because another process holds the database's write lock)
    took too long. Nothing was written; answered 503 busy with ``Retry-After``."""


@asynccontextmanager
async def write_turn(app: Any, *, wait: float | None) -> AsyncIterator[None]:
    """Hold this process's SQLite write turn (see :func:`write_gate_for`) for the block; a no-op
    on PostgreSQL. ``wait``: the most seconds to queue for it (``None``: as long as it takes,
    for background work that no client waits on).

    Raises :class:`WriteTurnBusy` when ``wait`` passes first. Without a bound, a queue of
    requests behind a writer that itself waits out SQLite's busy timeout (another process holds
    the lock) would each wait for all those ahead of it: clients saw answers after a minute.
    """
    gate = write_gate_for(app)
    if gate is None:
        yield
        return
    try:
        async with asyncio.timeout(wait):
            await gate.acquire()
    except TimeoutError:
        raise WriteTurnBusy(f"no write turn within {wait:g} s: other writes hold the database") from None
    try:
        yield
    finally:
        gate.release()


def request_write_wait(settings: Settings) -> float:
    """The most seconds a request queues for its write turn: SQLite's own busy timeout, so a
    request waits for its turn no longer than its turn may wait for the database's lock."""
    return settings.sqlite_busy_timeout_ms / 1000


def write_gate_for(app: Any) -> asyncio.Lock | None:
    """This process's SQLite write turn (an asyncio lock), ``None`` on PostgreSQL. One lock per
    running event loop: a server has one loop, but a lock touched from two loops (test clients
    that each run their own) raises "bound to a different event loop"."""
    gates = getattr(app.state, "write_gates", None)
    if gates is None:
        return None
    loop = asyncio.get_running_loop()
    gate = gates.get(loop)
    if gate is None:
        gate = gates[loop] = asyncio.Lock()
    return gate
