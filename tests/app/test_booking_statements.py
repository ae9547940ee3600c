"""How many SQL statements one booking costs, per database, so that a regression shows.

The budgets are today's counts. A named booking: auth, host + devices + health (one
statement), the rules that apply (one), the conflict check (one), then the inserts; on
PostgreSQL the inserts sit inside a savepoint (the exclusion constraint's violation becomes
a 409), preceded by the per-GPU write lock (one statement for all devices), and the quota
lock is taken only when a counted limit applies.
"""

from __future__ import annotations

from sqlalchemy import event

from tests.conftest import book, future, gpu, snapshot_body

# (SQLite, PostgreSQL): statements of one request, BEGIN/SAVEPOINT included.
NAMED_BUDGET = {"sqlite": 8, "postgresql": 10}
NAMED_WITH_QUOTA_BUDGET = {"sqlite": 9, "postgresql": 12}  # + owner's reservations (+ quota lock)
PLACEMENT_BUDGET = {"sqlite": 11, "postgresql": 12}  # count=2: two rows on SQLite


def _quota_locks(seen: list[str]) -> int:
    """The quota lock's statements (the per-GPU write lock is the two-key form)."""
    return sum("pg_advisory_xact_lock" in s and "cls" not in s for s in seen)


def _gpu_locks(seen: list[str]) -> int:
    return sum("pg_advisory_xact_lock" in s and "cls" in s for s in seen)


def _statements(engine, fn) -> tuple[object, list[str]]:
    seen: list[str] = []

    def listen(conn, cursor, statement, params, context, executemany):
        seen.append(statement.split("\n", 1)[0][:120])

    event.listen(engine, "before_cursor_execute", listen)
    try:
        out = fn()
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    return out, seen


def test_named_booking_statement_count(app, client, lab):
    dialect = app.state.engine.dialect.name
    assert book(client, lab.alice, [lab.devices[0]], future(2)).status_code == 201  # warm caches
    r, seen = _statements(app.state.engine, lambda: book(client, lab.alice, [lab.devices[1]], future(2)))
    assert r.status_code == 201, r.text
    assert len(seen) <= NAMED_BUDGET[dialect], "\n".join(seen)
    # more devices add no read: only their rows (one statement each on SQLite, one in all on PostgreSQL)
    r, more = _statements(app.state.engine, lambda: book(client, lab.alice, [lab.devices[2], lab.devices[3]], future(2)))
    assert r.status_code == 201, r.text
    assert len(more) <= len(seen) + (1 if dialect == "sqlite" else 0), "\n".join(more)


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
