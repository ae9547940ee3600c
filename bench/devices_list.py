"""Server time of ``GET /api/v1/devices`` and ``GET /metrics`` for a large lab.

Seeds a temporary SQLite database as ``bench/render_now.py`` does (1,000 hosts x 8 GPUs by
default, 3 processes per GPU, reservations on about half the GPUs, a finding on every tenth
host), then times requests through the application in-process (ASGI, no network): the
whole device list (pages of 5,000, the API's largest), ``/metrics``, and as the baseline of
the same run ``GET /api/v1/me`` (authentication, a session and a tiny response: the floor
every API request pays). Prints the target (100 ms), the figures and the ratios. Asserts
nothing. Run: ``.venv/bin/python bench/devices_list.py [--hosts 1000] [--requests 10]``.
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
from app.main import create_app  # noqa: E402
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


def timed(client: TestClient, headers: dict[str, str], n: int, paths: list[str]) -> tuple[list[float], int]:
    """Milliseconds per round of ``paths`` (all pages of one listing) and the bytes of a round."""
    times, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        size = 0
        for p in paths:
            r = client.get(p, headers=headers)
            assert r.status_code == 200, (p, r.status_code, r.text[:200])
            size += len(r.content)
        times.append((time.perf_counter() - t0) * 1000)
    return times, size


def service_paths(factory, n: int) -> tuple[list[float], list[float]]:
    """Milliseconds to read and serialise the whole list: through the models (what the
    endpoint did before; still the path of one device's view) and from plain rows."""
    from pydantic import TypeAdapter

    from app.models import utcnow
    from app.schemas.host import DeviceRead
    from app.services import device_list, devices

    adapter = TypeAdapter(list[DeviceRead])
    model, plain = [], []
    for _ in range(n):
        with factory() as s:
            t0 = time.perf_counter()
            adapter.dump_json(devices.list_devices(s, now=utcnow()))
            model.append((time.perf_counter() - t0) * 1000)
        with factory() as s:
            t0 = time.perf_counter()
            device_list.to_json_bytes(device_list.device_list(s, now=utcnow()))
            plain.append((time.perf_counter() - t0) * 1000)
    return model, plain


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
            devs, devs_size = timed(client, headers, args.requests, pages)
            metrics, metrics_size = timed(client, headers, args.requests, ["/metrics"])
            model_ms, plain_ms = service_paths(app.state.session_factory, args.requests)
    print(f"service only, whole list: model-built view (the path before) p50 {pct(model_ms, 50):.1f} ms "
          f"(min {min(model_ms):.1f}), plain rows p50 {pct(plain_ms, 50):.1f} ms (min {min(plain_ms):.1f}) "
          f"= {pct(plain_ms, 50) / pct(model_ms, 50):.2f} x")
    print(f"{args.hosts} hosts x {args.devices} GPUs = {n_dev} devices, SQLite (seeded in {seeded:.0f} s), "
          f"{args.requests} requests each, in-process ASGI")
    print(f"  {'request':34s}{'min ms':>9}{'p50 ms':>9}{'p99 ms':>9}{'KiB':>8}{'x baseline':>12}{'target ms':>11}")
    b50 = pct(base, 50)
    print(f"  {'GET /api/v1/me (baseline)':34s}{min(base):9.1f}{b50:9.1f}{pct(base, 99):9.1f}{'':>8}{1.0:12.1f}{'':>11}")
    for label, values, size in ((f"GET /api/v1/devices ({len(pages)} pages)", devs, devs_size),
                                ("GET /metrics", metrics, metrics_size)):
        p50 = pct(values, 50)
        print(f"  {label:34s}{min(values):9.1f}{p50:9.1f}{pct(values, 99):9.1f}{size / 1024:8.0f}{p50 / b50:12.1f}{TARGET_MS:11.0f}"
              f"   {'meets' if p50 <= TARGET_MS else 'misses'} the target ({p50 / TARGET_MS:.2f} x)")


if __name__ == "__main__":
    main()
