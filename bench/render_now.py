"""Server time to render the Now page for 100 hosts x 8 GPUs with processes.

Seeds a temporary SQLite database through the services (hosts registered, one agent
snapshot ingested per host with 8 devices and 3 processes per device, a finding on every
tenth host, reservations holding about a third of the devices and upcoming ones on
another sixth), signs a user in, then times requests through the application in-process
(ASGI, no network): the full grid ``GET /?all=1``, the default view ``GET /`` (the first 25
hosts), and their htmx fragments (``HX-Request: true``,
the ``hosts`` block the page polls every 5 s). Each is timed warm (the page's per-host
cache filled, as between two snapshots) and, as the baseline of the same run, cold (the
cache emptied before every view, as right after every host has posted). Prints the targets
(full grid 250 ms, default view and htmx refresh 50 ms), the figures (wall and CPU ms: on a
shared machine CPU time is the steadier one) and their ratios. Figures are
machine-dependent and only printed, never asserted.

Run: ``.venv/bin/python bench/render_now.py [--hosts 100] [--devices 8] [--renders 20]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from agent.schema import DeviceReport, FindingReport, ProcessReport, Snapshot  # noqa: E402
from app.config import Settings  # noqa: E402
from app.db import run_in_transaction  # noqa: E402
from app.main import create_app  # noqa: E402
from app.migrate import upgrade  # noqa: E402
from app.services.now_state import NowCache  # noqa: E402
from app.schemas.reservation import ReservationCreate  # noqa: E402
from app.services import hosts as host_service  # noqa: E402
from app.services import ingest  # noqa: E402
from app.services import reservations as reservation_service  # noqa: E402
from app.services import users as user_service  # noqa: E402
from app.web import sessions as web_sessions  # noqa: E402

PROCS_PER_DEVICE = 3
HX = {"HX-Request": "true"}
USERS = 20


def _snapshot(name: str, h: int, n_devices: int, now: datetime) -> Snapshot:
    devices, processes, findings = [], [], []
    for i in range(n_devices):
        uuid = f"GPU-{h:04d}{i:04d}-bench-0000-0000-000000000000"
        devices.append(DeviceReport(
            uuid=uuid, index=i, name="NVIDIA H100 80GB HBM3", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            memory_total_mib=81559, memory_used_mib=1000.0 * (i + 1), utilization_gpu=float((h * 7 + i * 13) % 100),
            temperature_c=30.0 + i, power_draw_w=100.0 + 20 * i, power_limit_w=700,
        ))
        for k in range(PROCS_PER_DEVICE):
            pid = 10_000 + i * 100 + k
            processes.append(ProcessReport(
                device_uuid=uuid, pid=pid, used_memory_mib=300.0 * (k + 1), uid=2000 + (h + k) % USERS,
                unix_user=f"user{(h + k) % USERS:02d}", command=f"python train.py --shard {k}", name="python",
                create_time=1.7e9 + pid, container_id=f"{h:04x}{i:04x}{k:04x}" + "0" * 52 if k == 0 else None,
            ))
        if h % 10 == 0 and i == 0:
            findings.append(FindingReport(
                key=f"{uuid}:10000:1.0:unreserved", kind="unreserved", device_uuid=uuid, pid=10_000,
                unix_user=f"user{h % USERS:02d}", first_seen=now - timedelta(minutes=3), last_seen=now,
            ))
    return Snapshot(host=name, seq=1, collected_at=now, devices=devices, processes=processes, findings=findings,
                    interval_seconds=3600, driver_version="550.54.15", cuda_version="12.4")


def seed(factory, settings: Settings, *, hosts: int, n_devices: int) -> str:
    """Fill the database; returns a signed-in session cookie value."""
    now = datetime.now(UTC)
    users = run_in_transaction(factory, lambda s: [
        user_service.create_user(s, username=f"user{u:02d}", password=None if u else "bench-password")
        for u in range(USERS)
    ])
    for h in range(hosts):
        name = f"gpu{h:03d}"

        def work(s, name=name, h=h):
            host, _ = host_service.create_host(s, name=name)
            ingest.ingest_snapshot(s, host=host, snap=_snapshot(name, h, n_devices, now), settings=settings, now=now)
            for i in range(n_devices):
                owner = s.merge(users[(h + i) % USERS])
                if i % 3 == 0:
                    data = ReservationCreate(host=name, devices=[i], start="now", duration=timedelta(hours=4), note="bench")
                elif i % 6 == 1:
                    data = ReservationCreate(host=name, devices=[i], start=(now + timedelta(hours=6)).isoformat(),
                                             duration=timedelta(hours=2))
                else:
                    continue
                reservation_service.create_reservation(s, actor=owner, data=data, settings=settings, now=now)

        run_in_transaction(factory, work)
    signed = run_in_transaction(factory, lambda s: web_sessions.sign_in(
        s, username="user00", password="bench-password", address="127.0.0.1", settings=settings, now=datetime.now(UTC)))
    return signed.cookie_value


def timed(client: TestClient, headers: dict[str, str], n: int, url: str = "/", *,
          cold: bool = False) -> tuple[list[float], list[float], int]:
    """``n`` views of ``url``: wall ms, CPU ms of this process, response bytes; ``cold``
    empties the page's cache before each view."""
    times, cpu, size = [], [], 0
    for _ in range(n):
        if cold:
            client.app.state.now_cache = NowCache()  # type: ignore[attr-defined]
        t0, c0 = time.perf_counter(), time.process_time()
        r = client.get(url, headers=headers)
        cpu.append((time.process_time() - c0) * 1000)
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.status_code
        size = len(r.content)
    return times, cpu, size


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method; with 20 samples p99 is close to the maximum; one
    sample is every percentile)."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--renders", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        settings = Settings(database_url=url, data_dir=Path(tmp), environment="test", timezone="Europe/Berlin")
        app = create_app(settings)
        with TestClient(app) as client:
            t0 = time.perf_counter()
            cookie = seed(app.state.session_factory, settings, hosts=args.hosts, n_devices=args.devices)
            seeded = time.perf_counter() - t0
            client.cookies.set(web_sessions.SESSION_COOKIE, cookie)
            timed(client, {}, 2, "/?all=1")  # warm-up: template compilation, connection pool
            cases = (("full grid   GET /?all=1", {}, "/?all=1", 250.0),
                     ("fragment    GET /?all=1 (htmx)", HX, "/?all=1", 250.0),
                     ("default     GET / (25 hosts)", {}, "/", 50.0),
                     ("fragment    GET / (htmx)", HX, "/", 50.0))
            results = []
            for label, headers, url_, target in cases:
                cold = timed(client, headers, args.renders, url_, cold=True)
                timed(client, headers, 1, url_)  # fills the cache
                warm = timed(client, headers, args.renders, url_)
                results.append((label, target, warm, cold))
    n_dev = args.hosts * args.devices
    print(f"render Now: {args.hosts} hosts x {args.devices} devices = {n_dev} devices, "
          f"{n_dev * PROCS_PER_DEVICE} processes, SQLite (seeded in {seeded:.1f} s), {args.renders} renders each")
    print(f"  {'view':32s} {'target':>7s} {'warm p50':>9s} {'p99':>7s} {'cpu p50':>8s} {'x target':>8s}"
          f" {'cold p50':>9s} {'cpu p50':>8s} {'warm/cold':>9s} {'size':>7s}")
    for label, target, (w, wc, size), (c, cc, _s) in results:
        print(f"  {label:32s} {target:5.0f}ms {pct(w, 50):7.1f}ms {pct(w, 99):5.1f}ms {pct(wc, 50):6.1f}ms "
              f"{pct(w, 50) / target:8.2f} {pct(c, 50):7.1f}ms {pct(cc, 50):6.1f}ms {pct(w, 50) / pct(c, 50):9.2f} "
              f"{size / 1024:5.0f}KiB")
    print("  warm: the per-host cache filled (views between snapshots); cold: emptied before every view")

if __name__ == "__main__":
    main()
