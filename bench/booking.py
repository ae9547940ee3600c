"""Booking throughput and latency over real HTTP, on SQLite and on PostgreSQL.

Starts ``gpuroster serve`` (default 2 workers on this 2-core machine), then drives
``POST /api/v1/reservations`` from 1, 4, 16 and 64 concurrent clients for a few seconds each.
Every booking takes a distinct (device, slot), so each is a full successful booking:
auth lookup, conflict check, insert under the database's no-double-booking guard, commit.
A baseline is measured in the same run: ``GET /healthz`` on the same server (the framework's
floor), so figures read as ratios. The load generator is stdlib ``http.client`` with
keep-alive connections; its own CPU use is printed (target: under half a core).

Prints figures, asserts nothing. Run: ``.venv/bin/python bench/booking.py [--seconds 6]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.pg import PG_SERVER, _create_pg_database, _drop_pg_database, pg_available  # noqa: E402
from testkit.live import gpuroster_env, live_server  # noqa: E402

N_DEVICES = 64
TARGET_P99_MS = 10.0


def seed(url: str, n_users: int) -> tuple[list[str], str]:
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.migrate import upgrade
    from app.services import hosts as host_service
    from app.services import users as user_service

    upgrade(url)
    engine = build_engine(Settings(database_url=url))

    def work(s):
        toks = []
        for i in range(n_users):
            u = user_service.create_user(s, username=f"bench{i:02d}")
            toks.append(user_service.create_api_token(s, user=u)[1])
        return toks, host_service.create_host(s, name="bench-01")[1]

    out = run_in_transaction(build_session_factory(engine), work)
    engine.dispose()
    return out


def register(base: str, host_token: str) -> None:
    import httpx

    devices = [{"uuid": f"GPU-{i:08d}-bench-0000-0000-000000000000", "index": i, "name": "NVIDIA H100"} for i in range(N_DEVICES)]
    body = {"host": "bench-01", "seq": 1, "collected_at": datetime.now(UTC).isoformat(), "devices": devices}
    r = httpx.post(base + "/api/v1/agent/snapshots", json=body, headers={"Authorization": f"Bearer {host_token}"})
    r.raise_for_status()


class Worker(threading.Thread):
    def __init__(self, port: int, fn, stop: threading.Event):
        super().__init__(daemon=True)
        self.port, self.fn, self.stop = port, fn, stop
        self.lat: list[float] = []
        self.codes: dict[int, int] = {}

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self.stop.is_set():
            method, path, body, headers = self.fn()
            t0 = time.perf_counter()
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            self.lat.append(time.perf_counter() - t0)
            self.codes[resp.status] = self.codes.get(resp.status, 0) + 1
        conn.close()


def drive(port: int, clients: int, seconds: float, make_request) -> dict:
    stop = threading.Event()
    workers = [Worker(port, make_request(i), stop) for i in range(clients)]
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    lat = sorted(x for w in workers for x in w.lat)
    codes: dict[int, int] = {}
    for w in workers:
        for k, v in w.codes.items():
            codes[k] = codes.get(k, 0) + v
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {
        "rate": len(lat) / wall,
        "p50": statistics.median(lat) * 1000 if lat else float("nan"),
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan"),
        "codes": codes,
        "loadgen_cores": cpu / wall,
    }


def bench_database(label: str, url: str, seconds: float, workers: int) -> None:
    tokens, host_token = seed(url, 64)
    data = Path(tempfile.mkdtemp(prefix="gpr-bench-"))
    env = gpuroster_env(url, data)
    with live_server(env, workers=workers, migrate=False) as base:
        register(base, host_token)
        port = int(base.rsplit(":", 1)[1])
        slot_counter = [0]
        lock = threading.Lock()
        t0 = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(days=30)

        def booking(i: int):
            headers = {"Authorization": f"Bearer {tokens[i]}", "Content-Type": "application/json"}

            def make():
                with lock:
                    slot_counter[0] += 1
                    k = slot_counter[0]
                dev, slot = k % N_DEVICES, k // N_DEVICES
                start = t0 + timedelta(minutes=10 * slot)
                body = json.dumps({"host": "bench-01", "devices": [dev], "start": start.isoformat(), "duration": "PT10M"})
                return "POST", "/api/v1/reservations", body, headers

            return make

        def healthz(i: int):
            return lambda: ("GET", "/healthz", None, {})

        print(f"\n== {label}: gpuroster serve --workers {workers}")
        print(f"{'load':<10}{'clients':>8}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'loadgen cores':>15}  status codes")
        for name, factory in (("healthz", healthz), ("booking", booking)):
            for clients in (1, 4, 16, 64):
                r = drive(port, clients, seconds, factory)
                print(f"{name:<10}{clients:>8}{r['rate']:>10.0f}{r['p50']:>9.1f}{r['p99']:>9.1f}{r['loadgen_cores']:>15.2f}  {r['codes']}")
                if name == "healthz" and clients == 16:
                    base_rate = r["rate"]
                if name == "booking" and clients == 16:
                    print(f"{'':<10}booking at 16 clients = {r['rate'] / base_rate:.2f} x the healthz floor")
                if name == "booking" and clients <= 4:
                    print(f"{'':<10}target p99 <= {TARGET_P99_MS:.0f} ms at 1-4 clients: {r['p99']:.1f} ms "
                          f"({r['p99'] / TARGET_P99_MS:.2f} x the target)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="per load level")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores; {args.seconds:.0f} s per level")
    sqlite_dir = Path(tempfile.mkdtemp(prefix="gpr-bench-db-"))
    bench_database("SQLite (WAL, BEGIN IMMEDIATE)", f"sqlite:///{sqlite_dir / 'bench.db'}", args.seconds, args.workers)
    if args.sqlite_only:
        return
    reason = pg_available()
    if reason:
        print(f"\n== PostgreSQL skipped: {reason}")
        return
    name = _create_pg_database()
    try:
        bench_database("PostgreSQL (exclusion constraints)", f"{PG_SERVER}/{name}", args.seconds, args.workers)
    finally:
        _drop_pg_database(name)


if __name__ == "__main__":
    main()
