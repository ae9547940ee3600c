"""Every state change serialised, over HTTP, with two ``gpuroster serve`` processes on one
PostgreSQL: every pair of transitions (cancel, release, change of end, edit) fired at the same
reservation at once, one through each server. The outcome is always one a serial order would
give; where the first makes the second illegal there is one winner and a 409 naming it; the
audit log tells one consistent story. The same setup proves one "any 1 GPU" booking for two
parallel requests that share an ``Idempotency-Key``."""

from __future__ import annotations

import itertools
import threading
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import create_engine, select

from app.config import normalize_database_url
from app.models import AuditLog, Reservation
from tests.conftest import gpu, snapshot_body
from tests.ops.test_multiprocess import pg_env, seed, serve  # noqa: F401 - pg_env is a fixture

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TERMINAL = {"cancel", "release"}
UPCOMING_ACTIONS = ("cancel", "change_end", "edit")
ACTIVE_ACTIONS = ("release", "change_end", "edit")
REPEATS = 3


def _call(url: str, headers: dict, action: str, rid: int, end: datetime, n: int) -> httpx.Response:
    base = f"{url}/api/v1/reservations/{rid}"
    if action == "cancel":
        return httpx.delete(base, headers=headers, timeout=30)
    if action == "release":
        return httpx.post(base + "/release", headers=headers, timeout=30)
    if action == "change_end":
        return httpx.patch(base, json={"end": (end + timedelta(minutes=10 * n)).isoformat()}, headers=headers, timeout=30)
    return httpx.patch(base, json={"note": f"edit {n}"}, headers=headers, timeout=30)


def _race(calls):
    barrier = threading.Barrier(len(calls))
    out: list[httpx.Response | None] = [None] * len(calls)

    def go(i, fn):
        barrier.wait()
        out[i] = fn()

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _story(engine, rid: int) -> list[AuditLog]:
    with engine.connect() as c:
        rows = c.execute(select(AuditLog.action, AuditLog.actor, AuditLog.detail)
                         .where(AuditLog.target == f"reservation:{rid}").order_by(AuditLog.id)).all()
    return [r for r in rows if r.action != "reservation.create"]


def test_every_pair_of_transitions_has_one_serial_outcome(pg_env, tmp_path):  # noqa: F811 - the fixture
    people = seed(pg_env, users=("alice",), admins=("boss",), hosts=("node-01",))
    host = people.pop("node-01")
    uuids = [f"GPU-{i:04d}dddd-0000-0000-0000-{i:012d}" for i in range(1 + len(ACTIVE_ACTIONS) * 2 * REPEATS)]
    engine = create_engine(normalize_database_url(pg_env["GPUROSTER_DATABASE_URL"]))
    pairs = [("upcoming", p) for p in itertools.combinations_with_replacement(UPCOMING_ACTIONS, 2)] + \
            [("active", p) for p in itertools.combinations_with_replacement(ACTIVE_ACTIONS, 2)]
    checked = 0
    with ExitStack() as stack:
        a = stack.enter_context(serve(pg_env, tmp_path / "a.log"))
        b = stack.enter_context(serve(pg_env, tmp_path / "b.log"))
        r = httpx.post(a + "/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, [gpu(u, i) for i, u in enumerate(uuids)]),
                       headers=host, timeout=10)
        assert r.status_code == 200, r.text
        slot, fresh = itertools.count(), itertools.count()  # fresh: one GPU per active reservation
        for phase, (first, second) in pairs:
            for _ in range(REPEATS):
                k = next(slot)
                if phase == "upcoming":
                    start = (datetime.now(UTC) + timedelta(days=2, hours=3 * k)).replace(second=0, microsecond=0)
                    body = {"host": "node-01", "devices": [uuids[0]], "start": start.isoformat(), "duration": "PT1H"}
                else:
                    body = {"host": "node-01", "devices": [uuids[1 + next(fresh)]], "start": "now", "duration": "PT1H"}
                made = httpx.post(a + "/api/v1/reservations", json={**body, "user": "alice"}, headers=people["boss"], timeout=30)
                assert made.status_code == 201, made.text
                rid, end = made.json()["id"], datetime.fromisoformat(made.json()["end"])
                with engine.connect() as c:
                    seq0 = c.scalar(select(Reservation.sequence).where(Reservation.id == rid))
                res = _race([lambda x=first, r=rid, e=end: _call(a, people["alice"], x, r, e, 1),
                             lambda x=second, r=rid, e=end: _call(b, people["boss"], x, r, e, 2)])
                who = {0: "alice", 1: "boss"}
                codes = [x.status_code for x in res]
                assert set(codes) <= {200, 409}, [x.text for x in res]
                story = _story(engine, rid)
                terminal_at = [i for i, s in enumerate(story) if s.action in ("reservation.cancel", "reservation.release")]
                # nothing changes a reservation after it was cancelled or released
                assert not terminal_at or terminal_at[0] == len(story) - 1, (first, second, story)
                if {first, second} <= TERMINAL or (first == second and first in TERMINAL):
                    assert sorted(codes) == [200, 409], (first, second, codes)
                loser = [i for i, c in enumerate(codes) if c == 409]
                for i in loser:
                    doc = res[i].json()
                    winner = who[1 - i]
                    assert doc["changed_by"] == winner and f"by {winner}" in doc["detail"], doc
                    assert (first, second)[1 - i] in TERMINAL
                if not loser:
                    # both applied: one after the other, never one lost
                    with engine.connect() as c:
                        seq = c.scalar(select(Reservation.sequence).where(Reservation.id == rid))
                    assert seq == seq0 + 2, (first, second)
                    ends = [s.detail for s in story if s.action == "reservation.change_end"]
                    for before, after in zip(ends, ends[1:]):
                        assert after["from"] == before["to"], ends
                with engine.connect() as c:
                    final = c.execute(select(Reservation.status).where(Reservation.id == rid)).scalar_one()
                assert final == ("confirmed" if not terminal_at else {"upcoming": "cancelled", "active": "released"}[phase])
                checked += 1
    engine.dispose()
    assert checked == len(pairs) * REPEATS


def test_parallel_any_gpu_requests_with_one_key_book_one_gpu_across_servers(pg_env, tmp_path):  # noqa: F811 - the fixture
    who = seed(pg_env, users=("alice",), hosts=("node-01",))
    alice, host = who["alice"], who["node-01"]
    uuids = [f"GPU-{i}{i}{i}{i}eeee-0000-0000-0000-00000000000{i}" for i in range(4)]
    engine = create_engine(normalize_database_url(pg_env["GPUROSTER_DATABASE_URL"]))
    with ExitStack() as stack:
        a = stack.enter_context(serve(pg_env, tmp_path / "a.log"))
        b = stack.enter_context(serve(pg_env, tmp_path / "b.log"))
        assert httpx.post(a + "/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, [gpu(u, i) for i, u in enumerate(uuids)]),
                          headers=host, timeout=10).status_code == 200
        body = {"count": 1, "start": "now", "duration": "PT1H"}
        for n in range(3):
            key = {**alice, "Idempotency-Key": f"any-gpu-{n}"}
            res = _race([lambda url=url, key=key: httpx.post(url + "/api/v1/reservations", json=body, headers=key, timeout=30)
                         for url in (a, b, a, b)])
            codes = [x.status_code for x in res]
            assert set(codes) <= {201, 409} and 201 in codes, [x.text for x in res]
            assert len({x.json()["id"] for x in res if x.status_code == 201}) == 1
            # a retry after the race gets the first answer
            again = httpx.post(b + "/api/v1/reservations", json=body, headers=key, timeout=30)
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        with engine.connect() as c:
            assert len(c.execute(select(Reservation.id)).all()) == 3  # one GPU per key
    engine.dispose()
