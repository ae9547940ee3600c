"""Concurrent requests of one user that together would exceed a quota: only as many succeed
as the quota allows. Two live ``gpuroster serve`` processes share the database (PostgreSQL:
the advisory lock keyed on the user; SQLite: ``BEGIN IMMEDIATE``); each request asks for a
different device, so the exclusion constraint cannot be what stops them."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.config import Settings, normalize_database_url
from app.db import build_engine, build_session_factory, run_in_transaction
from tests.conftest import future, gpu, snapshot_body
from testkit.live import gpuroster_env, live_server

pytestmark = pytest.mark.commits  # parallel requests, each on its own connection

N = 8  # parallel requests per quota, each for its own device
CASES = [  # (the user's limit, how many of the N requests it allows)
    ({"max_devices": 2}, 2),
    ({"max_gpu_hours_7d": 3}, 3),
    ({"max_concurrent_reservations": 1}, 1),
]


def _setup(db_url: str) -> tuple[list[str], str, list[str]]:
    """One user per case, each under its own user rule, so the cases share two servers (a
    server's start is most of this test's cost) without one case's bookings counting in
    another's quota. Returns the users' tokens, the host token and N devices per case."""
    from app.services import hosts as host_service
    from app.services import rule_admin
    from app.services import users as user_service

    engine = build_engine(Settings(database_url=db_url))

    def work(s):
        admin = user_service.create_user(s, username="boss", admin=True)
        tokens = []
        for k, (limit, _) in enumerate(CASES):
            user = user_service.create_user(s, username=f"user{k}")
            tokens.append(user_service.create_api_token(s, user=user)[1])
            s.flush()
            rule_admin.create_rule(s, scope="user", user=user.username, group=None, values=limit, actor=admin)
        return tokens, host_service.create_host(s, name="node-01")[1]

    tokens, host_token = run_in_transaction(build_session_factory(engine), work)
    engine.dispose()
    return tokens, host_token, [f"GPU-{i:08d}-quota-0000-0000-000000000000" for i in range(N * len(CASES))]


def _scalar(db_url: str, sql: str) -> int:
    eng = create_engine(normalize_database_url(db_url))
    with eng.connect() as c:
        n = c.execute(text(sql)).scalar_one()
    eng.dispose()
    return n


@pytest.mark.slow
def test_parallel_requests_over_a_quota_only_as_many_succeed_as_allowed(db_url, tmp_path):
    tokens, host_token, uuids = _setup(db_url)
    env = gpuroster_env(db_url, tmp_path)
    start = future(72)
    with live_server(env, migrate=False) as url_a, live_server(env, migrate=False) as url_b:
        r = httpx.post(url_a + "/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {host_token}"},
                       json=snapshot_body("node-01", 1, [gpu(u, i) for i, u in enumerate(uuids)]))
        assert r.status_code == 200, r.text
        for k, (limit, allowed) in enumerate(CASES):
            barrier = threading.Barrier(N)

            def post(i: int, k: int = k, barrier: threading.Barrier = barrier) -> httpx.Response:
                with httpx.Client(base_url=url_a if i % 2 else url_b, timeout=60) as c:
                    c.get("/healthz")  # connect before the barrier so the requests leave together
                    barrier.wait()
                    return c.post("/api/v1/reservations", headers={"Authorization": f"Bearer {tokens[k]}"}, json={
                        "host": "node-01", "devices": [uuids[k * N + i]], "start": start.isoformat(),
                        "end": (start + timedelta(hours=1)).isoformat()})

            with ThreadPoolExecutor(max_workers=N) as pool:
                responses = list(pool.map(post, range(N)))
            codes = sorted(r.status_code for r in responses)
            assert codes == [201] * allowed + [403] * (N - allowed), (limit, [(r.status_code, r.text[:300]) for r in responses])
            rule = next(iter(limit))
            assert {r.json()["rule"] for r in responses if r.status_code == 403} == {rule}, limit
            assert _scalar(db_url, f"SELECT count(*) FROM reservations r JOIN users u ON u.id = r.user_id"
                                   f" WHERE u.username = 'user{k}'") == allowed, limit
