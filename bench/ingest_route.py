"""Service CPU per agent snapshot on ``POST /api/v1/agent/snapshots`` (``--route booking``:
per booking on ``POST /api/v1/reservations``), in-process, no network.

The ASGI application (middleware, routing, authentication, body parsing and validation,
ingest, commit, the ack) is driven directly by an event loop in this process, one request
at a time (``--concurrency N``: N in flight, as agents posting together, whose snapshots
share transactions), so the CPU seconds counted (``time.process_time``) are the service's alone: no
HTTP server, no load generator. That is the figure the ingest target is stated in (at most
1 ms of service CPU per snapshot); uvicorn's HTTP parsing comes on top (``bench/ingest.py``
measures the whole server). ``--route booking``: a lab member books one GPU for 10 minutes
at a time, every booking a distinct (device, slot) 30 days ahead, so each one is a whole
successful booking (authentication, device resolution, rules, conflict check, guarded
insert, commit); ``bench/booking.py`` measures rates and latencies over HTTP.

For a same-run baseline, ``--baseline REV`` (default ``HEAD``: the last commit) exports that
commit's tree into a temporary directory with ``git archive`` and runs this same measurement
against it in a subprocess, on a fresh database of the same shape; the ratio printed is
baseline CPU / this tree's CPU. ``--baseline none`` skips it.

Run: ``.venv/bin/python bench/ingest_route.py [--db sqlite,postgresql] [--baseline REV]``.
Figures are printed (medians of ``--repeat`` rounds), never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 1.0


def _code_root() -> Path:
    """The tree measured: ``GPUROSTER_BENCH_CODE`` (a baseline export) or this checkout."""
    return Path(os.environ.get("GPUROSTER_BENCH_CODE", ROOT))


def _fresh_url(kind: str, workdir: Path) -> tuple[str, str | None]:
    sys.path.insert(0, str(ROOT / "bench"))
    import ingest as whole  # noqa: PLC0415 - bench/ingest.py: its database helpers

    if kind == "postgresql":
        name, url = whole.create_pg_database()
        return url, name
    return f"sqlite:///{workdir / 'route.db'}", None


SNAPSHOTS = "/api/v1/agent/snapshots"
RESERVATIONS = "/api/v1/reservations"


async def _drive(app, requests: list[tuple[str, bytes]], statuses: list[int], path: str = SNAPSHOTS,
                 concurrency: int = 1) -> None:
    """POST each (token, body) to ``path`` of the ASGI app, ``concurrency`` requests in flight
    at a time (1: in turn), recording the status codes."""
    if concurrency > 1:
        queue = iter(requests)

        async def client() -> None:
            for one in queue:
                await _drive(app, [one], statuses, path)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return
    for token, body in requests:
        headers = [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode()),
                   (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(),
                 "root_path": "", "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 80), "state": {}}
        sent = False

        async def receive(body=body):
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app(scope, receive, send)


def _member_token(url: str) -> str:
    """A lab member's API token (created in the database at ``url``)."""
    from app.config import Settings  # noqa: PLC0415
    from app.db import build_engine, build_session_factory, run_in_transaction  # noqa: PLC0415
    from app.services import users as user_service  # noqa: PLC0415

    engine = build_engine(Settings(database_url=url, environment="test"))
    try:
        return run_in_transaction(build_session_factory(engine), lambda s: user_service.create_api_token(
            s, user=user_service.create_user(s, username="bench-member", actor="bench"), name="bench")[1])
    finally:
        engine.dispose()


def _bookings(fleet, token: str, gpus: int, first: int, count: int) -> list[tuple[str, bytes]]:
    """Bookings ``first`` .. ``first + count - 1``: each a distinct (host, GPU, 10-minute slot)."""
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    t0 = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(days=30)
    per_slot = gpus * len(fleet.names)
    out = []
    for k in range(first, first + count):
        host, dev, slot = fleet.names[(k // gpus) % len(fleet.names)], k % gpus, k // per_slot
        body = {"host": host, "devices": [dev], "start": (t0 + timedelta(minutes=10 * slot)).isoformat(), "duration": "PT10M"}
        out.append((token, json.dumps(body).encode()))
    return out


def measure(kind: str, hosts: int, gpus: int, count: int, repeat: int, profile: str | None,
            route: str = "snapshot", concurrency: int = 1) -> dict:
    """CPU ms per request (median over ``repeat`` rounds of ``count`` snapshots or bookings)
    on a fresh database."""
    sys.path.insert(0, str(ROOT / "bench"))
    import ingest as whole  # noqa: PLC0415 - puts ROOT first on sys.path: the measured tree goes before it

    sys.path.insert(0, str(_code_root()))
    from app.config import Settings  # noqa: PLC0415
    from app.main import create_app  # noqa: PLC0415

    workdir = Path(tempfile.mkdtemp(prefix="gpuroster-route-"))
    url, pg_name = _fresh_url(kind, workdir)
    try:
        fleet = whole.register_fleet(url, hosts, gpus)
        member = _member_token(url) if route == "booking" else ""
        app = create_app(Settings(database_url=url, environment="test", data_dir=str(workdir)))

        async def run() -> list[float]:
            per: list[float] = []
            async with app.router.lifespan_context(app):
                statuses: list[int] = []
                await _drive(app, [(fleet.tokens[i], b) for i, b in (fleet.next_body() for _ in range(hosts))], statuses)
                path, ok = (RESERVATIONS, 201) if route == "booking" else (SNAPSHOTS, 200)
                for r in range(repeat):
                    if route == "booking":
                        reqs = _bookings(fleet, member, gpus, r * count, count)
                    else:
                        reqs = [(fleet.tokens[i], b) for i, b in (fleet.next_body() for _ in range(count))]
                    statuses.clear()
                    prof = None
                    if profile and r == repeat - 1:
                        import cProfile  # noqa: PLC0415

                        prof = cProfile.Profile()
                        prof.enable()
                    t = time.process_time()
                    await _drive(app, reqs, statuses, path, concurrency)
                    per.append((time.process_time() - t) / count * 1000)
                    if prof is not None:
                        prof.disable()
                        prof.dump_stats(profile)
                    bad = [s for s in statuses if s != ok]
                    if bad:
                        raise RuntimeError(f"{len(bad)} answers other than {ok}, e.g. {bad[0]}")
            return per

        per = asyncio.run(run())
        import app as measured  # noqa: PLC0415

        return {"kind": kind, "ms": statistics.median(per), "rounds": per, "code": str(Path(measured.__file__).parent.parent)}
    finally:
        if pg_name:
            whole.drop_pg_database(pg_name)


def _baseline(rev: str, args: argparse.Namespace, kind: str) -> dict:
    """:func:`measure` run on commit ``rev``'s tree in a subprocess."""
    with tempfile.TemporaryDirectory(prefix="gpuroster-base-") as tree:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        env = {**os.environ, "GPUROSTER_BENCH_CODE": tree}
        out = subprocess.run([sys.executable, __file__, "--db", kind, "--hosts", str(args.hosts), "--gpus", str(args.gpus),
                              "--count", str(args.count), "--repeat", str(args.repeat), "--route", args.route,
                              "--concurrency", str(args.concurrency), "--baseline", "none", "--json"],
                             env=env, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="sqlite,postgresql")
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--count", type=int, default=1000, help="snapshots (or bookings) per round")
    p.add_argument("--route", choices=("snapshot", "booking"), default="snapshot")
    p.add_argument("--concurrency", type=int, default=1,
                   help="requests in flight at once (agents posting together); 1: one at a time")
    p.add_argument("--repeat", type=int, default=5, help="rounds; the median is printed")
    p.add_argument("--baseline", default="HEAD", help="commit measured in the same run for the ratio; 'none' to skip")
    p.add_argument("--profile", default=None, help="write a cProfile of the last round to this file")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for kind in [k.strip() for k in args.db.split(",") if k.strip()]:
        mine = measure(kind, args.hosts, args.gpus, args.count, args.repeat, args.profile, args.route, args.concurrency)
        if args.json:
            print(json.dumps(mine))
            continue
        line = (f"{kind}, {args.concurrency} in flight: service CPU per {args.route} {mine['ms']:.3f} ms (target <= {TARGET_MS:.1f} ms: "
                f"{mine['ms'] / TARGET_MS:.2f}x of it); rounds " + ", ".join(f"{x:.3f}" for x in mine["rounds"]))
        if args.baseline != "none":
            base = _baseline(args.baseline, args, kind)
            line += (f"\n  baseline {args.baseline} ({base['code']}): {base['ms']:.3f} ms per {args.route}; "
                     f"this tree uses {mine['ms'] / base['ms']:.2f}x its CPU ({base['ms'] / mine['ms']:.2f}x faster)")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
