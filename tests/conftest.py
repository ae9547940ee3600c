"""Shared fixtures: both databases, a migrated schema per test session, each test's
application in one transaction rolled back after it (or, for tests marked ``commits``, its
tables emptied after it).

Every test that touches the database takes ``db_url`` (directly or through ``app``/``client``)
and so runs twice: on SQLite and on PostgreSQL. PostgreSQL is expected on 127.0.0.1:5432
with trust auth (``GPUROSTER_TEST_PG`` overrides the server URL). Without it, those tests
skip with a loud reason on a laptop and fail under CI (``CI=true``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from testkit.pg import PG_SERVER, _create_pg_database, _drop_pg_database, _pg_admin_url, pg_available  # noqa: F401

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "corpus"


def require_pg() -> None:
    reason = pg_available()
    if reason is not None:
        msg = f"PostgreSQL not reachable at {PG_SERVER} ({reason})"
        if IN_CI:
            pytest.fail(msg + " — CI must run the PostgreSQL half of the suite")
        pytest.skip("SKIPPING POSTGRESQL TESTS: " + msg)


@pytest.fixture(autouse=True, scope="session")
def _cheap_password_hashing() -> Iterator[None]:
    """Passwords hashed in this process use argon2id at its lowest cost (64 KiB, one pass).

    The tests sign in and create users with passwords a few thousand times; at the
    production cost (about 30 ms a hash on this kind of machine) that is over a minute of
    the suite spent in argon2. Verification reads the cost from each stored hash, so the
    code paths are the same. Servers that tests start as processes keep the production
    cost, which ``tests/app/test_password_cost.py`` checks in a fresh interpreter.
    """
    import app.security as security
    from pwdlib import PasswordHash
    from pwdlib.hashers.argon2 import Argon2Hasher

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(security, "_hasher", PasswordHash((Argon2Hasher(memory_cost=64, time_cost=1, parallelism=1),)))
        mp.setattr(security, "_DUMMY", None)
        yield


@pytest.fixture(scope="session")
def _sqlite_url(tmp_path_factory) -> str:
    from app.migrate import upgrade

    path = tmp_path_factory.mktemp("db") / "gpuroster.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    return url


@contextmanager
def migrated_pg_database() -> Iterator[str]:
    """A new PostgreSQL database migrated to the head (its URL), dropped afterwards; skips
    (fails under CI) without PostgreSQL."""
    require_pg()
    from app.migrate import upgrade

    name = _create_pg_database()
    try:
        url = f"{PG_SERVER}/{name}"
        upgrade(url)
        yield url
    finally:
        _drop_pg_database(name)


@pytest.fixture(scope="session")
def _pg_url() -> Iterator[str]:
    with migrated_pg_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> Iterator[str]:
    """A migrated database URL, SQLite or PostgreSQL; tables that got rows are emptied after
    the test, and a test whose application was rolled back (see ``app``) fails if any had."""
    if request.param == "sqlite":
        url = request.getfixturevalue("_sqlite_url")
    else:
        url = request.getfixturevalue("_pg_url")
    yield url
    left = truncate_all(url)
    if left and rolled_back(request):
        pytest.fail(f"rows committed outside the test's rolled-back transaction, in {', '.join(left)}: "
                    "mark the test 'commits' if another connection must see its data", pytrace=False)


def rolled_back(request) -> bool:
    """Whether the test of ``request`` works in a transaction rolled back after it: it uses the
    application (``app``) and is not marked ``commits``."""
    return "app" in request.fixturenames and request.node.get_closest_marker("commits") is None


_cleaners: dict[str, "_TableCleaner"] = {}


class _TableCleaner:
    """Empties one test database between tests, touching only the tables that have rows.

    Most tests write to a handful of the schema's tables; ``TRUNCATE`` of all of them costs
    about 150 ms a test on PostgreSQL (each truncated table gets a new file) and a
    ``DELETE`` of every table about 28 ms on SQLite. One round trip finds the tables with
    rows; those are emptied children first (so foreign keys hold at every step). On
    PostgreSQL every identity sequence a test moved is restarted, as ``RESTART IDENTITY``
    did: sequences are not transactional, so a rolled-back test moves them too, and ids
    would otherwise depend on the tests run before. The engine is kept for the whole
    session, so no test pays for a new connection here.
    """

    _RESTART = text("SELECT setval(format('%I.%I', schemaname, sequencename)::regclass, 1, false)"
                    " FROM pg_sequences WHERE schemaname = 'public' AND last_value IS NOT NULL")

    def __init__(self, url: str) -> None:
        from app.config import normalize_database_url
        from app.models import Base

        self.engine = create_engine(normalize_database_url(url), pool_pre_ping=True)
        self.pg = self.engine.dialect.name == "postgresql"
        self.tables = [t.name for t in reversed(Base.metadata.sorted_tables)]  # children first
        self.probe = text(" UNION ALL ".join(
            f"SELECT {i} AS n WHERE EXISTS (SELECT 1 FROM \"{t}\")" for i, t in enumerate(self.tables)))

    def clean(self) -> list[str]:
        """Empty the tables that have rows; returns their names."""
        with self.engine.begin() as c:
            dirty = sorted(n for (n,) in c.execute(self.probe))  # keeps children-first order
            for i in dirty:
                c.execute(text(f'DELETE FROM "{self.tables[i]}"'))
            if self.pg:
                c.execute(self._RESTART)
        return [self.tables[i] for i in dirty]


def truncate_all(url: str) -> list[str]:
    """Empty every table of the test database at ``url`` (the schema and migrations stay);
    returns the names of the tables that had rows."""
    cleaner = _cleaners.get(url)
    if cleaner is None:
        cleaner = _cleaners[url] = _TableCleaner(url)
    return cleaner.clean()


@pytest.fixture
def settings(db_url, tmp_path):
    """The in-process app's settings. Its periodic jobs (expiry, waitlist round, check-in
    sweep, pruner) run no round during the test: each test that is about them calls its round
    itself (``sweep_once(app)`` ...), so no round runs unasked beside the requests a test
    makes, nor takes the SQLite write turn from them."""
    from app.config import Settings

    return Settings(database_url=db_url, data_dir=tmp_path, environment="test", timezone="Europe/Berlin",
                    base_url="http://testserver", background_start_delay_seconds=3600)


_engines: dict[tuple, object] = {}


def shared_engine(settings):
    """One engine per database and engine settings for the whole worker process, lent to
    each test's application (``create_app(engine=...)``). A new engine per test compiled
    every statement again (SQLAlchemy's compiled cache belongs to the engine): about a fifth
    of the CPU the in-process applications spent. Tests still get a new application each,
    with its own caches."""
    from app.db import build_engine

    key = (settings.sqlalchemy_url, settings.sqlite_busy_timeout_ms, settings.db_pool_size, settings.db_pool_overflow,
           settings.db_pool_timeout_seconds, settings.pgbouncer)
    engine = _engines.get(key)
    if engine is None:
        engine = _engines[key] = build_engine(settings)
    return engine


@pytest.fixture
def app(settings, request):
    """The application under test, on the worker's shared engine.

    Its sessions join one outer transaction on one connection (SQLAlchemy's
    ``join_transaction_mode="create_savepoint"``: a session's commit releases a savepoint),
    which is rolled back after the test, so each test starts from the empty schema by
    construction. One connection serves one thread at a time, and here it does: the test
    client sends one request at a time, the ``settings`` hold every periodic job back, and
    notices a commit queues are delivered in the committing thread (as
    :mod:`app.services.notices` does for a session bound to a connection).

    A test marked ``commits`` gets sessions of its own that really commit (emptied afterwards
    by ``db_url``): one whose data another connection or process must see (a live server, a
    CLI command, a second application, parallel requests), or one that counts statements.
    """
    from app.db import build_session_factory
    from app.main import create_app

    engine = shared_engine(settings)
    if not rolled_back(request):
        yield create_app(settings, engine=engine)
        return
    with engine.connect() as conn:
        outer = conn.begin()
        try:
            yield create_app(settings, engine=engine, session_factory=build_session_factory(conn))
        finally:
            outer.rollback()


@pytest.fixture
def client(app):
    """A synchronous httpx-based client driving the app in-process (lifespan included)."""
    from fastapi.testclient import TestClient

    with TestClient(app) as c:
        yield c


@pytest.fixture
def session_factory(app, client) -> sessionmaker[Session]:
    """The app's own session factory (available once the client started the lifespan)."""
    return app.state.session_factory


@dataclass
class Actor:
    username: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def make_user(session_factory):
    """``make_user(name, admin=False, unix_name=None, email=None, password=None) -> Actor``."""
    from app.db import run_in_transaction
    from app.services import users as user_service

    def _make(name: str, *, admin: bool = False, unix_name: str | None = None, email: str | None = None,
              password: str | None = None) -> Actor:
        def work(s):
            u = user_service.create_user(s, username=name, admin=admin, unix_name=unix_name, email=email, password=password)
            return user_service.create_api_token(s, user=u, name="test")[1]

        return Actor(name, run_in_transaction(session_factory, work))

    return _make


@pytest.fixture
def make_host(session_factory):
    """``make_host(name) -> Actor`` whose token is the host token."""
    from app.db import run_in_transaction
    from app.services import hosts as host_service

    def _make(name: str) -> Actor:
        return Actor(name, run_in_transaction(session_factory, lambda s: host_service.create_host(s, name=name)[1]))

    return _make


# seconds between snapshots announced by fixture hosts (a host is stale after about 3 of them)
FRESH_FOR = 600.0


def snapshot_body(host: str, seq: int, devices: list[dict], processes: list[dict] | None = None,
                  collected_at: datetime | None = None, **extra) -> dict:
    """A Snapshot JSON body for ``POST /api/v1/agent/snapshots``."""
    return {
        "host": host, "seq": seq, "collected_at": (collected_at or datetime.now(UTC)).isoformat(),
        "devices": devices, "processes": processes or [], **extra,
    }


def gpu(uuid: str, index: int, name: str = "NVIDIA A100-SXM4-80GB", **kw) -> dict:
    return {"uuid": uuid, "index": index, "name": name, "memory_total_mib": 81920, "pci_bus_id": f"00000000:{index + 1:02X}:00.0", **kw}


@pytest.fixture
def lab(client, make_user, make_host):
    """A small lab: admin ``root-admin``, members ``alice`` and ``bob``, host ``node-01`` with 4 GPUs."""
    admin = make_user("boss", admin=True)
    alice = make_user("alice")
    bob = make_user("bob")
    host = make_host("node-01")
    devices = [gpu(f"GPU-{i}{i}{i}{i}aaaa-0000-0000-0000-00000000000{i}", i) for i in range(4)]
    # a long interval: the host stays fresh however long a test runs on a loaded machine
    # (tests of staleness post their own snapshots or move last_seen_at)
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, devices, interval_seconds=FRESH_FOR),
                    headers=host.headers)
    assert r.status_code == 200, r.text
    return Lab(admin=admin, alice=alice, bob=bob, host=host, devices=[d["uuid"] for d in devices])


@dataclass
class Lab:
    admin: Actor
    alice: Actor
    bob: Actor
    host: Actor
    devices: list[str]


def future(hours: float = 24, *, base: datetime | None = None) -> datetime:
    """An instant ``hours`` from now (UTC), minute-aligned."""
    t = (base or datetime.now(UTC)) + timedelta(hours=hours)
    return t.replace(second=0, microsecond=0)


@contextmanager
def process_timezone(name: str) -> Iterator[str]:
    """Run with the process time zone ``TZ=name`` (restored afterwards): results must not depend on it."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield name
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


@contextmanager
def request_statements(engine, keep=lambda statement: True) -> Iterator[list[str]]:
    """The SQL statements (those ``keep`` accepts) that requests send through ``engine``
    while the block runs, in order. The app's background work (periodic rounds, the
    token-use flush: :func:`app.periodic.background_work`) runs at its own times, on a
    loaded machine in the middle of a request, so its statements are left out."""
    from sqlalchemy import event

    from app.periodic import background_work

    seen: list[str] = []

    def listen(conn, cursor, statement, params, context, executemany):  # noqa: ANN001
        if background_work() is None and keep(statement):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", listen)


def book(client, actor, devices, start, end=None, *, host="node-01", **extra):
    """POST /api/v1/reservations; ``start``/``end`` may be datetimes or strings (default length 1 h)."""
    body = {"host": host, "devices": devices, "start": start.isoformat() if isinstance(start, datetime) else start, **extra}
    if end is not None:
        body["end"] = end.isoformat() if isinstance(end, datetime) else end
    elif "duration" not in extra:
        body["duration"] = "PT1H"
    return client.post("/api/v1/reservations", json=body, headers=actor.headers)


def pytest_collection_modifyitems(config, items) -> None:
    """Files with end-to-end tests (marked ``slow`` or ``browser``) are collected first, in
    their order: a run in one process starts with them, and so would workers handed files in
    collection order (pytest-xdist ``--no-loadscope-reorder``). ``./test`` keeps xdist's own
    order, files with the most tests first, for the reason its comment gives.
    """
    heavy = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.path not in heavy)  # stable: the order inside each group is kept
