"""Growth: booking, placement, ingest and Now with a large history, against the same database empty.

On a fresh PostgreSQL database: 10 bench hosts x 8 GPUs, 20 users, a default rule with counted
limits (so every booking counts the owner's reservations), plus as many more hosts of 8 GPUs
("lab" hosts, reporting through the same ingest) as the rollups need to fit inside the
retention window: one row per device and minute, so 100 million rows over 89 days take 781
GPUs (98 hosts). Both databases have the same lab. Measures, in-process through the services
(one transaction per call, as a request has):

* a named-device booking (distinct future slots),
* an "any 2 GPUs" booking (placement),
* an agent snapshot (``app.services.ingest.ingest_snapshot``) of one bench host with 8 GPUs'
  telemetry and processes on two of them, each call 15 s after the last (so each adds or
  extends that host's per-minute rollups),
* the Now view's read (``app.web.now.now_view``, default page) and the API device list;

on two such databases, one of them seeded in bulk (``generate_series``, ``testkit.history``)
with ``--history`` past reservations on the bench hosts (the same statement as
``tests/app/test_query_plans.py``), ``--rollups`` per-minute usage rollups of every GPU and
``--findings-days`` days of ended findings (``--findings-per-day`` a host) on every host, then
analysed; calling each path on one database then the other, so a busy machine weighs on both
alike. Prints the target (1.2x of empty), each figure and the ratio seeded/empty, the row
counts and the seeding time. Asserts nothing.
Run: ``.venv/bin/python bench/growth.py [--history 1000000] [--rollups 100000000]
[--findings-days 90] [--calls 100]``.
"""

from __future__ import annotations

import argparse
import math
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text  # noqa: E402

from testkit.history import SEED, SEED_FINDINGS, SEED_ROLLUPS, rollup_devices_needed  # noqa: E402
from testkit.pg import PG_SERVER, _create_pg_database, _drop_pg_database, pg_available  # noqa: E402

TARGET_RATIO = 1.2
HOSTS, GPUS, USERS = 10, 8, 20
ROLLUP_CHUNK = 5_000_000  # rollup rows per committed INSERT
SNAPSHOT_STEP = timedelta(seconds=15)  # the bench agent's interval: collected_at advances this much a call


def _uuid(h: int, i: int) -> str:
    return f"GPU-{h:04d}{i:04d}-grow-0000-0000-000000000000"


def _devices(h: int, *, busy: bool = False) -> list:
    from agent.schema import DeviceReport

    return [DeviceReport(uuid=_uuid(h, i), index=i, name="NVIDIA H100", memory_total_mib=81559,
                         memory_used_mib=40000.0 if busy and i < 2 else 10.0,
                         utilization_gpu=95.0 if busy and i < 2 else 0.0, temperature_c=55.0, power_draw_w=300.0)
            for i in range(GPUS)]


@dataclass
class Db:
    """One benchmark database: its engine and sessions, the bench users, and the agent clock
    of the ingest path (``tick`` snapshots sent so far, from ``clock0``)."""

    engine: object
    factory: object
    settings: object
    user_ids: list[int]
    host_ids: list[int]
    clock0: datetime
    tick: int = 0
    lab_hosts: int = 0


def setup(url: str, lab_hosts: int) -> Db:
    """Migrate ``url`` and create the bench lab: :data:`HOSTS` bench hosts and ``lab_hosts``
    more, :data:`GPUS` GPUs each, reported once through ingest; users and the counted rule."""
    from agent.schema import Snapshot
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.migrate import upgrade
    from app.services import hosts as host_service
    from app.services import ingest
    from app.services import rule_admin as rules_service
    from app.services import users as user_service

    upgrade(url)
    settings = Settings(database_url=url, environment="test")
    engine = build_engine(settings)
    factory = build_session_factory(engine)
    now = datetime.now(UTC)

    def work(s):
        admin = user_service.create_user(s, username="bench-admin", admin=True)
        users = [user_service.create_user(s, username=f"user{i:02d}") for i in range(USERS)]
        rules_service.create_rule(s, scope="default", user=None, group=None, actor=admin,
                                  values={"max_devices": 64, "max_gpu_hours_7d": 100000})
        hosts = []
        for h in range(HOSTS + lab_hosts):
            host, _ = host_service.create_host(s, name=f"gpu{h:02d}" if h < HOSTS else f"lab{h:03d}")
            ingest.ingest_snapshot(s, host=host, snap=Snapshot(host=host.name, seq=1, collected_at=now, devices=_devices(h),
                                                                processes=[], interval_seconds=3600), settings=settings, now=now)
            hosts.append(host.id)
        return [u.id for u in users], hosts

    user_ids, host_ids = run_in_transaction(factory, work)
    return Db(engine, factory, settings, user_ids, host_ids, clock0=now, lab_hosts=lab_hosts)


def one_round(db: Db, slot: int) -> dict[str, float]:
    """Milliseconds of one call of each path; ``slot`` picks distinct devices and times."""
    from agent.schema import ProcessReport, Snapshot
    from app.db import lock_for_write
    from app.models import Host, User, utcnow
    from app.schemas.reservation import ReservationCreate
    from app.services import device_list, ingest
    from app.services import reservations as reservation_service
    from app.web.now import now_view

    factory, settings, user_ids = db.factory, db.settings, db.user_ids
    t0 = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(days=3)
    out: dict[str, float] = {}
    for label in ("named booking", "any-2 booking"):
        if label == "named booking":
            data = ReservationCreate(host=f"gpu{slot % HOSTS:02d}", devices=[slot // HOSTS % GPUS],
                                     start=(t0 + timedelta(hours=slot // (HOSTS * GPUS))).isoformat(),
                                     duration=timedelta(minutes=30))
        else:
            data = ReservationCreate(count=2, start=(t0 + timedelta(days=30, hours=slot)).isoformat(),
                                     duration=timedelta(minutes=30))
        with factory() as s:
            t = time.perf_counter()
            lock_for_write(s)
            actor = s.get(User, user_ids[slot % len(user_ids)])
            reservation_service.create_reservation(s, actor=actor, data=data, settings=settings)
            s.commit()
            out[label] = (time.perf_counter() - t) * 1000
    db.tick += 1
    h = db.tick % HOSTS
    at = db.clock0 + SNAPSHOT_STEP * db.tick
    user = f"user{db.tick % USERS:02d}"
    snap = Snapshot(host=f"gpu{h:02d}", seq=1 + db.tick, collected_at=at, devices=_devices(h, busy=True),
                    processes=[ProcessReport(device_uuid=_uuid(h, i), pid=4000 + i, used_memory_mib=39000.0, uid=2000,
                                             unix_user=user, command="python train.py", name="python",
                                             create_time=db.clock0.timestamp())
                               for i in range(2)],
                    interval_seconds=3600)
    with factory() as s:
        t = time.perf_counter()
        lock_for_write(s)
        host = s.get(Host, db.host_ids[h])
        ingest.ingest_snapshot(s, host=host, snap=snap, settings=settings, now=at)
        s.commit()
        out["agent snapshot (ingest)"] = (time.perf_counter() - t) * 1000
    with factory() as s:
        t = time.perf_counter()
        now_view(s, now=utcnow())
        out["Now view (default page)"] = (time.perf_counter() - t) * 1000
    with factory() as s:
        t = time.perf_counter()
        device_list.to_json_bytes(device_list.device_list(s, now=utcnow()))
        out["device list"] = (time.perf_counter() - t) * 1000
    return out


def seed(db: Db, *, history: int, rollups: int, findings_days: int, findings_per_day: int) -> dict[str, float]:
    """Seed ``db`` in bulk and analyse it; returns seconds per step."""
    base = datetime.now(UTC)
    took: dict[str, float] = {}
    t = time.perf_counter()
    with db.engine.begin() as c:
        for hid in db.host_ids[:HOSTS]:
            c.execute(SEED, {"host_id": hid, "n": history // HOSTS, "base": base})
    took["reservations"] = time.perf_counter() - t
    t = time.perf_counter()
    # The rows end the minute before setup's snapshots (no key of theirs is taken twice). No
    # autovacuum while loading (VACUUM ANALYZE follows) and no foreign-key trigger per row
    # (session_replication_role, superuser only: every device id is read from devices).
    with db.engine.begin() as c:
        c.execute(text("ALTER TABLE usage_rollups SET (autovacuum_enabled = false)"))
    for lo in range(0, rollups, ROLLUP_CHUNK):
        hi = min(rollups, lo + ROLLUP_CHUNK)
        with db.engine.begin() as c:
            c.execute(text("SET LOCAL session_replication_role = replica"))
            c.execute(SEED_ROLLUPS, {"lo": lo, "hi": hi, "n": rollups, "base": db.clock0})
        el = time.perf_counter() - t
        print(f"  rollups: {hi:,} of {rollups:,} in {el:.0f} s ({hi / el:,.0f} rows/s)", flush=True)
    with db.engine.begin() as c:
        c.execute(text("ALTER TABLE usage_rollups RESET (autovacuum_enabled)"))
    took["rollups"] = time.perf_counter() - t
    t = time.perf_counter()
    with db.engine.begin() as c:
        for hid in db.host_ids:
            c.execute(SEED_FINDINGS, {"host_id": hid, "days": findings_days, "per_day": findings_per_day, "base": base})
    took["findings"] = time.perf_counter() - t
    t = time.perf_counter()
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        for table in ("reservations", "reservation_devices", "usage_rollups", "findings"):
            c.execute(text(f"VACUUM ANALYZE {table}"))
    took["vacuum analyze"] = time.perf_counter() - t
    return took


def counts(db: Db) -> dict[str, int]:
    """Rows of the grown tables in ``db``."""
    with db.engine.connect() as c:
        return {t: c.scalar(text(f"SELECT count(*) FROM {t}"))
                for t in ("reservations", "reservation_devices", "usage_rollups", "findings", "devices")}


def main() -> None:
    from app.config import Settings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=1_000_000, help="past reservations to seed")
    ap.add_argument("--rollups", type=int, default=100_000_000, help="per-minute usage rollup rows to seed")
    ap.add_argument("--findings-days", type=int, default=90, help="days of ended findings to seed")
    ap.add_argument("--findings-per-day", type=int, default=4, help="findings a host and day")
    ap.add_argument("--calls", type=int, default=100, help="calls per path and phase")
    args = ap.parse_args()
    reason = pg_available()
    if reason:
        print(f"PostgreSQL not available: {reason}")
        return
    span_days = Settings(environment="test").rollup_retention_days - 1  # inside retention, a day to spare
    lab_hosts = max(0, math.ceil(rollup_devices_needed(args.rollups, days=span_days) / GPUS) - HOSTS)
    def interrupted(signum, frame):  # a kill drops the databases as Ctrl-C does
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)  # also when started in the background (SIGINT ignored there)
    names = [_create_pg_database(), _create_pg_database()]
    try:
        t = time.perf_counter()
        dbs = [setup(f"{PG_SERVER}/{n}", lab_hosts) for n in names]
        setup_s = time.perf_counter() - t
        t = time.perf_counter()
        took = seed(dbs[1], history=args.history, rollups=args.rollups, findings_days=args.findings_days,
                    findings_per_day=args.findings_per_day)
        seeded_s = time.perf_counter() - t
        rows = [counts(db) for db in dbs]
        for k in range(5):  # warm-up: statement caches, connection pools
            for db in dbs:
                one_round(db, 10_000 + k)
        # alternate empty and seeded call by call, so a busy machine weighs on both alike
        runs: list[dict[str, list[float]]] = [{}, {}]
        for k in range(args.calls):
            for i, db in enumerate(dbs):
                for path, ms in one_round(db, k).items():
                    runs[i].setdefault(path, []).append(ms)
        empty, seeded = ({p: statistics.median(v) for p, v in r.items()} for r in runs)
        for db in dbs:
            db.engine.dispose()
    finally:
        for n in names:
            _drop_pg_database(n)
    print(f"PostgreSQL, {HOSTS} bench hosts + {lab_hosts} lab hosts x {GPUS} GPUs, {USERS} users, counted rules on; "
          f"lab set up in {setup_s:.0f} s (both databases); median of {args.calls} calls")
    print(f"  seeded in {seeded_s:.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
    print(f"  {'rows before the calls':28s}{'empty':>14}{'seeded':>14}")
    for k in rows[0]:
        print(f"  {k:28s}{rows[0][k]:14,}{rows[1][k]:14,}")
    print(f"  {'path':28s}{'empty ms':>10}{'seeded ms':>11}{'ratio':>8}  target <= {TARGET_RATIO}")
    for k in empty:
        ratio = seeded[k] / empty[k]
        print(f"  {k:28s}{empty[k]:10.2f}{seeded[k]:11.2f}{ratio:8.2f}  {'meets' if ratio <= TARGET_RATIO else 'misses'}")


if __name__ == "__main__":
    main()
