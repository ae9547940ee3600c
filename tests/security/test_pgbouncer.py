"""B47: the service behind a real PgBouncer (Debian package) in transaction mode.

A generated configuration starts ``pgbouncer`` on a free loopback port in front of the test
PostgreSQL, with a pool smaller than the clients so that server connections are shared.
``gpuroster migrate`` and ``gpuroster serve`` use the pooler settings (no startup
``options``, no server-side prepared statements); 8 parallel clients book and list. Without
the setting ``migrate`` fails on the ``options`` startup parameter, which shows the test
exercises the pooler. Skips loudly without pgbouncer; fails under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import IN_CI, PG_SERVER, _create_pg_database, _drop_pg_database, require_pg
from testkit.live import BIN, Seeder, free_port, gpuroster_env, live_server, run_cli

pytestmark = pytest.mark.slow

PGBOUNCER = shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if os.path.exists(p)), None)
CLIENTS = 8
ROUNDS = 12


def _require_pgbouncer() -> str:
    if PGBOUNCER is None:
        msg = "pgbouncer is not installed (apt-get install -y pgbouncer)"
        if IN_CI:
            pytest.fail("the PgBouncer test cannot run under CI: " + msg)
        pytest.skip("SKIPPING PGBOUNCER TEST: " + msg)
    return PGBOUNCER


@pytest.fixture
def pgbouncer(tmp_path):
    """A transaction-mode PgBouncer on a free loopback port; yields its server URL."""
    binary = _require_pgbouncer()
    require_pg()
    upstream = httpx.URL(PG_SERVER.replace("postgresql://", "http://", 1))
    # a directory of its own under /tmp: pytest's tmp_path is private to root, and pgbouncer
    # runs as the postgres account when the tests run as root
    run_dir = Path(tempfile.mkdtemp(prefix="gpuroster-pgbouncer-"))
    run_dir.chmod(0o755)
    port = free_port()
    (run_dir / "userlist.txt").write_text('"postgres" ""\n')
    (run_dir / "pgbouncer.ini").write_text(f"""[databases]
* = host={upstream.host} port={upstream.port or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {run_dir / 'userlist.txt'}
pool_mode = transaction
default_pool_size = 3
max_client_conn = 200
logfile = {run_dir / 'pgbouncer.log'}
pidfile = {run_dir / 'pgbouncer.pid'}
""")
    args = [binary]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root: drop to the postgres account
        shutil.chown(run_dir, "postgres")
        args += ["-u", "postgres"]
    proc = subprocess.Popen([*args, str(run_dir / "pgbouncer.ini")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            log = (run_dir / "pgbouncer.log").read_text() if (run_dir / "pgbouncer.log").exists() else ""
            raise RuntimeError(f"pgbouncer exited with {proc.returncode}: {proc.stdout.read().decode()} {log}")
        try:
            import socket

            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(run_dir, ignore_errors=True)


def _migrate(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "gpuroster"), "migrate"], env=env, capture_output=True, text=True, timeout=120)


def test_b47_migrate_and_8_parallel_clients_through_pgbouncer_transaction_mode(pgbouncer, tmp_path):
    name = _create_pg_database()
    try:
        pooled = f"{pgbouncer}/{name}"
        # without the pooler setting, the startup option is refused: the pooler is really in the path
        plain = _migrate(gpuroster_env(pooled, tmp_path))
        assert plain.returncode != 0 and "options" in (plain.stderr + plain.stdout)
        # (1) migrate with the URL flag
        flagged = _migrate(gpuroster_env(pooled + "?pgbouncer=true", tmp_path))
        assert flagged.returncode == 0, flagged.stderr
        # (2) serve with the setting; users, tokens and a host made through the pooler too
        env = gpuroster_env(pooled, tmp_path, GPUROSTER_PGBOUNCER="true")
        with live_server(env, log=tmp_path / "serve.log") as url:
            run_cli(["admin", "create-user", "user0", "--no-password"], env)
            tokens = [run_cli(["admin", "create-token", "user0"], env)]
            host = run_cli(["admin", "add-host", "node-01"], env)
            with Seeder(pooled, pgbouncer=True) as seed:  # the rest through the services, through the pooler too
                tokens += [seed.user(f"user{i}") for i in range(1, CLIENTS)]
            devices = [{"uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000", "index": i, "name": "NVIDIA A100"}
                       for i in range(4)]
            r = httpx.post(url + "/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {host}"},
                           json={"host": "node-01", "seq": 1, "collected_at": datetime.now(UTC).isoformat(),
                                 "devices": devices, "processes": []})
            assert r.status_code == 200, r.text
            base = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(days=1)

            def client(i: int) -> list[int]:
                codes = []
                with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens[i]}"}, timeout=30) as c:
                    for k in range(ROUNDS):
                        start = base + timedelta(hours=k)  # every client wants the same slots: conflicts expected
                        codes.append(c.post("/api/v1/reservations", json={
                            "host": "node-01", "devices": [i % 4], "start": start.isoformat(), "duration": "PT1H"}).status_code)
                        codes.append(c.get("/api/v1/reservations", params={"everyone": "true"}).status_code)
                        codes.append(c.get("/api/v1/devices").status_code)
                return codes

            with ThreadPoolExecutor(CLIENTS) as pool:
                codes = [code for result in pool.map(client, range(CLIENTS)) for code in result]
            log = (tmp_path / "serve.log").read_text()
            assert all(code in (200, 201, 409) for code in codes), (sorted(set(codes)), log[-3000:])
            assert codes.count(201) == 4 * ROUNDS  # each device-hour booked exactly once
            assert "prepared statement" not in log
    finally:
        _drop_pg_database(name)
