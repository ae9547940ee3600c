"""Group commit when things go wrong: a snapshot that fails inside a batch is retried alone
and fails alone; a database that cannot be had answers the whole batch 503 at once; a queued
snapshot waits for its batch no longer than a request waits for the database; a client that
leaves as its wait runs out leaves the queue clean. The batches are driven as in
``tests/app/test_snapshot_batch.py``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import select

from app.api import snapshot_batch
from app.models import Host, HostSnapshot
from app.services import ingest, ingest_state
from tests.app.test_snapshot_batch import _batches, _devices, _post_together, _stored
from tests.conftest import snapshot_body


def test_a_failing_snapshot_is_retried_alone_and_fails_alone(client, app, make_host, session_factory, monkeypatch):
    hosts = [make_host(f"node-{k:02d}") for k in range(5)]
    real = ingest.ingest_snapshot

    def failing(session, *, host, snap, **kw):
        ack = real(session, host=host, snap=snap, **kw)
        if host.name == "node-03":  # after its writes: the batch must be rolled back
            raise RuntimeError("disk full")
        return ack

    monkeypatch.setattr(ingest, "ingest_snapshot", failing)
    sizes = _batches(monkeypatch, app, expect_queued=4)
    answers = _post_together(client, app, sizes, [(h.token, snapshot_body(h.username, 3, _devices(k)))
                                           for k, h in enumerate(hosts)])
    assert [r.status_code for r in answers] == [200, 200, 200, 500, 200], [r.text for r in answers]
    assert [len(b) for b in sizes] == [1, 4]
    assert _stored(session_factory) == {"node-00": 3, "node-01": 3, "node-02": 3, "node-03": None, "node-04": 3}
    with session_factory() as s:
        claimed = s.scalars(select(Host.name).join(HostSnapshot, HostSnapshot.host_id == Host.id)).all()
    assert sorted(claimed) == ["node-00", "node-01", "node-02", "node-04"]  # node-03's seq is free for its retry


def test_a_database_that_cannot_be_had_answers_the_whole_batch_at_once(client, app, make_host, session_factory,
                                                                       monkeypatch):
    """The database lost in the middle of a batch: every snapshot of it is answered 503 (the
    agents send them again), none is written, and none is tried again alone, which would make
    each wait for the database in turn while the others wait for their answers."""
    from sqlalchemy.exc import OperationalError

    hosts = [make_host(f"node-{k:02d}") for k in range(4)]
    real = ingest_state.batch_rows

    def lost(session, host_ids, uuids, now):
        if len(host_ids) > 1:
            raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))
        return real(session, host_ids, uuids, now)

    alone = []
    real_alone = snapshot_batch.ingest_alone
    monkeypatch.setattr(ingest_state, "batch_rows", lost)
    monkeypatch.setattr(snapshot_batch, "ingest_alone", lambda item: alone.append(item) or real_alone(item))
    sizes = _batches(monkeypatch, app, expect_queued=3)
    answers = _post_together(client, app, sizes, [(h.token, snapshot_body(h.username, 1, _devices(k)))
                                                  for k, h in enumerate(hosts)])
    assert [r.status_code for r in answers] == [200, 503, 503, 503], [r.text for r in answers]
    assert {r.json()["type"] for r in answers[1:]} == {"/problems/database-unavailable"}
    assert all(r.headers["retry-after"] for r in answers[1:])
    assert [len(b) for b in sizes] == [1, 3]
    assert len(alone) == 1  # only the first snapshot, a batch of one
    assert _stored(session_factory) == {"node-00": 1, "node-01": None, "node-02": None, "node-03": None}


def test_a_snapshot_waits_for_its_batch_at_most_the_database_wait(client, app, make_host, session_factory,
                                                                  monkeypatch):
    """Queued behind a batch that takes too long, a snapshot is answered 503 busy after the
    wait a request gets for the database (SQLite: the busy timeout; PostgreSQL: the pool
    timeout), with nothing written; the batch ahead of it still lands."""
    app.state.settings = app.state.settings.model_copy(update={"sqlite_busy_timeout_ms": 300,
                                                               "db_pool_timeout_seconds": 0.3})
    hosts = [make_host(f"node-{k:02d}") for k in range(3)]
    sizes = _batches(monkeypatch, app, expect_queued=0)
    real = snapshot_batch.ingest_batch

    def slow(items):
        sizes.started.set()  # the others are sent now, and queue behind this batch
        time.sleep(1.0)  # their waits run out meanwhile
        return real(items)

    monkeypatch.setattr(snapshot_batch, "ingest_batch", slow)
    t0 = time.monotonic()
    answers = _post_together(client, app, sizes, [(h.token, snapshot_body(h.username, 1, _devices(k)))
                                                  for k, h in enumerate(hosts)])
    assert [r.status_code for r in answers] == [200, 503, 503], [r.text for r in answers]
    assert {r.json()["type"] for r in answers[1:]} == {"/problems/busy"}
    assert time.monotonic() - t0 < 10
    assert [len(b) for b in sizes] == [1]  # the two expired before a batch took them
    assert _stored(session_factory) == {"node-00": 1, "node-01": None, "node-02": None}
    batcher = next(iter(app.state.snapshot_batchers.values()))
    assert batcher.waiting == 0 and batcher._drainer is None  # nothing left behind holding the loop


def test_a_wait_that_runs_out_as_its_client_leaves():
    """The expiry and the client's leaving in one step of the event loop: the request ends
    cancelled (not with an error of the queue's), and the queue is empty."""
    from types import SimpleNamespace

    from app.config import Settings

    app = SimpleNamespace(state=SimpleNamespace(settings=Settings(environment="test"), write_gates=None))

    async def scenario():
        batcher = snapshot_batch.SnapshotBatcher(app, 4)
        hold = asyncio.Event()

        async def drain_later():
            await hold.wait()

        batcher._drain = drain_later
        request = SimpleNamespace(headers={"authorization": "Bearer gph_x"})
        task = asyncio.ensure_future(batcher.ingest(request, None, []))
        await asyncio.sleep(0)
        (item,) = batcher._queue
        batcher._expire(item)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        hold.set()
        return batcher.waiting

    assert asyncio.run(scenario()) == 0
