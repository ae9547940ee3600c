"""B21: no double booking under concurrency, over real HTTP, on both databases.

PostgreSQL: two ``gpuroster serve`` processes share one database; SQLite: one server with
several threads (the lock is the database file's). The verdict comes from SQL: a self-join
over reservation_devices finds no overlapping active pair.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.config import normalize_database_url
from tests.conftest import future, gpu, snapshot_body
from testkit.live import gpuroster_env, live_server

pytestmark = pytest.mark.commits  # parallel clients, each request on its own connection

# Seconds a client waits for an answer. These tests judge what is written (no overlap, no 5xx),
# not latency: a request waits at most the busy timeout (30 s) for a write turn or a pooled
# connection before its 503. A request still unanswered after this long fails the test with
# the database's sessions (what each waits on), before the suite's own timeout (300 s) would
# stop the test with nothing but thread stacks.
ANSWER_TIMEOUT = 200

SESSIONS = text(
    """
    SELECT pid, state, wait_event_type, wait_event, now() - xact_start AS in_transaction,
           now() - state_change AS in_state, left(query, 200) AS query
      FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
     ORDER BY xact_start NULLS LAST
    """
)

OVERLAPS = text(
    """
    SELECT count(*) FROM reservation_devices a JOIN reservation_devices b
      ON a.id < b.id AND a.active AND b.active AND a.start_at < b.end_at AND b.start_at < a.end_at
     AND (a.device_id = b.device_id OR (a.physical_id = b.physical_id AND a.slice_kind <> b.slice_kind))
    """
)


def _setup(env, n_users: int, n_devices: int) -> tuple[list[str], list[str], str]:
    """Users with tokens and a host, created in-process (the CLI path is covered elsewhere)."""
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.migrate import upgrade
    from app.services import hosts as host_service
    from app.services import users as user_service

    upgrade(env["GPUROSTER_DATABASE_URL"])
    engine = build_engine(Settings(database_url=env["GPUROSTER_DATABASE_URL"]))
    factory = build_session_factory(engine)

    def work(s):
        tokens = []
        for i in range(n_users):
            u = user_service.create_user(s, username=f"user{i:02d}")
            tokens.append(user_service.create_api_token(s, user=u)[1])
        return tokens, host_service.create_host(s, name="node-01")[1]

    tokens, host_token = run_in_transaction(factory, work)
    engine.dispose()
    uuids = [f"GPU-{i:08d}-race-0000-0000-000000000000" for i in range(n_devices)]
    return tokens, uuids, host_token


def _register_devices(url: str, host_token: str, uuids: list[str]) -> None:
    body = snapshot_body("node-01", 1, [gpu(u, i) for i, u in enumerate(uuids)])
    r = httpx.post(url + "/api/v1/agent/snapshots", json=body, headers={"Authorization": f"Bearer {host_token}"})
    assert r.status_code == 200, r.text


def _sessions(db_url: str) -> str:
    """The database's other sessions, one a line (PostgreSQL), or a note that SQLite has none."""
    if not db_url.startswith("postgresql"):
        return "(SQLite: no session view)"
    return "\n".join(" | ".join(str(v) for v in row) for row in _rows(db_url, SESSIONS)) or "(none)"


def _post_until_answered(client: httpx.Client, url: str, db_url: str, **kw) -> httpx.Response:
    """POST as a well-behaved client does: a 503 busy (every connection of that server in use,
    or the database locked past its timeout) is retried after its ``Retry-After``; nothing was
    written for it. Any other answer is returned. A busy answer that is not a problem document
    with ``Retry-After`` fails the test, and so does a request with no answer in
    ``ANSWER_TIMEOUT`` seconds, naming what the database's sessions wait on."""
    for _ in range(30):
        try:
            r = client.post(url, **kw)
        except httpx.TimeoutException as e:
            pytest.fail(f"no answer to POST {url} in {ANSWER_TIMEOUT} s ({e!r}); database sessions:\n{_sessions(db_url)}")
        if r.status_code != 503:
            return r
        assert r.json()["type"] == "/problems/busy" and r.headers["Retry-After"], r.text
        time.sleep(float(r.headers["Retry-After"]))
    return r


def _rows(db_url: str, sql) -> list:
    """The rows of ``sql``, read on a connection of its own (the servers' engines are theirs)."""
    eng = create_engine(normalize_database_url(db_url))
    with eng.connect() as c:
        rows = c.execute(sql).all()
    eng.dispose()
    return rows


def _count(db_url: str, sql) -> int:
    (n,), = _rows(db_url, sql)
    return n


@pytest.mark.slow
def test_b21_twenty_parallel_requests_one_201(db_url, tmp_path):
    env = gpuroster_env(db_url, tmp_path)
    tokens, uuids, host_token = _setup(env, 20, 1)
    start = future(72)
    body = {"host": "node-01", "devices": [uuids[0]], "start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()}
    with live_server(env, migrate=False) as url_a, live_server(env, migrate=False) as url_b:
        _register_devices(url_a, host_token, uuids)

        def post(i: int) -> httpx.Response:
            url = url_a if i % 2 == 0 else url_b
            with httpx.Client(timeout=ANSWER_TIMEOUT) as client:
                return _post_until_answered(client, url + "/api/v1/reservations", db_url, json=body,
                                            headers={"Authorization": f"Bearer {tokens[i]}"})

        with ThreadPoolExecutor(max_workers=20) as pool:
            responses = list(pool.map(post, range(20)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] + [409] * 19, [(r.status_code, r.text[:200]) for r in responses if r.status_code not in (201, 409)]
    winner = next(r for r in responses if r.status_code == 201).json()
    assert _count(db_url, text("SELECT count(*) FROM reservations")) == 1
    assert _count(db_url, text(f"SELECT count(*) FROM reservations WHERE id = {int(winner['id'])}")) == 1
    for r in responses:
        if r.status_code == 409:
            assert r.json()["conflicts"][0]["id"] == winner["id"]


@pytest.mark.slow
def test_b21_heavy_64_clients_8_devices_no_overlap_no_500(db_url, tmp_path):
    env = gpuroster_env(db_url, tmp_path)
    tokens, uuids, host_token = _setup(env, 8, 8)
    base = future(96)
    rng = random.Random(21)
    attempts = []
    for i in range(320):
        k = rng.randint(1, 3)
        devs = rng.sample(uuids, k)
        s = base + timedelta(minutes=15 * rng.randint(0, 40))
        attempts.append((i, devs, s, s + timedelta(minutes=15 * rng.randint(1, 8))))
    with live_server(env, migrate=False, log=tmp_path / "a.log") as url_a, live_server(env, migrate=False, log=tmp_path / "b.log") as url_b:
        _register_devices(url_a, host_token, uuids)
        clients = [httpx.Client(base_url=(url_a if i % 2 else url_b), timeout=ANSWER_TIMEOUT) for i in range(2)]

        def post(a) -> int:
            i, devs, s, e = a
            r = _post_until_answered(
                clients[i % 2], "/api/v1/reservations", db_url,
                json={"host": "node-01", "devices": devs, "start": s.isoformat(), "end": e.isoformat()},
                headers={"Authorization": f"Bearer {tokens[i % len(tokens)]}"},
            )
            return r.status_code

        with ThreadPoolExecutor(max_workers=64) as pool:
            codes = list(pool.map(post, attempts))
        for c in clients:
            c.close()
    logs = "".join((tmp_path / f).read_text()[-3000:] for f in ("a.log", "b.log"))
    assert set(codes) <= {201, 409}, (sorted(set(codes)), logs)
    assert codes.count(201) >= 8
    assert _count(db_url, OVERLAPS) == 0
    assert _count(db_url, text("SELECT count(*) FROM reservations")) == codes.count(201)
