"""Reads while agents post, on SQLite: how many API reads fail, and what they cost.

Starts ``gpuroster serve`` on a fresh SQLite database, registers a fleet of hosts, then
runs two phases of the same length over keep-alive HTTP connections:

1. baseline: readers alone (``GET /api/v1/reservations``, ``/api/v1/me``, ``/api/v1/devices``
   with API tokens);
2. loaded: the same readers while agent loops post snapshots as fast as the server takes
   them (SQLite's one write lock is then held most of the time).

Each reader uses its own token, and the tokens' stored last use is reset before each phase,
so every reader's first request is one that used to write (``last_used_at``). Prints the
target (0 failed reads), the failed reads, read p50/p99 in both phases and the ratio
loaded/baseline. Asserts nothing. Run: ``.venv/bin/python bench/reads_while_posting.py``.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ingest import register_fleet  # noqa: E402
from testkit.live import gpuroster_env, live_server  # noqa: E402

READ_PATHS = ("/api/v1/reservations", "/api/v1/me", "/api/v1/devices")


def make_readers(url: str, n: int) -> list[str]:
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.services import users as user_service

    engine = build_engine(Settings(database_url=url))

    def work(s):
        out = []
        for i in range(n):
            u = user_service.create_user(s, username=f"reader{i:02d}")
            out.append(user_service.create_api_token(s, user=u, name="bench")[1])
        return out

    tokens = run_in_transaction(build_session_factory(engine), work)
    engine.dispose()
    return tokens


def reset_last_use(url: str) -> None:
    import sqlite3

    con = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
    con.execute("UPDATE api_tokens SET last_used_at = NULL")
    con.commit()
    con.close()


def loop(port: int, stop: threading.Event, next_request, out: dict) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while not stop.is_set():
        method, path, body, headers = next_request()
        t0 = time.perf_counter()
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        out["lat"].append(time.perf_counter() - t0)
        out["codes"][resp.status] = out["codes"].get(resp.status, 0) + 1
    conn.close()


def phase(port: int, tokens: list[str], fleet, agents: int, seconds: float) -> dict:
    stop = threading.Event()
    readers, posters, threads = [], [], []
    lock = threading.Lock()
    for i, tok in enumerate(tokens):
        counter = [i]

        def read(tok=tok, counter=counter):
            counter[0] += 1
            return "GET", READ_PATHS[counter[0] % len(READ_PATHS)], None, {"Authorization": f"Bearer {tok}"}

        stats = {"lat": [], "codes": {}}
        readers.append(stats)
        threads.append(threading.Thread(target=loop, args=(port, stop, read, stats), daemon=True))
    for _ in range(agents):
        def post():
            with lock:
                i, body = fleet.next_body()
            return "POST", "/api/v1/agent/snapshots", body, {"Authorization": f"Bearer {fleet.tokens[i]}",
                                                             "Content-Type": "application/json"}

        stats = {"lat": [], "codes": {}}
        posters.append(stats)
        threads.append(threading.Thread(target=loop, args=(port, stop, post, stats), daemon=True))
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(x for r in readers for x in r["lat"])
    codes: dict[int, int] = {}
    for r in readers:
        for k, v in r["codes"].items():
            codes[k] = codes.get(k, 0) + v
    posted = sum(len(p["lat"]) for p in posters)
    return {
        "reads": len(lat), "failed": sum(v for k, v in codes.items() if k >= 500), "codes": codes,
        "p50": statistics.median(lat) * 1000 if lat else float("nan"),
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan"),
        "snapshots_per_s": posted / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--agents", type=int, default=4, help="concurrent posting loops")
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="gpr-bench-reads-"))
    url = f"sqlite:///{data / 'bench.db'}"
    from app.migrate import upgrade

    upgrade(url)
    fleet = register_fleet(url, args.hosts, 8)
    tokens = make_readers(url, args.readers)
    with live_server(gpuroster_env(url, data), workers=args.workers, migrate=False) as base:
        port = int(base.rsplit(":", 1)[1])
        # every host posts once first, so the loaded phase measures steady state
        phase(port, [], fleet, args.agents, 1.0)
        reset_last_use(url)
        idle = phase(port, tokens, fleet, 0, args.seconds)
        reset_last_use(url)
        busy = phase(port, tokens, fleet, args.agents, args.seconds)
    print(f"SQLite, gpuroster serve --workers {args.workers}; {args.readers} readers, {args.agents} agent loops, "
          f"{args.hosts} hosts x 8 GPUs, {args.seconds:.0f} s per phase")
    print(f"{'phase':<22}{'reads':>7}{'failed':>8}{'p50 ms':>9}{'p99 ms':>9}{'snapshots/s':>13}  codes")
    for name, r in (("readers alone", idle), ("readers + agents", busy)):
        print(f"{name:<22}{r['reads']:>7}{r['failed']:>8}{r['p50']:>9.1f}{r['p99']:>9.1f}{r['snapshots_per_s']:>13.0f}  {r['codes']}")
    print(f"target: 0 failed reads while agents post; figure: {busy['failed']} of {busy['reads']}")
    print(f"read p99 while agents post = {busy['p99'] / idle['p99']:.2f} x readers alone "
          f"(p50 {busy['p50'] / idle['p50']:.2f} x)")


if __name__ == "__main__":
    main()
