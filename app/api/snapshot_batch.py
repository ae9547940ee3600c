"""Group commit for agent snapshots: the snapshots that arrive while one transaction is being
written are ingested together in the next one.

Per snapshot, the transaction itself was a large share of the service's work: taking a
connection from the pool (on PostgreSQL with its pre-ping round trip), ``BEGIN`` (on SQLite
``BEGIN IMMEDIATE``, the write lock), ``COMMIT``, and two hand-offs to the worker thread pool.
A batch pays these once, and reads the hosts' tokens, devices and process lists in three
statements for all of its snapshots. A snapshot that arrives alone is a batch of one,
ingested at once, so an idle service answers as fast as before; under load the queue that
forms while a batch is written becomes the next batch. One process writes its snapshots one
batch at a time, on one connection, on PostgreSQL too.

Each snapshot gets its own answer:

- A snapshot whose host token is refused, whose body is invalid or whose host is not the
  token's host is answered with its own error; the others go on. Those checks only read.
- When the database cannot be had (unreachable, every pooled connection in use past the pool
  timeout, SQLite's lock held past the busy timeout), every snapshot of the batch is answered
  503, as each would be alone, and nothing is written.
- Any other error (a conflict with another process's transaction, the commit failing, a
  defect) rolls the whole batch back, and each of its snapshots is then ingested in a
  transaction of its own, as a lone snapshot, so a failing one cannot take the others down.
- A batch holds at most one snapshot per host token (a host's next snapshot waits for the
  next batch), so every snapshot sees its host as the previous one left it; and no two
  snapshots that name a common device, so a device new to the service is registered to the
  host whose snapshot came first, as when each is ingested alone.
- Within a batch, hosts are written in the order of their ids, so two processes' batches
  mostly take their row locks in one order. Not always: a snapshot re-sent to the other
  process while the first is still writing it shares its claim with that process's batch. If
  PostgreSQL then finds a deadlock, it aborts one transaction: a batch is retried snapshot by
  snapshot, a lone snapshot is answered 503 and the agent sends it again.

A queued snapshot waits for its batch to start at most as long as a request waits for the
database elsewhere (SQLite: the busy timeout, for the write turn; PostgreSQL: the pool
timeout, for a connection); past it, it is answered 503 busy, with nothing written.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from agent.schema import Snapshot
from app.api import json_body
from app.api.deps import bearer_token, current_host
from app.db import WriteTurnBusy, database_unavailable, request_write_wait, transaction, write_gate_for, write_turn
from app.errors import Forbidden, Unauthorized
from app.models import Host, utcnow
from app.services import hosts as host_service
from app.services import ingest, ingest_state

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Pending:
    """One snapshot request waiting for its batch: the request (for its token), the validated
    snapshot or the validation errors to answer with, and the future its answer is set on
    (the ack as JSON bytes, or the exception to raise)."""

    request: Request
    snapshot: Snapshot | None
    errors: list[dict]
    done: asyncio.Future[bytes]
    token: str | None = None
    uuids: set[str] = field(default_factory=set)  # the devices the snapshot names


def _authenticate(session: Any, item: Pending, known: dict[str, Host] | None = None) -> Host:
    """The item's host, checked as a lone snapshot is checked and in the same order (token,
    then body, then the token's host against the snapshot's); ``known``: the batch's hosts by
    token. Raises Unauthorized, Forbidden or RequestValidationError. Reads only, so a refusal
    leaves the batch's transaction clean."""
    host = current_host(item.request, session, known)
    host_service.require_same_host(host, json_body.require(item.snapshot, item.errors).host)
    return host


def _ack(session: Any, item: Pending, host: Host, batch: ingest_state.BatchRows | None = None,
         now: datetime | None = None) -> bytes:
    """Ingest the item's snapshot for ``host`` in ``session`` (in ``batch``, received at the
    batch's ``now``); the ack as JSON bytes."""
    app = item.request.app
    ack = ingest.ingest_snapshot(session, host=host, snap=item.snapshot, settings=app.state.settings,
                                 batch=batch, now=now)
    return ack.model_dump_json().encode()


def ingest_alone(item: Pending) -> bytes:
    """Ingest one snapshot in its own transaction, committed before the answer is returned (a
    failed commit is never hidden behind a 200); raises what :func:`_authenticate` raises and
    any database error."""
    with transaction(item.request.app.state.session_factory, write=True) as session:
        return _ack(session, item, _authenticate(session, item))


Outcome = tuple[bool, Any]  # (True, ack bytes) or (False, the exception to raise)


def _each(exc: Exception) -> Exception:
    """A copy of ``exc`` for one more request to raise (each request's traceback is its own)."""
    try:
        return copy.copy(exc)
    except Exception:  # noqa: BLE001 - an exception that cannot be copied is shared
        return exc


def _each_alone(items: list[Pending]) -> list[Outcome]:
    """Each item ingested alone, in order; once one finds the database unavailable, the rest
    get the same answer without waiting for it again."""
    out: list[Outcome] = []
    for n, item in enumerate(items):
        try:
            out.append((True, ingest_alone(item)))
        except Exception as e:  # noqa: BLE001 - handed to the request, which raises it
            out.append((False, e))
            if database_unavailable(e):
                out.extend((False, _each(e)) for _ in items[n + 1:])
                break
    return out


def ingest_batch(items: list[Pending]) -> list[Outcome]:
    """Ingest ``items`` (distinct host tokens, no device named by two of them) in one
    transaction; each item's outcome, in order. Refused items get their error and write
    nothing; if the database cannot be had, every item gets that error; if anything else
    fails, the batch is rolled back and each item ingested alone (:func:`ingest_alone`).
    Raises nothing but what is not an ``Exception`` (cancellation, exit)."""
    if len(items) == 1:
        return _each_alone(items)
    outcomes: list[Outcome] = [(False, None)] * len(items)
    try:
        with transaction(items[0].request.app.state.session_factory, write=True) as session:
            known = host_service.hosts_for_tokens(session, [i.token for i in items if i.token])
            hosts: list[tuple[int, int, Host]] = []
            for i, item in enumerate(items):
                try:
                    host = _authenticate(session, item, known)
                except (Unauthorized, Forbidden, RequestValidationError) as e:
                    outcomes[i] = (False, e)
                    continue
                hosts.append((host.id, i, host))
            hosts.sort(key=lambda h: h[0])
            now = utcnow()  # the batch's snapshots were all received by now: one clock for its rows and acks
            batch = ingest_state.batch_rows(session, [host.id for _, _, host in hosts],
                                            set().union(*(items[i].uuids for _, i, _ in hosts)), now)
            for _, i, host in hosts:
                outcomes[i] = (True, _ack(session, items[i], host, batch, now))
            ingest.write_batch(session, batch)
        return outcomes
    except Exception as e:  # noqa: BLE001 - every item gets an answer of its own
        if database_unavailable(e):
            return [(False, _each(e)) for _ in items]
        log.warning("a batch of %d snapshots failed; ingesting each on its own", len(items), exc_info=True)
        return _each_alone(items)


class SnapshotBatcher:
    """The snapshots of one event loop waiting to be ingested, and the task that ingests them
    in batches of at most ``max_batch`` (one running at a time per process and loop)."""

    def __init__(self, app: Any, max_batch: int) -> None:
        self._app = app
        self._max = max_batch
        self._queue: list[Pending] = []
        self._drainer: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        """Snapshots queued for a batch that has not started."""
        return len(self._queue)

    def _start_wait(self) -> float:
        """Seconds a snapshot may queue for its batch to start: what a request waits for the
        database elsewhere (SQLite: its write turn, the busy timeout; PostgreSQL: a pooled
        connection, the pool timeout)."""
        settings = self._app.state.settings
        return request_write_wait(settings) if write_gate_for(self._app) is not None else settings.db_pool_timeout_seconds

    async def ingest(self, request: Request, snapshot: Snapshot | None, errors: list[dict]) -> bytes:
        """The ack (JSON bytes) for this snapshot, once its batch is committed; raises its
        error (Unauthorized, Forbidden, RequestValidationError, a database error), or
        :class:`WriteTurnBusy` when its batch did not start within :meth:`_start_wait`
        (nothing written)."""
        loop = asyncio.get_running_loop()
        item = Pending(request, snapshot, errors, loop.create_future(), bearer_token(request),
                       ingest_state.snapshot_uuids(snapshot) if snapshot is not None else set())
        self._queue.append(item)
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        expiry = loop.call_later(self._start_wait(), self._expire, item)
        try:
            return await item.done
        except asyncio.CancelledError:
            self._unqueue(item)  # the client left before its batch began: nothing is written
            raise
        finally:
            expiry.cancel()

    def _unqueue(self, item: Pending) -> bool:
        """Take ``item`` out of the queue if its batch has not started (a batch takes its items
        out of the queue); whether it was there."""
        try:
            self._queue.remove(item)
        except ValueError:
            return False
        return True

    def _expire(self, item: Pending) -> None:
        """The item's wait for its batch is over: answered 503 busy unless its batch began."""
        if item.done.done() or not self._unqueue(item):
            return
        item.done.set_exception(WriteTurnBusy(f"no write turn within {self._start_wait():g} s: other writes hold "
                                              "the database"))

    def _take(self) -> list[Pending]:
        """The next batch: queued items in arrival order, one per host token, none naming a
        device an earlier one in the batch names."""
        batch: list[Pending] = []
        tokens: set[str | None] = set()
        named: set[str] = set()
        rest: list[Pending] = []
        for item in self._queue:
            if len(batch) < self._max and item.token not in tokens and named.isdisjoint(item.uuids):
                tokens.add(item.token)
                named |= item.uuids
                batch.append(item)
            else:
                rest.append(item)
        self._queue = rest
        return batch

    async def _drain(self) -> None:
        batch: list[Pending] = []
        try:
            while self._queue:
                async with write_turn(self._app, wait=None):
                    batch = self._take()
                    if not batch:
                        continue
                    try:
                        outcomes = await run_in_threadpool(ingest_batch, batch)
                    except Exception as e:  # noqa: BLE001 - a defect: ingest_batch answers every item itself
                        log.exception("ingesting a batch of %d snapshots failed", len(batch))
                        outcomes = [(False, _each(e)) for _ in batch]
                for item, (ok, value) in zip(batch, outcomes):
                    if not item.done.done():
                        item.done.set_result(value) if ok else item.done.set_exception(value)
                batch = []
        except BaseException:  # cancelled (the event loop is closing): nobody will write the rest
            for item in [*batch, *self._queue]:
                if not item.done.done():
                    item.done.set_exception(RuntimeError("the service stopped before this snapshot was written"))
            self._queue.clear()
            raise
        finally:
            self._drainer = None  # a finished task keeps its event loop alive: let both go


def batcher_for(app: Any) -> SnapshotBatcher:
    """This event loop's batcher of ``app`` (a server has one loop; test clients each run
    their own, and a future belongs to one loop)."""
    per_loop = app.state.snapshot_batchers
    loop = asyncio.get_running_loop()
    batcher = per_loop.get(loop)
    if batcher is None:
        batcher = per_loop[loop] = SnapshotBatcher(app, app.state.settings.ingest_batch_max)
    return batcher
