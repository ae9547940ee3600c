"""Growth: the hot queries stay on indexes when history is large (PostgreSQL).

History is seeded in bulk (``generate_series``, ``testkit.history``): past reservations of many
users on the host's devices, cancelled ones among them; per-minute usage rollups of its GPUs
(weeks of them); 90 days of ended findings. Then the real requests run (a named booking with
a counted quota, an "any N GPUs" booking, the device list, the Now page, an agent snapshot with
processes (it writes rollups) answered with the host's reservation table, what a batch of
snapshots reads once for all its hosts, ``/metrics``, the usage
report (API and page), the findings list and its filters), then one round of each periodic
job (expiry of pending reservations, the check-in sweep, the waitlist round, the history pruner),
while every SELECT they issue is captured, and each is ``EXPLAIN``-ed with its own parameters: a sequential scan of a large
table fails the test, and so does a nested loop that scans a large table again for every
outer row. The holders' reads are also checked on statistics taken before the live
reservations were booked (what makes the planner pick such a loop).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from testkit.history import SEED, SEED_FINDINGS, SEED_ROLLUPS
from tests.conftest import future, gpu, migrated_pg_database, snapshot_body

pytestmark = [pytest.mark.slow, pytest.mark.commits]

HISTORY = 120_000  # past reservations; enough that the planner prefers an index where one fits
ROLLUPS = 300_000  # per-minute usage rollups: 8 GPUs, a row a minute for 26 days
FINDINGS_DAYS, FINDINGS_PER_DAY = 90, 1000  # ended findings: a lab's 90 days
LARGE_TABLES = {"reservations", "reservation_devices", "audit_log", "usage_rollups", "findings"}
N_USERS = 20



def _seq_scans(plan: dict) -> list[str]:
    out = []
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") in LARGE_TABLES:
        out.append(plan["Relation Name"])
    for child in plan.get("Plans", []):
        out += _seq_scans(child)
    return out


_CONDITIONS = ("Index Cond", "Recheck Cond", "Filter", "Hash Cond", "Merge Cond", "Join Filter")
_ONCE = {"Materialize", "Hash", "Sort"}  # an inner side under one of these runs once, not per outer row


def _subtree(plan: dict) -> list[dict]:
    return [plan] + [n for child in plan.get("Plans", []) for n in _subtree(child)]


def _per_row_range_scans(plan: dict) -> list[str]:
    """Large tables a nested loop scans once per outer row *without* the outer row's key: a
    range of an index (or the table) read again and again, so the cost is the product of the
    two sides. PostgreSQL picks it when stale statistics estimate one row on each side (the
    instant compared is past what was analysed); an inner side keyed by the outer row (its
    condition names another relation's column) is a lookup and is fine."""
    out = []
    if plan.get("Node Type") == "Nested Loop" and len(plan.get("Plans", [])) == 2:
        inner = plan["Plans"][1]
        if inner.get("Node Type") not in _ONCE:
            nodes = _subtree(inner)
            aliases = {n.get("Alias") for n in nodes if n.get("Alias")}
            conds = " ".join(n.get(k, "") for n in nodes for k in _CONDITIONS)
            refs = set(re.findall(r"\b([A-Za-z_]\w*)\.[A-Za-z_]\w*", re.sub(r"'[^']*'", "''", conds)))
            keyed = bool(refs - aliases)
            large = sorted({n["Relation Name"] for n in nodes if n.get("Relation Name") in LARGE_TABLES})
            if large and not keyed:
                out += large
    for child in plan.get("Plans", []):
        out += _per_row_range_scans(child)
    return out


@pytest.fixture(scope="module")
def seeded_pg():
    with migrated_pg_database() as url:
        yield url


def test_hot_queries_never_scan_large_tables_sequentially(seeded_pg, tmp_path):
    from app.api.approvals import expire_once
    from app.api.checkin import sweep_once
    from app.api.reports import prune_once
    from app.config import Settings
    from app.db import run_in_transaction
    from app.main import create_app
    from app.services import hosts as host_service
    from app.services import users as user_service
    from app.services.waitlist_serving import serve_round
    from app.web import sessions as web_sessions

    app = create_app(Settings(database_url=seeded_pg, data_dir=tmp_path, environment="test"))
    with TestClient(app) as client:
        factory = app.state.session_factory

        def setup(s):
            admin = user_service.create_user(s, username="boss", admin=True)
            toks = [user_service.create_api_token(s, user=admin, name="t")[1]]
            for i in range(N_USERS):
                u = user_service.create_user(s, username=f"user{i:02d}")
                toks.append(user_service.create_api_token(s, user=u, name="t")[1])
            user_service.create_user(s, username="watcher", password="watcher-password")
            return toks, host_service.create_host(s, name="node-01")[1]

        tokens, host_token = run_in_transaction(factory, setup)
        admin_h, user_h = ({"Authorization": f"Bearer {t}"} for t in tokens[:2])
        host_h = {"Authorization": f"Bearer {host_token}"}
        devices = [gpu(f"GPU-{i:08d}-plan-0000-0000-000000000000", i) for i in range(8)]
        first_at = datetime.now(UTC)
        assert client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, devices, collected_at=first_at),
                           headers=host_h).status_code == 200
        with app.state.engine.begin() as c:
            host_id = c.scalar(text("SELECT id FROM hosts WHERE name = 'node-01'"))
            c.execute(SEED, {"host_id": host_id, "n": HISTORY, "base": datetime.now(UTC)})
            # and bookings weeks ahead, as labs make them: the planner's estimate of the rows that
            # end after now then spans the whole last histogram bucket, which once sent the
            # holders' join through every past reservation
            c.execute(SEED, {"host_id": host_id, "n": 800, "base": datetime.now(UTC) + timedelta(days=60)})
            # rollups up to the minute before the first snapshot's, findings of 90 days
            c.execute(SEED_ROLLUPS, {"lo": 0, "hi": ROLLUPS, "n": ROLLUPS, "base": first_at})
            c.execute(SEED_FINDINGS, {"host_id": host_id, "days": FINDINGS_DAYS, "per_day": FINDINGS_PER_DAY,
                                      "base": first_at})
            # the audit log's history: what /metrics counts one action of
            c.execute(text("INSERT INTO audit_log (at, actor, action, target) SELECT now(), 'system', 'host.update', "
                           "'host:node-01' FROM generate_series(1, :n)"), {"n": HISTORY})
            for t in LARGE_TABLES:
                c.execute(text(f"ANALYZE {t}"))
            assert c.scalar(text("SELECT count(*) FROM reservation_devices")) >= HISTORY
            assert c.scalar(text("SELECT count(*) FROM usage_rollups")) >= ROLLUPS
            assert c.scalar(text("SELECT count(*) FROM findings")) == FINDINGS_DAYS * FINDINGS_PER_DAY
        assert client.post("/api/v1/rules", json={"scope": "default", "max_devices": 4, "max_gpu_hours_7d": 1000},
                           headers=admin_h).status_code == 201

        signed = run_in_transaction(factory, lambda s: web_sessions.sign_in(
            s, username="watcher", password="watcher-password", address="127.0.0.1", settings=app.state.settings,
            now=datetime.now(UTC)))
        client.cookies.set(web_sessions.SESSION_COOKIE, signed.cookie_value)
        captured: list[tuple[str, object]] = []

        def listen(conn, cursor, statement, params, context, executemany):
            if statement.lstrip().upper().startswith("SELECT") and "pg_advisory" not in statement:
                captured.append((statement, params))

        event.listen(app.state.engine, "before_cursor_execute", listen)
        try:
            r = client.post("/api/v1/reservations", headers=user_h, json={
                "host": "node-01", "devices": [0], "start": future(2).isoformat(), "duration": "PT1H"})
            assert r.status_code == 201, r.text
            r = client.post("/api/v1/reservations", headers=user_h, json={
                "count": 2, "start": future(5).isoformat(), "duration": "PT1H"})
            assert r.status_code == 201, r.text
            r = client.post("/api/v1/reservations", headers=user_h, json={  # a conflict: the 409's details
                "host": "node-01", "devices": [0], "start": future(2).isoformat(), "duration": "PT1H"})
            assert r.status_code == 409, r.text
            assert client.get("/api/v1/devices", headers=user_h).status_code == 200
            assert client.get("/api/v1/devices", headers=user_h).status_code == 200  # the cached list's keys
            assert client.get("/metrics").status_code == 200  # holders, quarantines, the refused-bookings count
            for page in ("/", "/?all=1"):  # the Now page: its state and holders from plain rows
                r = client.get(page)
                assert r.status_code == 200 and "GPU-00000000-plan" in r.text, r.text[:300]
            assert client.get("/api/v1/reservations?state=active", headers=user_h).status_code == 200
            procs = [{"device_uuid": devices[i]["uuid"], "pid": 4000 + i, "unix_user": "user00", "uid": 2000,
                      "used_memory_mib": 30000.0, "name": "python"} for i in range(2)]
            busy = [{**d, "memory_used_mib": 30000.0, "utilization_gpu": 90.0} for d in devices]
            r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, busy, procs), headers=host_h)
            assert r.status_code == 200 and r.json()["reservations"], r.text

            def batch_reads(s):  # what a batch of snapshots reads once for all of its hosts
                from agent.schema import Snapshot
                from app.services import ingest_state

                (host,) = host_service.hosts_for_tokens(s, [host_token]).values()
                snap = Snapshot.model_validate(snapshot_body("node-01", 3, busy, procs))
                rows = ingest_state.batch_rows(s, [host.id], ingest_state.snapshot_uuids(snap), datetime.now(UTC))
                assert rows.acks[host.id].table

            run_in_transaction(factory, batch_reads)
            # the usage report reads the rollups of the reserved devices over its period
            assert client.get("/api/v1/reports/usage", headers=user_h).status_code == 200
            assert client.get("/api/v1/reports/usage?user=user01", headers=admin_h).status_code == 200
            assert client.get("/reports/usage").status_code == 200
            # the filters that narrow the list (one state, one host: nearly all of these findings)
            for query in ("", "?user=user03", f"?since={future(-48).isoformat()}".replace("+", "%2B"),
                          "?kind=overrun&user=user05"):
                r = client.get(f"/api/v1/findings{query}", headers=admin_h)
                assert r.status_code == 200 and r.json()["total"], (query, r.text[:300])
            # the rounds the service repeats every minute or so, whatever the requests: each
            # reads the whole history's live part (pending past their start, holders due a
            # check-in, waitlist entries, rollups past retention)
            for work in (expire_once, sweep_once, serve_round, prune_once):
                work(app)
        finally:
            event.remove(app.state.engine, "before_cursor_execute", listen)
        assert len(captured) > 10

        bad = []
        # Known and left as it is: /metrics' total of reservations counts every row, which no
        # index spares on PostgreSQL (a count of a whole table reads all of it).
        # Likewise /metrics' findings by kind (a count of every finding ever reported) and the
        # findings list's total when no filter narrows it (the count of a whole table).
        whole_counts = ("SELECT count(*) AS count_1 FROM reservations",
                        "SELECT findings.kind, count(*) AS count_1 FROM findings GROUP BY findings.kind")

        def whole_count(st: str) -> bool:
            flat = " ".join(st.split())
            return flat in whole_counts or (flat.startswith("SELECT count(*) AS count_1 FROM (SELECT findings.id")
                                            and flat.endswith("FROM findings) AS anon_1"))

        captured = [(st, p) for st, p in captured if not whole_count(st)]
        bad = _plan_faults(app.state.engine, captured)
        assert not bad, "large tables read in full or again per row:\n" + "\n\n".join(bad)


def _plan_faults(engine, captured: list[tuple[str, object]]) -> list[str]:
    """Each captured SELECT ``EXPLAIN``-ed with its own parameters: its sequential scans of a
    large table and its large tables scanned once per outer row, named."""
    bad = []
    with engine.connect() as c:
        raw = c.connection.dbapi_connection
        with raw.cursor() as cur:
            for statement, params in captured:
                cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
                plan = cur.fetchone()[0]
                plan = json.loads(plan) if isinstance(plan, str) else plan
                scans = _seq_scans(plan[0]["Plan"])
                if scans:
                    bad.append(f"sequential scan of {scans}: {statement[:300]}")
                repeated = _per_row_range_scans(plan[0]["Plan"])
                if repeated:
                    bad.append(f"{repeated} scanned once per outer row: {statement[:300]}")
    return bad


def test_holders_are_read_by_key_when_statistics_are_stale(tmp_path):
    """The reads of live reservations (the device list, /metrics, Now, bookings with counted
    quotas, the agent's acknowledgement, the periodic rounds) on a database analysed while no
    reservation was live, then given 900 live ones: the planner's statistics estimate one row
    that has not ended on each side. The reads must still reach each reserved device's
    reservation by its key, never by scanning a range of reservations once per row (20x
    slower at 900 rows, and growing with their square) nor the history."""
    from app.config import Settings
    from app.db import run_in_transaction
    from app.main import create_app
    from app.api.approvals import expire_once
    from app.api.checkin import sweep_once
    from app.services import rule_admin
    from app.services import users as user_service
    from app.services.waitlist_serving import serve_round
    from app.web.now import now_view

    with migrated_pg_database() as url:
        app = create_app(Settings(database_url=url, data_dir=tmp_path, environment="test"))
        with TestClient(app) as client:
            from app.services import hosts as host_service

            def setup(s):
                for i in range(N_USERS):
                    user_service.create_user(s, username=f"user{i:02d}")
                boss = user_service.create_user(s, username="boss", admin=True)
                rule_admin.create_rule(s, scope="default", user=None, group=None, actor=boss,  # quotas count usage
                                       values={"max_devices": 4, "max_gpu_hours_7d": 1000})
                token = user_service.create_api_token(s, user=user_service.create_user(s, username="reader"), name="t")[1]
                return token, host_service.create_host(s, name="node-01")[1]

            token, host_token = run_in_transaction(app.state.session_factory, setup)
            devices = [gpu(f"GPU-{i:08d}-stale-0000-0000-000000000000", i) for i in range(8)]
            assert client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, devices),
                               headers={"Authorization": f"Bearer {host_token}"}).status_code == 200
            now = datetime.now(UTC)
            with app.state.engine.begin() as c:
                host_id = c.scalar(text("SELECT id FROM hosts WHERE name = 'node-01'"))
                c.execute(SEED, {"host_id": host_id, "n": 20_000, "base": now})  # history, all ended
                # The estimate of the rows ending after an instant past the analysed values is
                # about one histogram bucket: with a bucket for every two rows, two rows, as a
                # lab's years of history give with the default buckets
                for t in ("reservations", "reservation_devices"):
                    c.execute(text(f"ALTER TABLE {t} ALTER COLUMN end_at SET STATISTICS 10000"))
                for t in ("reservations", "reservation_devices", "users"):
                    c.execute(text(f"ANALYZE {t}"))
                # then bookings for the weeks ahead, after the statistics were taken
                c.execute(SEED, {"host_id": host_id, "n": 900, "base": now + timedelta(days=60)})
            captured: list[tuple[str, object]] = []

            def listen(conn, cursor, statement, params, context, executemany):
                if statement.lstrip().upper().startswith("SELECT") and "reservations" in statement:
                    captured.append((statement, params))

            event.listen(app.state.engine, "before_cursor_execute", listen)
            try:
                assert client.get("/api/v1/devices", headers={"Authorization": f"Bearer {token}"}).status_code == 200
                assert client.get("/metrics").status_code == 200
                with app.state.session_factory() as s:
                    now_view(s, now=datetime.now(UTC))
                # and what else reads the live reservations: bookings (conflicts, quotas,
                # placement), the agent's acknowledgement, the periodic rounds
                r = client.post("/api/v1/reservations", headers={"Authorization": f"Bearer {token}"}, json={
                    "host": "node-01", "devices": [0], "start": future(2).isoformat(), "duration": "PT1H"})
                assert r.status_code == 201, r.text
                r = client.post("/api/v1/reservations", headers={"Authorization": f"Bearer {token}"}, json={
                    "count": 2, "start": future(5).isoformat(), "duration": "PT1H"})
                assert r.status_code == 201, r.text
                assert client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, devices),
                                   headers={"Authorization": f"Bearer {host_token}"}).status_code == 200
                for work in (expire_once, sweep_once, serve_round):
                    work(app)
            finally:
                event.remove(app.state.engine, "before_cursor_execute", listen)
            assert any("reservation_devices.end_at >" in st for st, _ in captured), captured
            bad = _plan_faults(app.state.engine, [(st, p) for st, p in captured if "count(*)" not in st])
            assert not bad, "\n\n".join(bad)
