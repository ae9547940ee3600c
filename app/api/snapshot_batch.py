"""Group commit for agent snapshots: the snapshots that arrive while one transaction is being
written are ingested together in the next one.

Per snapshot, the transaction itself was a large share of the service's work: taking a
connection from the pool (on PostgreSQL with its pre-ping round trip), ``BEGIN`` (on SQLite
``BEGIN IMMEDIATE``, the write lock), ``COMMIT``, and two hand-offs to the worker thread pool.
A batch pays these once. A snapshot that arrives alone is a batch of one, ingested at once, so
an idle service answers as fast as before; under load the queue that forms while a batch is
written becomes the next batch.

Each snapshot's answer is what it would get alone:

- A snapshot whose host token is refused, whose body is invalid or whose host is not the
  token's host is answered with its own error; the others go on. Those checks only read.
- Any other error (a database error, the commit failing) rolls the whole batch back, and each
  of its snapshots is then ingested in a transaction of its own, exactly as a lone snapshot,
  so each gets its own answer and a failing one cannot take the others down with it.
- A batch holds at most one snapshot per host token (a host's next snapshot waits for the
  next batch), so every snapshot sees its host as the previous one left it.
- Within a batch, hosts are written in the order of their ids, so two batches (of two serve
  processes on one PostgreSQL) take their row locks in the same order.

On SQLite a snapshot queues at most the busy timeout for its batch to start, as for any
write turn: past it, it is answered 503 busy, with nothing written.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from agent.schema import Snapshot
from app.api.deps import bearer_token, current_host
from app.db import WriteTurnBusy, request_write_wait, transaction, write_gate_for, write_turn
from app.errors import Forbidden, Unauthorized
from app.models import Host
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
    started: bool = False


def _authenticate(session: Any, item: Pending, known: dict[str, Host] | None = None) -> Host:
    """The item's host, checked as a lone snapshot is checked and in the same order (token,
    then body, then the token's host against the snapshot's); ``known``: the batch's hosts by
    token. Raises Unauthorized, Forbidden or RequestValidationError. Reads only, so a refusal
    leaves the batch's transaction clean."""
    host = current_host(item.request, session, known)
    if item.snapshot is None:
        raise RequestValidationError(item.errors)
    host_service.require_same_host(host, item.snapshot.host)
    return host


def _ack(session: Any, item: Pending, host: Host, prefetched: ingest_state.Prefetched | None = None) -> bytes:
    """Ingest the item's snapshot for ``host`` in ``session`` (with the batch's ``prefetched``
    rows); the ack as JSON bytes."""
    app = item.request.app
    ack = ingest.ingest_snapshot(session, host=host, snap=item.snapshot, settings=app.state.settings,
                                 prefetched=prefetched)
    return ack.model_dump_json().encode()


def ingest_alone(item: Pending) -> bytes:
    """Ingest one snapshot in its own transaction, committed before the answer is returned (a
    failed commit is never hidden behind a 200); raises what :func:`_authenticate` raises and
    any database error."""
    with transaction(item.request.app.state.session_factory, write=True) as session:
        return _ack(session, item, _authenticate(session, item))


Outcome = tuple[bool, Any]  # (True, ack bytes) or (False, the exception to raise)


def _alone(item: Pending) -> Outcome:
    try:
        return True, ingest_alone(item)
    except Exception as e:  # noqa: BLE001 - handed to the request, which raises it
        return False, e


def ingest_batch(items: list[Pending]) -> list[Outcome]:
    """Ingest ``items`` (distinct host tokens) in one transaction; each item's outcome, in
    order. Refused items get their error and write nothing; if anything else fails, the batch
    is rolled back and each item ingested alone (:func:`ingest_alone`). Never raises."""
    if len(items) == 1:
        return [_alone(items[0])]
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
            prefetched = ingest_state.prefetch(session, [(host.id, items[i].snapshot) for _, i, host in hosts])
            for _, i, host in hosts:
                outcomes[i] = (True, _ack(session, items[i], host, prefetched))
        return outcomes
    except Exception:  # noqa: BLE001 - every item is retried alone and gets its own answer
        log.warning("a batch of %d snapshots failed; ingesting each on its own", len(items), exc_info=True)
        return [_alone(item) for item in items]


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

    async def ingest(self, request: Request, snapshot: Snapshot | None, errors: list[dict]) -> bytes:
        """The ack (JSON bytes) for this snapshot, once its batch is committed; raises its
        error (Unauthorized, Forbidden, RequestValidationError, a database error), or
        :class:`WriteTurnBusy` on SQLite when its batch did not start within the busy timeout
        (nothing written)."""
        loop = asyncio.get_running_loop()
        item = Pending(request, snapshot, errors, loop.create_future(), bearer_token(request))
        self._queue.append(item)
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        expiry = None
        if write_gate_for(self._app) is not None:  # SQLite: bounded like any write turn
            expiry = loop.call_later(request_write_wait(self._app.state.settings), self._expire, item)
        try:
            return await item.done
        except asyncio.CancelledError:
            if not item.started:  # the client left before its batch began: nothing is written
                self._queue.remove(item)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()

    def _expire(self, item: Pending) -> None:
        """The item's wait for its batch is over: answered 503 busy unless its batch began."""
        if item.started or item.done.done():
            return
        self._queue.remove(item)
        wait = request_write_wait(self._app.state.settings)
        item.done.set_exception(WriteTurnBusy(f"no write turn within {wait:g} s: other writes hold the database"))

    def _take(self) -> list[Pending]:
        """The next batch: queued items in arrival order, one per host token."""
        batch: list[Pending] = []
        tokens: set[str | None] = set()
        rest: list[Pending] = []
        for item in self._queue:
            if len(batch) < self._max and (item.token is None or item.token not in tokens):
                tokens.add(item.token)
                item.started = True
                batch.append(item)
            else:
                rest.append(item)
        self._queue = rest
        return batch

    async def _drain(self) -> None:
        while self._queue:
            batch: list[Pending] = []
            try:
                async with write_turn(self._app, wait=None):
                    batch = self._take()
                    if not batch:
                        continue
                    outcomes = await run_in_threadpool(ingest_batch, batch)
            except BaseException as e:  # the loop is closing: nobody is left to answer
                for item in batch:
                    if not item.done.done():
                        item.done.set_exception(e if isinstance(e, Exception) else RuntimeError("shutting down"))
                raise
            for item, (ok, value) in zip(batch, outcomes):
                if item.done.done():
                    continue
                if ok:
                    item.done.set_result(value)
                else:
                    item.done.set_exception(value)


def batcher_for(app: Any) -> SnapshotBatcher:
    """This event loop's batcher of ``app`` (a server has one loop; test clients each run
    their own, and a future belongs to one loop)."""
    per_loop = app.state.snapshot_batchers
    loop = asyncio.get_running_loop()
    batcher = per_loop.get(loop)
    if batcher is None:
        batcher = per_loop[loop] = SnapshotBatcher(app, app.state.settings.ingest_batch_max)
    return batcher
