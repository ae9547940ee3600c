"""Freshness: from an agent's sample to the API and the Now page showing it, at a 1 s interval.

Starts ``gpuroster serve`` on a fresh SQLite database (``--postgres``: a temporary
PostgreSQL database), registers a fleet of hosts, and runs for ``--seconds``:

* one agent loop per host, over its own keep-alive connection, takes a "sample" every
  ``--interval`` seconds (staggered over the hosts) and posts it at once; the sample names a
  process on GPU 0 ``fresh-<host>-<seq>``, which both the API and the page print;
* an API reader polls ``GET /api/v1/devices`` and a page reader polls the Now page's htmx
  fragment (``GET /?all=1``, the block a browser refreshes), back to back, each noting when
  every ``fresh-<host>-<seq>`` first appears in an answer.

A sample's freshness is the time from taking it to the end of the first answer that shows
it (what a reader polling back to back can see; a browser polls every 5 s on top of that).
The baseline of the same run is the agent's own round trip (sample to acknowledgement): no
reader can see a sample before its ingest has committed. Prints the target (p99 at most
2 s), p50/p99/max of each, the ratios and how many samples no reader saw before the next
one replaced them. Asserts nothing. Run: ``.venv/bin/python bench/freshness.py [--hosts 50]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ingest import create_pg_database, drop_pg_database, gpu_uuid, register_fleet  # noqa: E402
from testkit.live import gpuroster_env, live_server  # noqa: E402

TARGET_S = 2.0
TOKEN = re.compile(rb"fresh-(\d+)-(\d+)")
PASSWORD = "bench-password"


def body(host_name: str, host: int, gpus: int, seq: int, interval: float) -> bytes:
    """One snapshot of ``host`` taken now, whose GPU 0 runs ``fresh-<host>-<seq>``."""
    devices = [{"uuid": gpu_uuid(host, g), "index": g, "name": "NVIDIA A100-SXM4-80GB",
                "pci_bus_id": f"00000000:{g + 1:02X}:00.0", "memory_total_mib": 81920.0,
                "memory_used_mib": 1024.0 * (g + 1), "utilization_gpu": float((seq + g) % 101),
                "temperature_c": 40.0 + g, "power_draw_w": 100.0 + g, "power_limit_w": 400.0} for g in range(gpus)]
    procs = [{"device_uuid": gpu_uuid(host, 0), "pid": 10_000, "type": "C", "used_memory_mib": 900.0,
              "uid": 1000, "unix_user": "user0", "command": "python train.py", "name": f"fresh-{host}-{seq}",
              "create_time": 1.7e9, "owner_status": "ok"}]
    return json.dumps({"host": host_name, "seq": seq, "collected_at": datetime.now(UTC).isoformat(),
                       "agent_version": "bench", "source": "nvml", "interval_seconds": interval,
                       "driver_version": "550.54.15", "cuda_version": "12.4", "devices": devices,
                       "processes": procs, "findings": []}).encode()


def web_cookie(url: str) -> tuple[str, str]:
    """A member with a password, signed in: (cookie name, value)."""
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.services import users as user_service
    from app.web import sessions as web_sessions

    settings = Settings(database_url=url, environment="test")
    engine = build_engine(settings)
    factory = build_session_factory(engine)
    run_in_transaction(factory, lambda s: user_service.create_user(s, username="watcher", password=PASSWORD))
    signed = run_in_transaction(factory, lambda s: web_sessions.sign_in(
        s, username="watcher", password=PASSWORD, address="127.0.0.1", settings=settings, now=datetime.now(UTC)))
    engine.dispose()
    return web_sessions.SESSION_COOKIE, signed.cookie_value


def agent(port: int, i: int, name: str, token: str, args, t0: float, stop: threading.Event,
          sampled: dict, acked: list) -> None:
    """Post a sample of host ``i`` every interval, staggered; note when each was taken and acked."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    seq, due = 0, t0 + args.interval * i / args.hosts
    while not stop.is_set():
        time.sleep(max(0.0, due - time.perf_counter()))
        seq += 1
        taken = time.perf_counter()
        sampled[(i, seq)] = taken
        conn.request("POST", "/api/v1/agent/snapshots", body=body(name, i, args.gpus, seq, args.interval),
                     headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status == 200:
            acked.append(time.perf_counter() - taken)
        due += args.interval  # a steady schedule: a slow post does not shift the next sample
    conn.close()


def reader(port: int, path: str, headers: dict[str, str], stop: threading.Event, seen: dict) -> None:
    """Poll ``path`` back to back; note when each (host, seq) first shows."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop.is_set():
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        at = time.perf_counter()
        for h, s in TOKEN.findall(data):
            seen.setdefault((int(h), int(s)), at)
    conn.close()


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))] if v else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between an agent's samples")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--postgres", action="store_true", help="a temporary PostgreSQL database instead of SQLite")
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="gpr-bench-fresh-"))
    pg_name = None
    if args.postgres:
        pg_name, url = create_pg_database()
    else:
        url = f"sqlite:///{data / 'bench.db'}"
    try:
        fleet = register_fleet(url, args.hosts, args.gpus)
        cookie_name, cookie = web_cookie(url)
        api_headers = {"Authorization": f"Bearer {fleet.admin_token}"}  # type: ignore[attr-defined]
        page_headers = {"Cookie": f"{cookie_name}={cookie}", "HX-Request": "true"}
        sampled: dict[tuple[int, int], float] = {}
        acked: list[float] = []
        api_seen: dict[tuple[int, int], float] = {}
        page_seen: dict[tuple[int, int], float] = {}
        with live_server(gpuroster_env(url, data, GPUROSTER_ENVIRONMENT="test"), migrate=False) as base:
            port = int(base.rsplit(":", 1)[1])
            stop = threading.Event()
            t0 = time.perf_counter() + 0.5
            threads = [threading.Thread(target=agent, args=(port, i, n, tok, args, t0, stop, sampled, acked), daemon=True)
                       for i, (n, tok) in enumerate(zip(fleet.names, fleet.tokens, strict=True))]
            threads += [threading.Thread(target=reader, args=(port, "/api/v1/devices", api_headers, stop, api_seen), daemon=True),
                        threading.Thread(target=reader, args=(port, "/?all=1", page_headers, stop, page_seen), daemon=True)]
            for t in threads:
                t.start()
            time.sleep(args.seconds + 0.5)
            stop.set()
            for t in threads:
                t.join(timeout=60)
    finally:
        if pg_name:
            drop_pg_database(pg_name)
    # the last sample of each host may have had no time to be read: judge samples a later one replaced
    last = {}
    for h, s in sampled:
        last[h] = max(last.get(h, 0), s)
    judged = [k for k in sampled if k[1] < last[k[0]]]
    rows = [("agent round trip (floor)", acked, 0)]
    for label, seen in (("API  GET /api/v1/devices", api_seen), ("Now  GET /?all=1 (htmx)", page_seen)):
        lat = [seen[k] - sampled[k] for k in judged if k in seen]
        rows.append((label, lat, sum(1 for k in judged if k not in seen)))
    db = "PostgreSQL" if args.postgres else "SQLite"
    print(f"freshness: {args.hosts} hosts x {args.gpus} GPUs posting every {args.interval:g} s for {args.seconds:g} s, "
          f"{db}, one serve process; {len(judged)} samples judged")
    print(f"  {'path':28s}{'p50 s':>8}{'p99 s':>8}{'max s':>8}{'not seen':>10}")
    for label, lat, missed in rows:
        print(f"  {label:28s}{pct(lat, 0.5):8.3f}{pct(lat, 0.99):8.3f}{max(lat, default=float('nan')):8.3f}{missed:>10}")
    floor = pct(acked, 0.99)
    for label, lat, _missed in rows[1:]:
        p99 = pct(lat, 0.99)
        print(f"target: {label.split()[0]} p99 at most {TARGET_S:g} s; figure {p99:.3f} s "
              f"({p99 / TARGET_S:.2f} x the target, {p99 / floor:.1f} x the agent's round trip p99 {floor:.3f} s)")
    print("  not seen: samples replaced by the host's next one before a reader's answer showed them")


if __name__ == "__main__":
    main()
