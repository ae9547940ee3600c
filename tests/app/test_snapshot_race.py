"""Agents posting together, over real HTTP, to two ``gpuroster serve`` processes on one
database while members book: every snapshot is stored once, each host's latest state is its
own last snapshot, and every host's reservation table names exactly its bookings.

The servers commit the snapshots that arrive together in shared transactions (group
commit), so this drives that path with the concurrency of a lab: each agent posts its own
snapshots in turn, to either server (as behind a load balancer), and re-sends one it already
sent. The verdict comes from SQL and from the agents' own acks.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import text

from tests.app.test_race import ANSWER_TIMEOUT, _post_until_answered, _rows
from tests.conftest import future, gpu, snapshot_body
from testkit.live import gpuroster_env, live_server

pytestmark = pytest.mark.commits  # live servers, each request on its own connection

HOSTS, SEQS, MEMBERS = 16, 5, 4


def _setup(env) -> tuple[list[str], list[str]]:
    """Host tokens and member tokens, created in-process."""
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.migrate import upgrade
    from app.services import hosts as host_service
    from app.services import users as user_service

    upgrade(env["GPUROSTER_DATABASE_URL"])
    engine = build_engine(Settings(database_url=env["GPUROSTER_DATABASE_URL"]))

    def work(s):
        hosts = [host_service.create_host(s, name=f"node-{k:02d}")[1] for k in range(HOSTS)]
        members = [user_service.create_api_token(s, user=user_service.create_user(s, username=f"member{i}"))[1]
                   for i in range(MEMBERS)]
        return hosts, members

    try:
        return run_in_transaction(build_session_factory(engine), work)
    finally:
        engine.dispose()


def _uuid(k: int, i: int) -> str:
    return f"GPU-{k:04d}{i:04d}-snap-race-0000-000000000000"


def _body(k: int, seq: int) -> dict:
    """Host ``k``'s snapshot ``seq``: 2 GPUs, and on GPU 0 a process whose memory changes with
    every snapshot (so each one writes the host's process list, not only touches it)."""
    proc = {"device_uuid": _uuid(k, 0), "pid": 1000 + k, "used_memory_mib": float(100 * seq), "uid": 2000,
            "unix_user": f"member{k % MEMBERS}", "command": "python train.py", "name": "python"}
    return snapshot_body(f"node-{k:02d}", seq, [gpu(_uuid(k, i), i) for i in range(2)], [proc],
                         interval_seconds=600)


@pytest.mark.slow
def test_agents_posting_together_to_two_servers(db_url, tmp_path):
    env = gpuroster_env(db_url, tmp_path)
    host_tokens, member_tokens = _setup(env)
    base = future(2)  # within the 48 h an ack covers
    with (live_server(env, migrate=False, log=tmp_path / "a.log") as url_a,
          live_server(env, migrate=False, log=tmp_path / "b.log") as url_b):
        urls = [url_a, url_b]

        def agent(k: int) -> list[tuple[int, int, bool]]:
            """Host k's agent: seqs 1..SEQS in turn to random servers, then seq 3 again."""
            rng = random.Random(k)
            answers = []
            with httpx.Client(timeout=ANSWER_TIMEOUT) as c:
                for seq in [*range(1, SEQS + 1), 3]:
                    r = _post_until_answered(c, rng.choice(urls) + "/api/v1/agent/snapshots", db_url,
                                             json=_body(k, seq), headers={"Authorization": f"Bearer {host_tokens[k]}"})
                    assert r.status_code == 200, r.text
                    answers.append((seq, r.status_code, r.json()["duplicate"]))
            return answers

        def member(i: int) -> list[tuple[int, int]]:
            """Member i books GPU 1 of every fourth host once the host has registered it."""
            booked = []
            with httpx.Client(timeout=ANSWER_TIMEOUT) as c:
                for k in range(i, HOSTS, MEMBERS):
                    start = base + timedelta(hours=k)
                    body = {"host": f"node-{k:02d}", "devices": [_uuid(k, 1)], "start": start.isoformat(), "duration": "PT1H"}
                    for _ in range(200):  # until the host's first snapshot registered the GPU
                        r = _post_until_answered(c, urls[k % 2] + "/api/v1/reservations", db_url, json=body,
                                                 headers={"Authorization": f"Bearer {member_tokens[i]}"})
                        if r.status_code != 422:
                            break
                    assert r.status_code == 201, r.text
                    booked.append((k, r.json()["id"]))
            return booked

        with ThreadPoolExecutor(max_workers=HOSTS + MEMBERS) as pool:
            agents = [pool.submit(agent, k) for k in range(HOSTS)]
            members = [pool.submit(member, i) for i in range(MEMBERS)]
            answers = [f.result() for f in agents]
            bookings = dict(b for f in members for b in f.result())

        # one more snapshot from each host: its ack carries its reservation table
        tables = {}
        with httpx.Client(timeout=ANSWER_TIMEOUT) as c:
            for k in range(HOSTS):
                r = c.post(urls[k % 2] + "/api/v1/agent/snapshots", json=_body(k, SEQS + 1),
                           headers={"Authorization": f"Bearer {host_tokens[k]}"})
                assert r.status_code == 200, r.text
                tables[k] = [(e["id"], e["device_uuids"], e["user"]) for e in r.json()["reservations"]]

    for k, got in enumerate(answers):
        assert got == [*((s, 200, False) for s in range(1, SEQS + 1)), (3, 200, True)], (k, got)
    assert len(bookings) == HOSTS
    for k in range(HOSTS):
        assert tables[k] == [(bookings[k], [_uuid(k, 1)], f"member{k % MEMBERS}")], (k, tables[k])
    (stored,), = _rows(db_url, text("SELECT count(*) FROM host_snapshots"))
    assert stored == HOSTS * (SEQS + 1)
    hosts = dict(_rows(db_url, text("SELECT name, last_seq FROM hosts")))
    assert hosts == {f"node-{k:02d}": SEQS + 1 for k in range(HOSTS)}
    owners = _rows(db_url, text("SELECT d.uuid, h.name FROM devices d JOIN hosts h ON h.id = d.host_id"))
    assert sorted(owners) == sorted((_uuid(k, i), f"node-{k:02d}") for k in range(HOSTS) for i in range(2))
    procs = _rows(db_url, text("SELECT h.name, p.pid, p.used_memory_mib FROM device_processes p "
                               "JOIN hosts h ON h.id = p.host_id"))
    assert sorted(procs) == sorted((f"node-{k:02d}", 1000 + k, float(100 * (SEQS + 1))) for k in range(HOSTS))
