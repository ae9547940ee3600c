"""Ingest throughput and latency: simulated agents of 1,000 hosts x 8 GPUs posting snapshots.

For each database (PostgreSQL: ``--pg-processes`` ``gpuroster serve`` processes on one
database, default two, the load spread over them, and with ``--pg-processes 1,2`` the
saturation ratio of two to one; SQLite: one ``gpuroster serve``):

1. a fresh, migrated database with ``--hosts`` registered hosts;
2. *first contact*: one snapshot per host (devices are created), closed loop;
3. *saturation*: ``--connections`` connections posting back to back for ``--saturate`` s:
   the most snapshots per second the servers take;
4. *sustained*: an open loop at ``--rate`` snapshots/s (default 2,000, the target) for
   ``--duration`` s, latency measured from each request's scheduled send time (so queueing
   behind a slow server counts, no coordinated omission); when saturation showed the target
   out of reach, the sustained phase runs at 80 % of the saturation rate instead, so its
   p50/p99 describe a load the servers can actually sustain;
5. server memory: peak RSS of each server process tree, sampled every 0.5 s;
6. the Now page's data for all hosts, server-side (``device_views`` + API conversion,
   in-process on the same database), plus ``GET /api/v1/devices`` and ``GET /metrics`` over HTTP;
7. a profile of ingest in-process (no HTTP): snapshots/s, time in SQL versus Python, and the
   statements that take the time.

The load generator is lean on purpose (the servers share this machine's cores with it):
pre-serialized request templates, raw HTTP/1.1 keep-alive connections on asyncio, no HTTP
library per request. Its own CPU use is printed. Figures are printed, never asserted.

Run: ``.venv/bin/python bench/ingest.py`` (PostgreSQL on 127.0.0.1:5432 with trust auth, or
``GPUROSTER_BENCH_PG=postgresql://user@host:port``); ``--db sqlite`` to skip PostgreSQL.
About 2.5 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid as uuidlib
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from sqlalchemy import create_engine, event, text  # noqa: E402

BIN = Path(sys.executable).parent
PG_SERVER = os.environ.get("GPUROSTER_BENCH_PG", os.environ.get("GPUROSTER_TEST_PG", "postgresql://postgres@127.0.0.1:5432"))
TARGET_RATE = 2000.0
TARGET_P99_MS = 50.0
TARGET_RSS_MIB = 512.0


# ---------------------------------------------------------------------------- snapshots


def gpu_uuid(host: int, gpu: int) -> str:
    return f"GPU-{host:08x}-{gpu:04x}-4000-8000-{host * 16 + gpu:012x}"


def snapshot_template(host_name: str, host: int, gpus: int) -> bytes:
    """The snapshot JSON of one host with ``%d`` for seq and ``%s`` for collected_at.

    8 whole GPUs with full telemetry; every other GPU runs one process of a lab user.
    """
    devices, procs = [], []
    for g in range(gpus):
        util = float((host * 7 + g * 13) % 101)
        devices.append({
            "uuid": gpu_uuid(host, g), "index": g, "name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": f"00000000:{g + 1:02X}:00.0",
            "memory_total_mib": 81920.0, "memory_used_mib": 1024.0 * (g + 1), "utilization_gpu": util,
            "utilization_memory": util / 2, "temperature_c": 40.0 + g, "power_draw_w": 100.0 + 10 * g,
            "power_limit_w": 400.0, "throttle_reasons": [], "ecc_uncorrected": 0, "retired_pages": 0,
            "persistence_mode": True, "compute_mode": "Default", "mig_mode": False,
        })
        if g % 2 == 0:
            procs.append({"device_uuid": gpu_uuid(host, g), "pid": 10000 + g, "type": "C", "used_memory_mib": 900.0,
                          "uid": 1000 + host % 50, "unix_user": f"user{host % 50}", "command": "python train.py --epochs 90",
                          "name": "python", "create_time": 1.7e9 + g, "container_id": None, "owner_status": "ok"})
    doc = {"host": host_name, "seq": "__SEQ__", "collected_at": "__TS__", "agent_version": "bench", "source": "nvml",
           "interval_seconds": 5.0, "driver_version": "550.54.15", "cuda_version": "12.4",
           "devices": devices, "processes": procs, "findings": []}
    raw = json.dumps(doc, separators=(",", ":")).replace("%", "%%")
    return raw.replace('"__SEQ__"', "%d").replace("__TS__", "%s").encode()


@dataclass
class Fleet:
    """Registered hosts: names, host tokens and snapshot templates; seq counters per host."""

    names: list[str]
    tokens: list[str]
    templates: list[bytes]
    seqs: list[int] = field(default_factory=list)
    cursor: int = 0

    def next_body(self) -> tuple[int, bytes]:
        """(host index, body) of the next snapshot, round-robin over hosts."""
        i = self.cursor % len(self.names)
        self.cursor += 1
        self.seqs[i] += 1
        ts = datetime.now(UTC).isoformat()
        return i, self.templates[i] % (self.seqs[i], ts.encode())


# ---------------------------------------------------------------------------- databases and servers


def create_pg_database() -> tuple[str, str]:
    name = f"gpuroster_bench_{uuidlib.uuid4().hex[:8]}"
    admin = create_engine(PG_SERVER.replace("postgresql://", "postgresql+psycopg://", 1) + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return name, f"{PG_SERVER}/{name}"


def drop_pg_database(name: str) -> None:
    admin = create_engine(PG_SERVER.replace("postgresql://", "postgresql+psycopg://", 1) + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def register_fleet(url: str, hosts: int, gpus: int) -> Fleet:
    """Migrate, create ``hosts`` hosts (one transaction) and an admin token; returns the fleet."""
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.migrate import upgrade
    from app.services import hosts as host_service
    from app.services import users as user_service

    upgrade(url)
    settings = Settings(database_url=url, environment="test")
    engine = build_engine(settings)
    factory = build_session_factory(engine)
    names = [f"gpu{i:04d}" for i in range(hosts)]

    def work(s):
        tokens = [host_service.create_host(s, name=n, actor="bench")[1] for n in names]
        admin = user_service.create_user(s, username="bench-admin", admin=True, actor="bench")
        return tokens, user_service.create_api_token(s, user=admin, name="bench")[1]

    tokens, admin_token = run_in_transaction(factory, work)
    engine.dispose()
    fleet = Fleet(names, tokens, [snapshot_template(n, i, gpus) for i, n in enumerate(names)], [0] * hosts)
    fleet.admin_token = admin_token  # type: ignore[attr-defined]
    return fleet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def servers(url: str, count: int, workdir: Path):
    """``count`` ``gpuroster serve`` processes on ``url``; yields their ports."""
    env = {**os.environ, "GPUROSTER_DATABASE_URL": url, "GPUROSTER_DATA_DIR": str(workdir), "GPUROSTER_ENVIRONMENT": "test"}
    procs, ports = [], []
    try:
        for k in range(count):
            port = free_port()
            log = open(workdir / f"serve-{k}.log", "w")
            procs.append(subprocess.Popen([str(BIN / "gpuroster"), "serve", "--port", str(port), "--no-migrate",
                                           "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            ports.append(port)
        for port, p in zip(ports, procs):
            deadline = time.monotonic() + 60
            while True:
                if p.poll() is not None:
                    raise RuntimeError(f"serve exited {p.returncode}; see {workdir}")
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("serve did not start in 60 s") from None
                    time.sleep(0.2)
        yield ports, [p.pid for p in procs]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


class RssSampler:
    """Peak RSS (MiB) of each process tree, sampled every 0.5 s on a thread."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = [0.0] * len(pids)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _tree_rss(self, pid: int) -> float:
        try:
            p = psutil.Process(pid)
            procs = [p, *p.children(recursive=True)]
            return sum(q.memory_info().rss for q in procs) / 2**20
        except psutil.Error:
            return 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            for k, pid in enumerate(self.pids):
                self.peak[k] = max(self.peak[k], self._tree_rss(pid))
            self._stop.wait(0.5)

    def __enter__(self) -> "RssSampler":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


class CpuMeter:
    """CPU seconds spent by the server process trees and by the PostgreSQL backends serving the
    bench database, between :meth:`start` and :meth:`stop`. Unlike wall-clock rates, CPU per
    snapshot hardly depends on what else runs on the machine."""

    def __init__(self, pids: list[int], pg_url: str | None) -> None:
        self.pids = pids
        self.pg_url = pg_url
        self._app0 = 0.0
        self._pg0: dict[int, float] = {}
        self.app_s = 0.0
        self.db_s = 0.0

    @staticmethod
    def _cpu(p: psutil.Process) -> float:
        t = p.cpu_times()
        return t.user + t.system

    def _app(self) -> float:
        total = 0.0
        for pid in self.pids:
            try:
                root = psutil.Process(pid)
                total += sum(self._cpu(q) for q in [root, *root.children(recursive=True)])
            except psutil.Error:
                pass
        return total

    def _pg(self) -> dict[int, float]:
        if self.pg_url is None:
            return {}
        name = self.pg_url.rsplit("/", 1)[1]
        eng = create_engine(self.pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
        with eng.connect() as c:
            pids = [r[0] for r in c.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})]
        eng.dispose()
        out = {}
        for pid in pids:
            try:
                out[pid] = self._cpu(psutil.Process(pid))
            except psutil.Error:
                pass
        return out

    def start(self) -> None:
        self._app0 = self._app()
        self._pg0 = self._pg()

    def stop(self) -> None:
        self.app_s = self._app() - self._app0
        self.db_s = sum(v - self._pg0.get(pid, 0.0) for pid, v in self._pg().items())

    def line(self, snapshots: int) -> str:
        if not snapshots:
            return "  CPU per snapshot: n/a"
        app_ms, db_ms = self.app_s / snapshots * 1000, self.db_s / snapshots * 1000
        both = app_ms + db_ms
        cores = os.cpu_count() or 1
        # each service process runs Python on one core at a time (GIL): it cannot use more
        ceiling = min(cores * 1000 / both, min(cores, len(self.pids)) * 1000 / app_ms)
        return (f"  CPU per snapshot (saturation): service {app_ms:.1f} ms"
                + (f" + PostgreSQL {db_ms:.1f} ms" if self.pg_url else "")
                + f" = {both:.1f} ms -> at most ~{ceiling:.0f} snapshots/s with {len(self.pids)} service process(es) "
                f"on {cores} idle cores (the {TARGET_RATE:.0f}/s target needs <= {cores * 1000 / TARGET_RATE:.1f} ms in all)")


# ---------------------------------------------------------------------------- the load generator

_CL = re.compile(rb"content-length:\s*(\d+)", re.I)


class Conn:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP for this benchmark."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.transport.set_write_buffer_limits(high=1 << 20)

    async def post(self, token: str, body: bytes) -> int:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        head = (f"POST /api/v1/agent/snapshots HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        resp = await self.reader.readuntil(b"\r\n\r\n")
        status = int(resp[9:12])
        m = _CL.search(resp)
        if m is None:
            raise RuntimeError("response without Content-Length")
        await self.reader.readexactly(int(m.group(1)))
        return status


@dataclass
class PhaseResult:
    name: str
    sent: int
    ok: int
    errors: dict[int, int]
    seconds: float
    latencies_ms: list[float]
    client_cpu_s: float
    dropped: int = 0

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]

    def line(self) -> str:
        errs = ", ".join(f"{k}: {v}" for k, v in sorted(self.errors.items())) or "none"
        drop = f", {self.dropped} scheduled but not sent in time" if self.dropped else ""
        return (f"  {self.name:<14} {self.rate:8.1f} snapshots/s  p50 {self.pct(50):7.1f} ms  p99 {self.pct(99):7.1f} ms"
                f"  ({self.ok} ok in {self.seconds:.1f} s, errors {errs}{drop}; load generator CPU {self.client_cpu_s:.1f} s)")


async def closed_loop(fleet: Fleet, ports: list[int], connections: int, *, seconds: float | None, count: int | None,
                      name: str) -> PhaseResult:
    """``connections`` connections posting back to back, for ``seconds`` or ``count`` posts."""
    conns = [Conn(ports[k % len(ports)]) for k in range(connections)]
    lat: list[float] = []
    errors: dict[int, int] = defaultdict(int)
    sent = 0
    loop = asyncio.get_running_loop()
    cpu0 = time.process_time()
    t0 = loop.time()
    deadline = t0 + seconds if seconds else None

    async def worker(c: Conn) -> None:
        nonlocal sent
        while True:
            if deadline is not None and loop.time() >= deadline:
                return
            if count is not None and sent >= count:
                return
            sent += 1
            i, body = fleet.next_body()
            start = loop.time()
            status = await c.post(fleet.tokens[i], body)
            if status == 200:
                lat.append((loop.time() - start) * 1000)
            else:
                errors[status] += 1

    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = loop.time() - t0
    for c in conns:
        if c.writer:
            c.writer.close()
    return PhaseResult(name, sent, len(lat), dict(errors), elapsed, lat, time.process_time() - cpu0)


async def open_loop(fleet: Fleet, ports: list[int], connections: int, *, rate: float, seconds: float) -> PhaseResult:
    """Requests scheduled at ``rate``/s for ``seconds``; latency from the scheduled instant."""
    conns = [Conn(ports[k % len(ports)]) for k in range(connections)]
    for c in conns:
        await c.open()
    queue: asyncio.Queue[float | None] = asyncio.Queue()
    lat: list[float] = []
    errors: dict[int, int] = defaultdict(int)
    loop = asyncio.get_running_loop()
    cpu0 = time.process_time()
    t0 = loop.time()
    end = t0 + seconds
    total = int(rate * seconds)
    sent = 0

    async def producer() -> None:
        i = 0
        while i < total:
            due = min(total, int((loop.time() - t0) * rate) + 1)
            while i < due:
                queue.put_nowait(t0 + i / rate)
                i += 1
            await asyncio.sleep(0.002)

    async def worker(c: Conn) -> None:
        nonlocal sent
        while True:
            sched = await queue.get()
            if sched is None:
                return
            if loop.time() > end + 2.0:  # the run is over: what is still queued is dropped
                continue
            sent += 1
            i, body = fleet.next_body()
            status = await c.post(fleet.tokens[i], body)
            if status == 200:
                lat.append((loop.time() - sched) * 1000)
            else:
                errors[status] += 1

    workers = [asyncio.create_task(worker(c)) for c in conns]
    await producer()
    for _ in conns:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    elapsed = max(seconds, loop.time() - t0)
    for c in conns:
        if c.writer:
            c.writer.close()
    return PhaseResult(f"sustained@{rate:.0f}", sent, len(lat), dict(errors), elapsed, lat,
                       time.process_time() - cpu0, dropped=total - sent)


# ---------------------------------------------------------------------------- server-side timings


def time_now_page(url: str) -> dict[str, float]:
    """Milliseconds (median of 3) for device_views and the whole API conversion, in-process."""
    from app.config import Settings
    from app.db import build_engine, build_session_factory
    from app.models import utcnow
    from app.services import devices as device_service

    engine = build_engine(Settings(database_url=url, environment="test"))
    factory = build_session_factory(engine)
    views_ms, reads_ms, n = [], [], 0
    for _ in range(3):
        with factory() as s:
            t = time.perf_counter()
            views = device_service.device_views(s, now=utcnow())
            views_ms.append((time.perf_counter() - t) * 1000)
            n = len(views)
        with factory() as s:
            t = time.perf_counter()
            device_service.list_devices(s, now=utcnow())
            reads_ms.append((time.perf_counter() - t) * 1000)
    engine.dispose()
    return {"devices": n, "device_views_ms": statistics.median(views_ms), "list_devices_ms": statistics.median(reads_ms)}


def time_http(port: int, path: str, token: str | None) -> tuple[float, int]:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    best = float("inf")
    size = 0
    for _ in range(3):
        t = time.perf_counter()
        r = httpx.get(f"http://127.0.0.1:{port}{path}", headers=headers, timeout=60)
        best = min(best, (time.perf_counter() - t) * 1000)
        size = len(r.content)
        r.raise_for_status()
    return best, size


def profile_ingest(url: str, fleet: Fleet, snapshots: int) -> list[str]:
    """In-process ingest of ``snapshots`` snapshots with per-statement timing; report lines."""
    from agent.schema import Snapshot
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.models import Host
    from app.services import ingest

    settings = Settings(database_url=url, environment="test")
    engine = build_engine(settings)
    factory = build_session_factory(engine)
    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    starts: dict[int, float] = {}

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn, cursor, statement, params, context, executemany):  # noqa: ANN001
        starts[id(cursor)] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn, cursor, statement, params, context, executemany):  # noqa: ANN001
        dt = time.perf_counter() - starts.pop(id(cursor), time.perf_counter())
        key = re.sub(r"\s+", " ", statement.strip())
        key = re.sub(r"\(\?(, \?)*\)|\(%\(\w+\)s(, %\(\w+\)s)*\)|\$\d+|%\(\w+\)s|\?", "?", key)
        key = re.sub(r"(\?, )+\?", "?…", key)[:110]
        s = stats[key]
        s[0] += 1
        s[1] += dt

    bodies = [fleet.next_body() for _ in range(snapshots)]
    parse = 0.0
    t_all = time.perf_counter()
    with factory() as s:
        host_ids = {h.name: h.id for h in s.query(Host)}
    for i, body in bodies:
        t = time.perf_counter()
        snap = Snapshot.model_validate_json(body)
        parse += time.perf_counter() - t

        def work(s, snap=snap, i=i):
            host = s.get(Host, host_ids[fleet.names[i]])
            ingest.ingest_snapshot(s, host=host, snap=snap, settings=settings)

        run_in_transaction(factory, work)
    total = time.perf_counter() - t_all
    engine.dispose()
    sql = sum(v[1] for v in stats.values())
    lines = [f"  in-process ingest (no HTTP): {snapshots / total:.0f} snapshots/s = {total / snapshots * 1000:.2f} ms each: "
             f"SQL {sql / snapshots * 1000:.2f} ms ({sql / total:.0%}), JSON->Snapshot {parse / snapshots * 1000:.2f} ms, "
             f"ORM/Python rest {(total - sql - parse) / snapshots * 1000:.2f} ms; "
             f"{sum(v[0] for v in stats.values()) / snapshots:.1f} statements per snapshot"]
    lines.append("  statements by total time (count per snapshot, mean ms):")
    for key, (n, t) in sorted(stats.items(), key=lambda kv: -kv[1][1])[:10]:
        lines.append(f"    {t / total:5.1%}  x{n / snapshots:4.1f}  {t / n * 1000:6.3f} ms  {key}")
    return lines


# ---------------------------------------------------------------------------- the run


def run_db(kind: str, args: argparse.Namespace, processes: int) -> list[str]:
    out = [f"== {kind}: {args.hosts} hosts x {args.gpus} GPUs, {processes} serve process(es) on one database"]
    workdir = Path(tempfile.mkdtemp(prefix=f"gpuroster-bench-{kind}-"))
    pg_name = None
    if kind == "postgresql":
        pg_name, url = create_pg_database()
    else:
        url = f"sqlite:///{workdir / 'bench.db'}"
    try:
        t = time.perf_counter()
        fleet = register_fleet(url, args.hosts, args.gpus)
        out.append(f"  set-up: migrated, {args.hosts} hosts registered in {time.perf_counter() - t:.1f} s")
        with servers(url, processes, workdir) as (ports, pids), RssSampler(pids) as rss:
            first = asyncio.run(closed_loop(fleet, ports, args.connections, seconds=None, count=args.hosts, name="first contact"))
            out.append(first.line())
            cpu = CpuMeter(pids, url if kind == "postgresql" else None)
            cpu.start()
            sat = asyncio.run(closed_loop(fleet, ports, args.connections, seconds=args.saturate, count=None, name="saturation"))
            cpu.stop()
            out.append(sat.line())
            out.append(cpu.line(sat.ok))
            rate = args.rate if sat.rate >= args.rate else max(10.0, round(0.8 * sat.rate))
            if rate != args.rate:
                out.append(f"  target {args.rate:.0f}/s is above saturation: sustained phase at 80 % of it, {rate:.0f}/s")
            sus = asyncio.run(open_loop(fleet, ports, args.connections, rate=rate, seconds=args.duration))
            out.append(sus.line())
            ms_devices, size = time_http(ports[0], "/api/v1/devices", fleet.admin_token)  # type: ignore[attr-defined]
            ms_metrics, msize = time_http(ports[0], "/metrics", None)
        out.append("  server RSS peak: " + ", ".join(f"{m:.0f} MiB" for m in rss.peak)
                   + f" (target <= {TARGET_RSS_MIB:.0f} MiB per server)")
        now = time_now_page(url)
        out.append(f"  Now page data for {now['devices']} devices: device_views {now['device_views_ms']:.0f} ms, "
                   f"+ API conversion {now['list_devices_ms']:.0f} ms (in-process); GET /api/v1/devices {ms_devices:.0f} ms "
                   f"({size / 2**20:.1f} MiB); GET /metrics {ms_metrics:.0f} ms ({msize / 2**20:.1f} MiB)")
        verdict = []
        verdict.append(f"rate {sat.rate / TARGET_RATE:.2f}x of {TARGET_RATE:.0f}/s")
        verdict.append(f"p99 {sus.pct(99):.0f} ms at {rate:.0f}/s vs {TARGET_P99_MS:.0f} ms")
        verdict.append(f"RSS {max(rss.peak):.0f} vs {TARGET_RSS_MIB:.0f} MiB")
        out.append("  against the targets: " + "; ".join(verdict))
        if args.profile:
            out.extend(profile_ingest(url, fleet, args.profile))
        args.saturation[(kind, processes)] = sat.rate
        return out
    finally:
        if pg_name:
            drop_pg_database(pg_name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="postgresql,sqlite", help="comma-separated: postgresql, sqlite")
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--connections", type=int, default=32, help="concurrent keep-alive connections")
    p.add_argument("--saturate", type=float, default=8.0, help="seconds of the closed-loop saturation phase")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of the sustained open-loop phase")
    p.add_argument("--rate", type=float, default=TARGET_RATE, help="sustained snapshots per second to offer")
    p.add_argument("--profile", type=int, default=300, help="snapshots ingested in-process with statement timing (0: skip)")
    p.add_argument("--pg-processes", default="2", help="comma-separated serve process counts for PostgreSQL, e.g. 1,2 "
                   "(the scale-out ratio is printed); SQLite always runs one (several fight over its write lock)")
    args = p.parse_args(argv)
    args.saturation = {}
    print(f"gpuroster ingest benchmark on {os.cpu_count()} CPU(s); targets: {TARGET_RATE:.0f} snapshots/s, "
          f"p99 <= {TARGET_P99_MS:.0f} ms, server RSS <= {TARGET_RSS_MIB:.0f} MiB", flush=True)
    for kind in [k.strip() for k in args.db.split(",") if k.strip()]:
        if kind not in ("postgresql", "sqlite"):
            p.error(f"--db: unknown database {kind!r}")
        for processes in ([int(n) for n in args.pg_processes.split(",")] if kind == "postgresql" else [1]):
            for line in run_db(kind, args, processes):
                print(line, flush=True)
    pg = sorted((n, rate) for (kind, n), rate in args.saturation.items() if kind == "postgresql")
    if len(pg) > 1:
        base_n, base = pg[0]
        print("scale-out on one PostgreSQL: " + "; ".join(
            f"{n} processes {rate:.0f}/s = {rate / base:.2f}x of {base_n}" for n, rate in pg), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
