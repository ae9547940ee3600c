"""Decisions raced over HTTP with two ``gpuroster serve`` processes on one PostgreSQL: two
admins deciding one pending reservation at once, and the owner's cancel against an
approval. Always one winner; the loser's 409 names it; the audit log has exactly the
winner's change (then, for approve-then-cancel, the cancel)."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import create_engine

from app.config import normalize_database_url
from tests.conftest import gpu, snapshot_body
from tests.ops.test_lifecycle_race import _race, _story
from tests.ops.test_multiprocess import pg_env, seed, serve  # noqa: F401 - pg_env is a fixture

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
REPEATS = 4


def test_racing_decisions_have_one_winner_named_in_the_409(pg_env, tmp_path):  # noqa: F811
    who = seed(pg_env, users=("alice",), admins=("boss", "chief"), hosts=("node-01",))
    host = who.pop("node-01")
    engine = create_engine(normalize_database_url(pg_env["GPUROSTER_DATABASE_URL"]))
    with ExitStack() as stack:
        a = stack.enter_context(serve(pg_env, tmp_path / "a.log"))
        b = stack.enter_context(serve(pg_env, tmp_path / "b.log"))
        devices = [gpu(f"GPU-{i:04d}eeee-0000-0000-0000-{i:012d}", i) for i in range(2)]
        assert httpx.post(a + "/api/v1/agent/snapshots", json=snapshot_body("node-01", 1, devices), headers=host,
                          timeout=10).status_code == 200
        rule = httpx.post(a + "/api/v1/rules", json={"scope": "default", "approval_above_devices": 0},
                          headers=who["boss"], timeout=10)
        assert rule.status_code == 201, rule.text
        k = 0
        for first, second in (("approve", "approve"), ("approve", "deny"), ("deny", "deny"), ("cancel", "approve")):
            for _ in range(REPEATS):
                k += 1
                start = (datetime.now(UTC) + timedelta(days=1, hours=2 * k)).replace(second=0, microsecond=0)
                made = httpx.post(a + "/api/v1/reservations", json={"host": "node-01", "devices": [0], "duration": "PT1H",
                                                                    "start": start.isoformat()},
                                  headers=who["alice"], timeout=30)
                assert made.status_code == 201 and made.json()["state"] == "pending", made.text
                rid = made.json()["id"]
                actors = ("alice" if first == "cancel" else "boss", "chief")

                def call(url, action, actor, r=rid):
                    if action == "cancel":
                        return httpx.delete(f"{url}/api/v1/reservations/{r}", headers=who[actor], timeout=30)
                    return httpx.post(f"{url}/api/v1/reservations/{r}/{action}", headers=who[actor], timeout=30)

                res = _race([lambda: call(a, first, actors[0]), lambda: call(b, second, actors[1])])
                codes = [x.status_code for x in res]
                story = [s.action for s in _story(engine, rid)]
                if codes == [200, 200]:
                    # approve first, then the owner's cancel of the now confirmed reservation: a serial order
                    assert (first, second) == ("cancel", "approve") and story == ["reservation.approve",
                                                                                  "reservation.cancel"], story
                    continue
                assert sorted(codes) == [200, 409], (first, second, [x.text for x in res])
                win = codes.index(200)
                loser = res[1 - win].json()
                assert loser["changed_by"] == actors[win] and f"by {actors[win]}" in loser["detail"], loser
                assert story == [f"reservation.{(first, second)[win]}"], story
                final = httpx.get(f"{a}/api/v1/reservations/{rid}", headers=who["alice"], timeout=10).json()["state"]
                assert final == {"approve": "upcoming", "deny": "denied", "cancel": "cancelled"}[(first, second)[win]]
    engine.dispose()
