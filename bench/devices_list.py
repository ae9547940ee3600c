"""Server time of ``GET /api/v1/devices`` and ``GET /metrics`` for a large lab.

Seeds a temporary SQLite database as ``bench/render_now.py`` does (1,000 hosts x 8 GPUs by
default, 3 processes per GPU, reservations on about half the GPUs, a finding on every tenth
host), then times requests through the application in-process (ASGI, no network): the
whole device list (pages of 5,000, the API's largest), ``/metrics``, and as the baseline of
the same run ``GET /api/v1/me`` (authentication, a session and a tiny response: the floor
every API request pays). Both answers come from per-process caches keyed on what each
request reads of the database: "warm" rows time requests while nothing changes, "cold" rows
drop the caches before every round (as right after the devices' key moved: every host read
again), and "before" times the uncached code the endpoints ran until the caches (the same
service functions, serialised and compressed as the middleware does, without the request
around them). Prints the target (100 ms), the figures and the ratios. Asserts nothing. Run: ``.venv/bin/python bench/devices_list.py [--hosts 1000] [--requests 10]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from app.config import Settings  # noqa: E402
from app.db import run_in_transaction  # noqa: E402
from app.main import create_app, install_caches  # noqa: E402
from app.migrate import upgrade  # noqa: E402
from bench.render_now import pct, seed  # noqa: E402

TARGET_MS = 100.0
PAGE = 5000


def api_token(factory) -> str:
    from app.services import users as user_service

    def work(s):
        u = user_service.create_user(s, username="bench-reader")
        return user_service.create_api_token(s, user=u, name="bench")[1]

    return run_in_transaction(factory, work)


def timed(client: TestClient, headers: dict[str, str], n: int, paths: list[str], *,
          cold: bool = False) -> tuple[list[float], int]:
    """Milliseconds per round of ``paths`` (all pages of one listing) and the bytes of a round;
    ``cold`` drops the application's caches before each round."""
    times, size = [], 0
    for _ in range(n):
        if cold:
            install_caches(client.app.state)  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        size = 0
        for p in paths:
            r = client.get(p, headers=headers)
            assert r.status_code == 200, (p, r.status_code, r.text[:200])
            size += len(r.content)
        times.append((time.perf_counter() - t0) * 1000)
    return times, size


def service_paths(factory, n: int) -> tuple[list[float], list[float], list[float]]:
    """Milliseconds of the uncached code: the whole list through the models (one device's
    view still takes that path), the whole list from plain rows (what the endpoint ran
    before the cache), the scrape (what ``/metrics`` ran before); each serialised and
    gzip-compressed per page as the middleware does."""
    from app.middleware.compression import gzip_body
    from app.services.metrics import DatabaseCollector
    from pydantic import TypeAdapter

    from app.models import utcnow
    from app.schemas.host import DeviceRead
    from app.services import device_list, devices

    adapter = TypeAdapter(list[DeviceRead])
    model, plain, scrape = [], [], []
    for _ in range(n):
        with factory() as s:
            t0 = time.perf_counter()
            adapter.dump_json(devices.list_devices(s, now=utcnow()))
            model.append((time.perf_counter() - t0) * 1000)
        with factory() as s:
            t0 = time.perf_counter()
            items = device_list.device_list(s, now=utcnow())
            for o in range(0, len(items), PAGE):
                gzip_body(device_list.to_json_bytes(items[o : o + PAGE]))
            plain.append((time.perf_counter() - t0) * 1000)
        with factory() as s:
            t0 = time.perf_counter()
            gzip_body(DatabaseCollector(s, now=utcnow()).exposition())
            scrape.append((time.perf_counter() - t0) * 1000)
    return model, plain, scrape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--requests", type=int, default=10)
    args = ap.parse_args()
    n_dev = args.hosts * args.devices
    pages = [f"/api/v1/devices?limit={PAGE}&offset={o}" for o in range(0, n_dev, PAGE)]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        settings = Settings(database_url=url, data_dir=Path(tmp), environment="test", timezone="Europe/Berlin")
        app = create_app(settings)
        with TestClient(app) as client:
            t0 = time.perf_counter()
            seed(app.state.session_factory, settings, hosts=args.hosts, n_devices=args.devices)
            headers = {"Authorization": f"Bearer {api_token(app.state.session_factory)}"}
            seeded = time.perf_counter() - t0
            timed(client, headers, 2, ["/api/v1/me", *pages, "/metrics"])  # warm-up
            base, _ = timed(client, headers, args.requests * 5, ["/api/v1/me"])
            cold_devs, _ = timed(client, headers, args.requests, pages, cold=True)
            cold_metrics, _ = timed(client, headers, args.requests, ["/metrics"], cold=True)
            timed(client, headers, 1, [*pages, "/metrics"])  # fill the caches again
            devs, devs_size = timed(client, headers, args.requests, pages)
            metrics, metrics_size = timed(client, headers, args.requests, ["/metrics"])
            model_ms, plain_ms, scrape_ms = service_paths(app.state.session_factory, args.requests)
    print(f"{args.hosts} hosts x {args.devices} GPUs = {n_dev} devices, SQLite (seeded in {seeded:.0f} s), "
          f"{args.requests} requests each, in-process ASGI, gzip accepted")
    print(f"  {'request':44s}{'min ms':>9}{'p50 ms':>9}{'p99 ms':>9}{'KiB':>8}{'x baseline':>12}{'target ms':>11}")
    b50 = pct(base, 50)
    print(f"  {'GET /api/v1/me (baseline)':44s}{min(base):9.1f}{b50:9.1f}{pct(base, 99):9.1f}{'':>8}{1.0:12.1f}{'':>11}")
    rows = (
        ("before: whole list, model-built (service)", model_ms, None),
        ("before: whole list, plain rows (service)", plain_ms, None),
        (f"GET /api/v1/devices ({len(pages)} pages), cold", cold_devs, None),
        (f"GET /api/v1/devices ({len(pages)} pages), warm", devs, devs_size),
        ("before: /metrics scrape (service)", scrape_ms, None),
        ("GET /metrics, cold", cold_metrics, None),
        ("GET /metrics, warm", metrics, metrics_size),
    )
    for label, values, size in rows:
        p50 = pct(values, 50)
        kib = f"{size / 1024:8.0f}" if size else f"{'':>8}"
        print(f"  {label:44s}{min(values):9.1f}{p50:9.1f}{pct(values, 99):9.1f}{kib}{p50 / b50:12.1f}{TARGET_MS:11.0f}"
              f"   {'meets' if p50 <= TARGET_MS else 'misses'} the target ({p50 / TARGET_MS:.2f} x)")
    print(f"  warm / before (plain rows): devices {pct(devs, 50) / pct(plain_ms, 50):.3f} x, "
          f"metrics {pct(metrics, 50) / pct(scrape_ms, 50):.3f} x")


if __name__ == "__main__":
    main()
