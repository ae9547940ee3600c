"""How many SQL statements one booking costs, per database, so that a regression shows.

The budgets are today's counts. A named booking: auth, host + devices + health (one
statement), the rules that apply (one), the conflict check (one), then the inserts (the
reservation, all its devices' rows in one executemany, the audit entry); on
PostgreSQL the inserts sit inside a savepoint (the exclusion constraint's violation becomes
a 409), preceded by the per-GPU write lock (one statement for all devices), and the quota
lock is taken only when a counted limit applies.
"""

from __future__ import annotations

import pytest

from tests.conftest import book, future, gpu, request_statements, snapshot_body

# (SQLite, PostgreSQL): statements of one request, BEGIN/SAVEPOINT included.
NAMED_BUDGET = {"sqlite": 8, "postgresql": 10}
NAMED_WITH_QUOTA_BUDGET = {"sqlite": 9, "postgresql": 12}  # + owner's reservations (+ quota lock)
PLACEMENT_BUDGET = {"sqlite": 10, "postgresql": 12}  # count=2: both rows in one executemany


def _quota_locks(seen: list[str]) -> int:
    """The quota lock's statements (the per-GPU write lock is the two-key form)."""
    return sum("pg_advisory_xact_lock" in s and "cls" not in s for s in seen)


def _gpu_locks(seen: list[str]) -> int:
    return sum("pg_advisory_xact_lock" in s and "cls" in s for s in seen)


def _statements(engine, fn) -> tuple[object, list[str]]:
    with request_statements(engine) as seen:
        out = fn()
    return out, [s.split("\n", 1)[0][:120] for s in seen]


@pytest.mark.commits  # counts every statement: the test transaction's savepoints would add to them
def test_named_booking_statement_count(app, client, lab):
    dialect = app.state.engine.dialect.name
    assert book(client, lab.alice, [lab.devices[0]], future(2)).status_code == 201  # warm caches
    r, seen = _statements(app.state.engine, lambda: book(client, lab.alice, [lab.devices[1]], future(2)))
    assert r.status_code == 201, r.text
    assert len(seen) <= NAMED_BUDGET[dialect], "\n".join(seen)
    # more devices add no statement: their rows are one executemany
    r, more = _statements(app.state.engine, lambda: book(client, lab.alice, [lab.devices[2], lab.devices[3]], future(2)))
    assert r.status_code == 201, r.text
    assert len(more) <= len(seen), "\n".join(more)


def test_a_refused_booking_reads_its_conflicts_once(app, client, lab):
    """The 409 is written from the conflicts the check found, not from a second read of them."""
    assert book(client, lab.alice, [lab.devices[0]], future(2)).status_code == 201
    with request_statements(app.state.engine) as seen:
        r = book(client, lab.bob, [lab.devices[0]], future(2))
    assert r.status_code == 409, r.text
    flat = [" ".join(st.split()) for st in seen]
    conflict_reads = [st for st in flat if st.startswith("SELECT reservations.") and "WHERE reservations.id IN" in st]
    assert len(conflict_reads) == 1, "\n".join(flat)


@pytest.mark.commits  # counts every statement: the test transaction's savepoints would add to them
def test_named_booking_with_a_quota_counts_once_and_locks_once(app, client, lab):
    dialect = app.state.engine.dialect.name
    r = client.post("/api/v1/rules", json={"scope": "default", "max_devices": 3}, headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    r, seen = _statements(app.state.engine, lambda: book(client, lab.alice, [lab.devices[1]], future(2)))
    assert r.status_code == 201, r.text
    assert len(seen) <= NAMED_WITH_QUOTA_BUDGET[dialect], "\n".join(seen)
    assert _quota_locks(seen) == _gpu_locks(seen) == (1 if dialect == "postgresql" else 0)
    # the quota still holds: 3 devices at once is the limit
    assert book(client, lab.alice, [lab.devices[2], lab.devices[3]], future(2)).status_code == 201
    assert book(client, lab.alice, [lab.devices[0]], future(2)).status_code == 403


def test_no_quota_lock_without_a_counted_limit(app, client, lab):
    r = client.post("/api/v1/rules", json={"scope": "default", "max_duration_seconds": 86400}, headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    r, seen = _statements(app.state.engine, lambda: book(client, lab.alice, [lab.devices[1]], future(2)))
    assert r.status_code == 201, r.text
    assert _quota_locks(seen) == 0
    assert book(client, lab.alice, [lab.devices[2]], future(2), duration="P2D").status_code == 403


@pytest.mark.commits  # counts every statement: the test transaction's savepoints would add to them
def test_placement_statement_count_does_not_grow_with_devices(app, client, lab, make_host):
    dialect = app.state.engine.dialect.name
    big = make_host("node-02")
    devices = [gpu(f"GPU-{i:08d}-bbbb-0000-0000-000000000000", i) for i in range(32)]
    procs = [{"pid": 100 + i, "device_uuid": devices[i]["uuid"], "used_memory_mib": 500, "unix_user": "bob", "uid": 1001}
             for i in range(4)]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-02", 1, devices, procs), headers=big.headers)
    assert r.status_code == 200, r.text
    body = {"count": 2, "start": future(3).isoformat(), "duration": "PT1H"}
    r, seen = _statements(app.state.engine, lambda: client.post("/api/v1/reservations", json=body, headers=lab.alice.headers))
    assert r.status_code == 201, r.text
    assert len(seen) <= PLACEMENT_BUDGET[dialect], "\n".join(seen)
    # idle devices are preferred over those with a compute process (read in the same statement)
    got = {d["uuid"] for d in r.json()["devices"]}
    assert not got & {d["uuid"] for d in devices[:4]}


def _statements_built(fn) -> tuple[object, list[str]]:
    """``fn()`` and the SQL statements whose cache key SQLAlchemy computed while it ran: one
    built anew for the call (rather than once, with bound parameters) is hashed every time."""
    from sqlalchemy.sql.cache_key import HasCacheKey
    from sqlalchemy.sql.elements import ReleaseSavepointClause, SavepointClause

    from app.periodic import background_work

    built: list[str] = []
    original = HasCacheKey._generate_cache_key

    def counting(self):
        # SavepointClause: SQLAlchemy's own, one per savepoint; background rounds run at their own times
        if not isinstance(self, (SavepointClause, ReleaseSavepointClause)) and background_work() is None:
            built.append(f"{type(self).__name__}: {str(self)[:100]}")
        return original(self)

    HasCacheKey._generate_cache_key = counting
    try:
        return fn(), built
    finally:
        HasCacheKey._generate_cache_key = original


def test_a_named_booking_builds_no_statement_after_the_first(app, client, lab):
    """Authentication, device resolution, the rules, the conflict check and the inserts run
    statements built once per process (building and hashing one anew cost more CPU than the
    database spent running it). One device: the ORM inserts several reservation_devices rows
    with a RETURNING statement it derives anew for each flush."""
    for i in range(2):  # the first bookings build and cache every statement of the path
        assert book(client, lab.alice, [lab.devices[i]], future(2)).status_code == 201
    r, built = _statements_built(lambda: book(client, lab.alice, [lab.devices[2]], future(2)))
    assert r.status_code == 201, r.text
    assert built == [], "\n".join(built)


def test_every_server_default_has_a_python_default():
    """The ORM never asks a row's server defaults back (``eager_defaults=False`` on the base,
    which keeps each INSERT one cached statement), so every column with a server default
    must have a Python default that the ORM sends instead."""
    from app.models import Base

    alone = [f"{t.name}.{c.name}" for t in Base.metadata.tables.values() for c in t.columns
             if c.server_default is not None and c.default is None]
    assert alone == []


def test_a_booking_is_one_hand_off_to_the_thread_pool(client, lab, monkeypatch):
    """The session's start and end, the user's token and the route run in one worker-thread
    hand-off (each hand-off wakes the event loop and a thread: it cost more CPU than the
    conflict check). A refused booking adds one: the conflict counter's own transaction,
    written after the booking's is rolled back."""
    import anyio.to_thread

    real = anyio.to_thread.run_sync
    calls: list[str] = []

    async def counted(func, *args, **kwargs):
        calls.append(getattr(func, "__qualname__", repr(func)))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    r = book(client, lab.alice, [lab.devices[0]], future(2))
    assert r.status_code == 201, r.text
    assert len(calls) == 1, calls
    calls.clear()
    r = book(client, lab.bob, [lab.devices[0]], future(2))
    assert r.status_code == 409, r.text
    assert len(calls) == 2 and "record" in calls[1], calls


def test_a_booking_without_credentials_is_401_whatever_its_body(client, lab):
    """Signing in is what such a client needs to hear first, not what is wrong with its body."""
    for body in ({"host": "node-01", "devices": [0], "start": future(2).isoformat(), "duration": "PT1H"},
                 {"host": "node-01", "start": "not a time"}, {}):
        r = client.post("/api/v1/reservations", json=body)
        assert r.status_code == 401, (body, r.text)
    r = client.post("/api/v1/reservations", json={}, headers={"Authorization": "Basic abc"})
    assert r.status_code == 401, r.text
