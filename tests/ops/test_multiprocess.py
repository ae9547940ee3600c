"""Several app processes share nothing but PostgreSQL: two ``gpuroster serve`` processes (one
of them with two workers) on one database, agent posts to either, the same state on both."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import PG_SERVER, _create_pg_database, _drop_pg_database, gpu, require_pg, snapshot_body
from testkit.live import Seeder, live_server

BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def pg_env(tmp_path):
    require_pg()
    from app.migrate import upgrade

    name = _create_pg_database()
    url = f"{PG_SERVER}/{name}"
    upgrade(url)
    env = {**os.environ, "GPUROSTER_DATABASE_URL": url, "GPUROSTER_DATA_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    try:
        yield env
    finally:
        _drop_pg_database(name)


def seed(env: dict[str, str], *, users: tuple[str, ...] = (), admins: tuple[str, ...] = (),
         hosts: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """Users (with an API token) and hosts in ``env``'s database, written in this process
    (``gpuroster admin`` itself is tested in ``tests/cli``): name -> Authorization header."""
    with Seeder(env["GPUROSTER_DATABASE_URL"]) as seeder:
        tokens = {n: seeder.user(n) for n in users} | {n: seeder.user(n, admin=True) for n in admins} | \
                 {n: seeder.host(n) for n in hosts}
    return {n: {"Authorization": f"Bearer {t}"} for n, t in tokens.items()}


def serve(env: dict[str, str], log: Path, workers: int = 1):
    """``gpuroster serve`` (no migration: ``pg_env`` migrated) until /readyz answers; see
    :func:`testkit.live.live_server`."""
    return live_server(env, workers=workers, migrate=False, log=log)


def _metrics(url: str) -> dict:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name != "gpuroster_host_seconds_since_snapshot"}


def test_two_servers_on_one_database_see_the_same_state(pg_env, tmp_path):
    who = seed(pg_env, users=("alice", "bob"), hosts=("node-01",))
    alice, bob, host = who["alice"], who["bob"], who["node-01"]
    uuids = [f"GPU-{i}{i}{i}{i}bbbb-0000-0000-0000-00000000000{i}" for i in range(2)]

    with ExitStack() as stack:
        a = stack.enter_context(serve(pg_env, tmp_path / "a.log", workers=2))
        b = stack.enter_context(serve(pg_env, tmp_path / "b.log"))
        t0 = datetime.now(UTC) - timedelta(seconds=10)
        s1 = snapshot_body("node-01", 1, [gpu(u, i, utilization_gpu=10.0) for i, u in enumerate(uuids)], collected_at=t0)
        r = httpx.post(a + "/api/v1/agent/snapshots", json=s1, headers=host, timeout=10)
        assert r.status_code == 200 and not r.json()["duplicate"]
        # the agent's spool replays seq 1 to the other server: idempotent there too
        r = httpx.post(b + "/api/v1/agent/snapshots", json=s1, headers=host, timeout=10)
        assert r.status_code == 200 and r.json()["duplicate"]
        procs = [{"device_uuid": uuids[1], "pid": 31337, "unix_user": "bob", "uid": 1002, "used_memory_mib": 2048.0}]
        s2 = snapshot_body("node-01", 2, [gpu(u, i, utilization_gpu=90.0) for i, u in enumerate(uuids)], procs,
                           collected_at=t0 + timedelta(seconds=5))
        assert httpx.post(b + "/api/v1/agent/snapshots", json=s2, headers=host, timeout=10).status_code == 200

        start = (datetime.now(UTC) + timedelta(hours=1)).replace(second=0, microsecond=0)
        body = {"host": "node-01", "devices": [uuids[0]], "start": start.isoformat(),
                "end": (start + timedelta(hours=2)).isoformat()}
        r = httpx.post(a + "/api/v1/reservations", json=body, headers=alice, timeout=10)
        assert r.status_code == 201, r.text
        refused = httpx.post(b + "/api/v1/reservations", json=body, headers=bob, timeout=10)
        assert refused.status_code == 409 and refused.json()["conflicts"][0]["id"] == r.json()["id"]

        for path in ("/api/v1/devices", "/api/v1/hosts", "/api/v1/reservations"):
            # several requests, so both of a's workers answer some of them
            views = [httpx.get(url + path, headers=alice, timeout=10).json() for url in (a, a, a, b, b)]
            for v in views:
                if path == "/api/v1/hosts":
                    for h in v:
                        h.pop("seconds_since_snapshot")
                assert v == views[0], path
        devices = httpx.get(a + "/api/v1/devices", headers=alice, timeout=10).json()
        assert [d["telemetry"]["utilization_gpu"] for d in devices] == [90.0, 90.0], "the latest snapshot, posted to b"
        assert devices[1]["processes"][0]["pid"] == 31337
        ma, mb = _metrics(a), _metrics(b)
        assert ma == mb
        assert ma[("gpuroster_reservation_conflicts_total", ())] == 1
        assert ma[("gpuroster_reservations_created_total", ())] == 1


def test_a_real_replay_agent_posts_to_either_server(pg_env, tmp_path):
    from app.demo import bundled_captures, replay_host_name

    cap = bundled_captures()[0]
    name = replay_host_name(cap)
    token_file = tmp_path / "token"
    who = seed(pg_env, admins=("root-admin",), hosts=(name,))
    token_file.write_text(who[name]["Authorization"].removeprefix("Bearer ") + "\n")
    token_file.chmod(0o600)
    admin = who["root-admin"]
    config = tmp_path / "agent.toml"
    config.write_text("")
    with ExitStack() as stack:
        a = stack.enter_context(serve(pg_env, tmp_path / "a.log"))
        b = stack.enter_context(serve(pg_env, tmp_path / "b.log"))
        for url in (a, b):
            r = subprocess.run([str(BIN / "gpuroster-agent"), "--config", str(config), "--server", url, "--token-file",
                                str(token_file), "--host", name, "--state-dir", str(tmp_path / "state"), "--replay",
                                str(cap), "--once"], capture_output=True, text=True, timeout=60,
                               env={k: v for k, v in pg_env.items() if not k.startswith("GPUROSTER_AGENT_")})
            assert r.returncode == 0, r.stderr
        hosts_a = httpx.get(a + "/api/v1/hosts", headers=admin, timeout=10).json()
        hosts_b = httpx.get(b + "/api/v1/hosts", headers=admin, timeout=10).json()
        assert [(h["name"], h["source"], h["device_count"]) for h in hosts_a] == \
               [(h["name"], h["source"], h["device_count"]) for h in hosts_b]
        assert hosts_a[0]["source"] == "replay" and hosts_a[0]["device_count"] > 0
