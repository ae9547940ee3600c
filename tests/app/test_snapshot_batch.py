"""Snapshots posted together share one transaction (group commit), and each still gets its
own answer: its own ack, its own refusal (failures: ``test_snapshot_batch_failures.py``).

The requests are sent concurrently on the test client's own event loop: the first alone, and
the others once its batch has started, which is held until they have all queued behind it,
so the batches that follow are known.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from sqlalchemy import func, select

from app.api import snapshot_batch
from app.models import Device, Host, HostSnapshot
from tests.conftest import gpu, snapshot_body

URL = "/api/v1/agent/snapshots"


def _devices(k: int) -> list[dict]:
    return [gpu(f"GPU-{k:04d}cccc-0000-0000-0000-00000000000{i}", i) for i in range(2)]


class Batches(list):
    """Each batch's hosts, in order; ``started`` is set when the first batch begins."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()


def _batches(monkeypatch, app, expect_queued: int) -> Batches:
    """Record each batch's hosts; the first batch waits (up to 10 s) until ``expect_queued``
    snapshots have queued behind it."""
    sizes = Batches()
    real = snapshot_batch.ingest_batch

    def recording(items):
        if not sizes:
            sizes.started.set()
            batcher = next(iter(app.state.snapshot_batchers.values()))
            deadline = time.monotonic() + 10
            while batcher.waiting < expect_queued and time.monotonic() < deadline:
                time.sleep(0.005)
        sizes.append([i.snapshot.host if i.snapshot else "?" for i in items])
        return real(items)

    monkeypatch.setattr(snapshot_batch, "ingest_batch", recording)
    return sizes


def _post_together(client, app, batches: Batches, posts: list[tuple[str, dict | bytes]]) -> list[httpx.Response]:
    """POST each (token, body) concurrently on the client's event loop, the first alone and the
    rest once its batch has started; the answers in order."""

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as ac:
            async def one(token, body):
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                return await ac.post(URL, content=content, headers={"Authorization": f"Bearer {token}",
                                                                     "Content-Type": "application/json"})

            first = asyncio.ensure_future(one(*posts[0]))
            deadline = time.monotonic() + 10
            while not batches.started.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.002)
            rest = await asyncio.gather(*(one(t, b) for t, b in posts[1:]))
            return [await first, *rest]

    return client.portal.call(send)


def _stored(session_factory) -> dict[str, int | None]:
    with session_factory() as s:
        return dict(s.execute(select(Host.name, Host.last_seq)).all())


def test_snapshots_posted_together_share_one_transaction(client, app, make_host, session_factory, monkeypatch):
    hosts = [make_host(f"node-{k:02d}") for k in range(6)]
    sizes = _batches(monkeypatch, app, expect_queued=5)
    answers = _post_together(client, app, sizes, [(h.token, snapshot_body(h.username, 7, _devices(k)))
                                           for k, h in enumerate(hosts)])
    assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
    assert [len(b) for b in sizes] == [1, 5]
    for r in answers:
        ack = r.json()
        assert (ack["accepted"], ack["seq"], ack["duplicate"]) == (True, 7, False)
    assert _stored(session_factory) == {h.username: 7 for h in hosts}
    with session_factory() as s:
        owners = s.execute(select(Host.name, func.count(Device.id)).join(Device, Device.host_id == Host.id)
                           .group_by(Host.name)).all()
    assert dict(owners) == {h.username: 2 for h in hosts}  # each host's own devices, none crossed


def test_refused_snapshots_in_a_batch_get_their_own_errors(client, app, make_host, session_factory, monkeypatch):
    good = [make_host(f"node-{k:02d}") for k in range(3)]
    other = make_host("node-09")
    sizes = _batches(monkeypatch, app, expect_queued=5)
    posts = [
        (good[0].token, snapshot_body("node-00", 1, _devices(0))),
        (good[1].token, snapshot_body("node-01", 1, _devices(1))),
        ("gph_not-a-token-of-any-host", snapshot_body("node-05", 1, _devices(5))),  # unknown token: 401
        (other.token, snapshot_body("node-02", 1, _devices(9))),  # another host's name: 403
        (good[2].token, {**snapshot_body("node-02", 1, _devices(2)), "seq": -1}),  # invalid body: 422
        (good[2].token, snapshot_body("node-02", 2, _devices(2))),
    ]
    answers = _post_together(client, app, sizes, posts)
    assert [r.status_code for r in answers] == [200, 200, 401, 403, 422, 200], [r.text for r in answers]
    assert answers[3].json()["field"] == "host"
    assert answers[4].json()["errors"][0]["field"] == "seq"
    # node-02's two posts share a token, so they went in different batches
    assert [len(b) for b in sizes] == [1, 4, 1]
    assert _stored(session_factory) == {"node-00": 1, "node-01": 1, "node-02": 2, "node-09": None}


def test_batches_hold_at_most_the_configured_number(client, app, make_host, session_factory, monkeypatch):
    app.state.settings = app.state.settings.model_copy(update={"ingest_batch_max": 3})
    hosts = [make_host(f"node-{k:02d}") for k in range(8)]
    sizes = _batches(monkeypatch, app, expect_queued=7)
    answers = _post_together(client, app, sizes, [(h.token, snapshot_body(h.username, 1, _devices(k)))
                                           for k, h in enumerate(hosts)])
    assert [r.status_code for r in answers] == [200] * 8
    assert [len(b) for b in sizes] == [1, 3, 3, 1]
    assert _stored(session_factory) == {h.username: 1 for h in hosts}


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_a_hosts_snapshots_queued_together_are_ingested_in_turn(client, app, make_host, session_factory,
                                                                monkeypatch, order):
    host = make_host("node-01")
    other = make_host("node-02")
    sizes = _batches(monkeypatch, app, expect_queued=3)
    seqs = [1, 2, 3] if order == "forward" else [3, 2, 1]
    posts = [(other.token, snapshot_body("node-02", 1, _devices(2)))]
    posts += [(host.token, snapshot_body("node-01", s, _devices(1))) for s in seqs]
    answers = _post_together(client, app, sizes, posts)
    assert [r.status_code for r in answers] == [200] * 4
    assert [r.json()["duplicate"] for r in answers] == [False] * 4
    assert [len(b) for b in sizes] == [1, 1, 1, 1]
    # every seq was stored once: the host's own queue is never merged into one transaction
    with session_factory() as s:
        stored = sorted(s.scalars(select(HostSnapshot.seq).join(Host, Host.id == HostSnapshot.host_id)
                                  .where(Host.name == "node-01")).all())
    assert stored == [1, 2, 3]


def test_two_hosts_naming_one_new_device_are_not_batched_together(client, app, make_host, session_factory,
                                                                     monkeypatch, caplog):
    """A new device two hosts report at once goes to the host whose snapshot came first, as
    when each is ingested alone: snapshots that name a common device go in separate batches
    (so neither reads rows the other is changing), and no batch needs a retry."""
    first, a, b = make_host("node-00"), make_host("node-01"), make_host("node-02")
    shared = gpu("GPU-5555dddd-0000-0000-0000-000000000000", 1)
    sizes = _batches(monkeypatch, app, expect_queued=2)
    answers = _post_together(client, app, sizes, [
        (first.token, snapshot_body("node-00", 1, _devices(0))),
        (b.token, snapshot_body("node-02", 1, [_devices(2)[0], shared])),
        (a.token, snapshot_body("node-01", 1, [_devices(1)[0], shared])),
    ])
    assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
    assert sizes == [["node-00"], ["node-02"], ["node-01"]]
    assert "ingesting each on its own" not in caplog.text
    with session_factory() as s:
        owners = s.execute(select(Host.name).join(Device, Device.host_id == Host.id)
                           .where(Device.uuid == shared["uuid"])).scalars().all()
    assert owners == ["node-02"]  # first come, though node-01 has the lower id


def test_acks_read_for_a_batch_are_each_hosts_own(client, app, make_host, make_user, session_factory, monkeypatch):
    """A batch reads its hosts' acks in one statement; each host's ack still carries its own
    reservation table and open devices, and the lab's uid table, exactly as a lone snapshot's."""
    from sqlalchemy import update

    from app.models import User
    from tests.conftest import book, future

    hosts = [make_host(f"node-{k:02d}") for k in range(3)]
    alice = make_user("alice", unix_name="alice")
    for k, h in enumerate(hosts):
        assert client.post(URL, json=snapshot_body(h.username, 1, _devices(k)), headers=h.headers).status_code == 200
    assert book(client, alice, [1], future(1), host="node-01").status_code == 201
    assert book(client, alice, [0], future(2), host="node-02").status_code == 201
    with session_factory() as s:
        s.execute(update(User).where(User.username == "alice").values(unix_uid=2001))
        s.execute(update(Device).where(Device.uuid == _devices(2)[1]["uuid"]).values(is_open=True))
        s.commit()
    sizes = _batches(monkeypatch, app, expect_queued=2)
    batched = _post_together(client, app, sizes, [(h.token, snapshot_body(h.username, 2, _devices(k)))
                                                  for k, h in enumerate(hosts)])
    assert [len(b) for b in sizes] == [1, 2]
    alone = [client.post(URL, json=snapshot_body(h.username, 3, _devices(k)), headers=h.headers)
             for k, h in enumerate(hosts)]
    keys = ("reservations", "open_devices", "unix_uids")
    for k, (b, a) in enumerate(zip(batched, alone)):
        assert b.status_code == a.status_code == 200
        assert {x: b.json()[x] for x in keys} == {x: a.json()[x] for x in keys}, k
    got = [b.json() for b in batched]
    assert [len(x["reservations"]) for x in got] == [0, 1, 1]
    assert got[1]["reservations"][0]["device_uuids"] == [_devices(1)[1]["uuid"]]
    assert got[2]["reservations"][0]["device_uuids"] == [_devices(2)[0]["uuid"]]
    assert [x["open_devices"] for x in got] == [[], [], [_devices(2)[1]["uuid"]]]
    assert all(x["unix_uids"] == {"2001": "alice"} for x in got)


def test_a_batch_writes_every_hosts_rollups_and_check_ins(client, app, make_host, make_user, session_factory,
                                                          monkeypatch):
    """The per-minute rollups and the check-ins a batch gathers are written once for all its
    snapshots, each to its own device and booking: the same rows as snapshots ingested alone."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from app.models import Reservation, ReservationDevice, UsageRollup
    from tests.conftest import book, future

    hosts = [make_host(f"node-{k:02d}") for k in range(3)]
    alice = make_user("alice", unix_name="alice")
    for k, h in enumerate(hosts):
        assert client.post(URL, json=snapshot_body(h.username, 1, _devices(k)), headers=h.headers).status_code == 200
    booked = {}
    for k in (1, 2):  # alice's bookings of GPU 0 on node-01 and node-02, started a minute ago
        r = book(client, alice, [0], future(1), host=f"node-{k:02d}")
        assert r.status_code == 201, r.text
        booked[k] = r.json()["id"]
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    with session_factory() as s:
        for rid in booked.values():
            s.execute(update(Reservation).where(Reservation.id == rid).values(start_at=start, end_at=start + timedelta(hours=4)))
            s.execute(update(ReservationDevice).where(ReservationDevice.reservation_id == rid)
                      .values(start_at=start, end_at=start + timedelta(hours=4)))
        s.commit()

    def busy(k: int, seq: int, user: str) -> dict:
        devices = [{**d, "utilization_gpu": 10.0 * (k + 1), "memory_used_mib": 1000.0} for d in _devices(k)]
        proc = {"device_uuid": devices[0]["uuid"], "pid": 77 + k, "used_memory_mib": 1000.0, "unix_user": user,
                "uid": 3000, "name": "python"}
        return snapshot_body(f"node-{k:02d}", seq, devices, [proc])

    sizes = _batches(monkeypatch, app, expect_queued=2)
    # node-01: alice's own process (checks in); node-02: bob's process on alice's GPU (does not)
    answers = _post_together(client, app, sizes, [(hosts[0].token, busy(0, 2, "carol")),
                                                  (hosts[1].token, busy(1, 2, "alice")),
                                                  (hosts[2].token, busy(2, 2, "bob"))])
    assert [r.status_code for r in answers] == [200] * 3 and [len(b) for b in sizes] == [1, 2]
    with session_factory() as s:
        checked = dict(s.execute(select(Reservation.id, Reservation.checked_in_at)
                                 .where(Reservation.id.in_(list(booked.values())))).all())
        rollups = s.execute(select(Device.uuid, func.sum(UsageRollup.utilization_sum), func.sum(UsageRollup.samples))
                            .join(Device, Device.id == UsageRollup.device_id).group_by(Device.uuid)).all()
    assert checked[booked[1]] is not None and checked[booked[2]] is None
    # every device: its registration snapshot had no utilization, the busy one its host's
    assert sorted(rollups) == sorted((d["uuid"], 10.0 * (k + 1), 2) for k in range(3) for d in _devices(k))


def test_taken_keys_in_a_batch_are_answered_as_duplicates(client, app, make_host, session_factory,
                                                                      monkeypatch):
    """A key already taken is answered in a batch as a lone snapshot's would be: a duplicate,
    with the conflict named when the stored snapshot under that key is a different one; the
    new keys beside it are stored."""
    from datetime import UTC, datetime, timedelta

    hosts = [make_host(f"node-{k:02d}") for k in range(4)]
    at = datetime.now(UTC) - timedelta(minutes=1)
    first = [snapshot_body(h.username, 1, _devices(k), collected_at=at) for k, h in enumerate(hosts)]
    for h, body in zip(hosts, first):
        assert client.post(URL, json=body, headers=h.headers).status_code == 200
    sizes = _batches(monkeypatch, app, expect_queued=3)
    answers = _post_together(client, app, sizes, [
        (hosts[0].token, snapshot_body("node-00", 2, _devices(0))),
        (hosts[1].token, first[1]),  # re-sent: a duplicate
        (hosts[2].token, {**first[2], "collected_at": datetime.now(UTC).isoformat()}),  # seq 1 reused: a conflict
        (hosts[3].token, snapshot_body("node-03", 2, _devices(3))),
    ])
    assert [len(b) for b in sizes] == [1, 3]
    got = [(r.status_code, r.json()["seq"], r.json()["duplicate"], bool(r.json()["conflict"])) for r in answers]
    assert got == [(200, 2, False, False), (200, 1, True, False), (200, 1, True, True), (200, 2, False, False)]
    assert "already used by a snapshot collected at" in answers[2].json()["conflict"]
    assert _stored(session_factory) == {"node-00": 2, "node-01": 1, "node-02": 1, "node-03": 2}
    with session_factory() as s:
        assert s.scalar(select(func.count()).select_from(HostSnapshot)) == 6


def test_a_batched_ack_follows_a_device_index_the_snapshot_moved(client, app, make_host, make_user, monkeypatch):
    """The ack lists a reservation's devices in index order. A batch reads its acks before its
    writes, so a snapshot that moves a reserved device's index (re-enumeration after a
    reboot) has its ack read again: the same order a lone snapshot's ack has."""
    from tests.conftest import book, future

    hosts = [make_host(f"node-{k:02d}") for k in range(3)]
    alice = make_user("alice", unix_name="alice")
    for k, h in enumerate(hosts):
        assert client.post(URL, json=snapshot_body(h.username, 1, _devices(k)), headers=h.headers).status_code == 200
    assert book(client, alice, [0, 1], future(1), host="node-01").status_code == 201
    swapped = [{**d, "index": 1 - d["index"]} for d in _devices(1)]
    sizes = _batches(monkeypatch, app, expect_queued=2)
    batched = _post_together(client, app, sizes, [(hosts[0].token, snapshot_body("node-00", 2, _devices(0))),
                                                  (hosts[1].token, snapshot_body("node-01", 2, swapped)),
                                                  (hosts[2].token, snapshot_body("node-02", 2, _devices(2)))])
    assert [len(b) for b in sizes] == [1, 2]
    alone = client.post(URL, json=snapshot_body("node-01", 3, swapped), headers=hosts[1].headers)
    order = [d["uuid"] for d in sorted(swapped, key=lambda d: d["index"])]
    assert batched[1].json()["reservations"][0]["device_uuids"] == order
    assert alone.json()["reservations"][0]["device_uuids"] == order
