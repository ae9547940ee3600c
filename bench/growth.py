"""Growth: booking, placement and Now with a large history, against the same database empty.

On a fresh PostgreSQL database: 10 hosts x 8 GPUs, 20 users, a default rule with counted
limits (so every booking counts the owner's reservations). Measures, in-process through the
services (one transaction per call, as a request has):

* a named-device booking (distinct future slots),
* an "any 2 GPUs" booking (placement),
* the Now view's read (``app.web.now.now_view``, default page) and the API device list;

on two such databases, one of them seeded with ``--history`` past reservations in bulk
(``generate_series``; the same statement as ``tests/app/test_query_plans.py``) and
analysed, calling each path on one database then the other, so a busy machine weighs on
both alike. Prints the target (1.2x of empty), each figure and the ratio seeded/empty.
Asserts nothing.
Run: ``.venv/bin/python bench/growth.py [--history 1000000] [--calls 100]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text  # noqa: E402

from testkit.history import SEED  # noqa: E402
from testkit.pg import PG_SERVER, _create_pg_database, _drop_pg_database, pg_available  # noqa: E402

TARGET_RATIO = 1.2
HOSTS, GPUS, USERS = 10, 8, 20


def setup(url: str):
    from agent.schema import DeviceReport, Snapshot
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.migrate import upgrade
    from app.services import hosts as host_service
    from app.services import ingest
    from app.services import rules as rules_service
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
        for h in range(HOSTS):
            host, _ = host_service.create_host(s, name=f"gpu{h:02d}")
            devices = [DeviceReport(uuid=f"GPU-{h:04d}{i:04d}-grow-0000-0000-000000000000", index=i, name="NVIDIA H100",
                                    memory_total_mib=81559, memory_used_mib=10.0, utilization_gpu=0.0)
                       for i in range(GPUS)]
            ingest.ingest_snapshot(s, host=host, snap=Snapshot(host=host.name, seq=1, collected_at=now, devices=devices,
                                                                processes=[], interval_seconds=3600), settings=settings, now=now)
        return [u.id for u in users]

    user_ids = run_in_transaction(factory, work)
    return engine, factory, settings, user_ids


def one_round(factory, settings, user_ids: list[int], slot: int) -> dict[str, float]:
    """Milliseconds of one call of each path; ``slot`` picks distinct devices and times."""
    from app.db import lock_for_write
    from app.models import User, utcnow
    from app.schemas.reservation import ReservationCreate
    from app.services import device_list
    from app.services import reservations as reservation_service
    from app.web.now import now_view

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
    with factory() as s:
        t = time.perf_counter()
        now_view(s, now=utcnow())
        out["Now view (default page)"] = (time.perf_counter() - t) * 1000
    with factory() as s:
        t = time.perf_counter()
        device_list.to_json_bytes(device_list.device_list(s, now=utcnow()))
        out["device list"] = (time.perf_counter() - t) * 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=1_000_000, help="past reservations to seed")
    ap.add_argument("--calls", type=int, default=100, help="calls per path and phase")
    args = ap.parse_args()
    reason = pg_available()
    if reason:
        print(f"PostgreSQL not available: {reason}")
        return
    names = [_create_pg_database(), _create_pg_database()]
    try:
        dbs = [setup(f"{PG_SERVER}/{n}") for n in names]  # (engine, factory, settings, user ids)
        t = time.perf_counter()
        with dbs[1][0].begin() as c:
            for hid in c.scalars(text("SELECT id FROM hosts ORDER BY id")).all():
                c.execute(SEED, {"host_id": hid, "n": args.history // HOSTS, "base": datetime.now(UTC)})
        with dbs[1][0].connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("VACUUM ANALYZE reservations"))
            c.execute(text("VACUUM ANALYZE reservation_devices"))
            total = c.scalar(text("SELECT count(*) FROM reservations"))
        seeded_s = time.perf_counter() - t
        for k in range(5):  # warm-up: statement caches, connection pools
            for _engine, factory, settings, users in dbs:
                one_round(factory, settings, users, 10_000 + k)
        # alternate empty and seeded call by call, so a busy machine weighs on both alike
        runs: list[dict[str, list[float]]] = [{}, {}]
        for k in range(args.calls):
            for i, (_engine, factory, settings, users) in enumerate(dbs):
                for path, ms in one_round(factory, settings, users, k).items():
                    runs[i].setdefault(path, []).append(ms)
        empty, seeded = ({p: statistics.median(v) for p, v in r.items()} for r in runs)
        for engine, *_ in dbs:
            engine.dispose()
    finally:
        for n in names:
            _drop_pg_database(n)
    print(f"PostgreSQL, {HOSTS} hosts x {GPUS} GPUs, {USERS} users, counted rules on; {total} reservations after "
          f"seeding (seeded in {seeded_s:.0f} s); median of {args.calls} calls")
    print(f"  {'path':28s}{'empty ms':>10}{'seeded ms':>11}{'ratio':>8}  target <= {TARGET_RATIO}")
    for k in empty:
        ratio = seeded[k] / empty[k]
        print(f"  {k:28s}{empty[k]:10.2f}{seeded[k]:11.2f}{ratio:8.2f}  {'meets' if ratio <= TARGET_RATIO else 'misses'}")


if __name__ == "__main__":
    main()
