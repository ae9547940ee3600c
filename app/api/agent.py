"""``/api/v1/agent``: the agent side of the wire contract (host tokens only).

``POST /snapshots`` is the service's hot path (a 1,000-host lab posts hundreds a second), so
it does not go through FastAPI's parameter machinery: each dependency of the generic route
(body, session, token check, host, settings) was its own step, the sync ones each a hop to
the worker thread pool, and that overhead was about as large as the ingest itself. Here the
body is validated from its raw bytes (:mod:`app.api.json_body`) on the event loop, and
everything that touches the database runs in one worker-thread call, in the order the
generic route had: the SQLite write turn, the write session, the host token, then the
snapshot's validation errors, the ingest, the commit, and the ack serialised to bytes. The
snapshots that arrive while one is being written share the next transaction
(:mod:`app.api.snapshot_batch`).
"""

from __future__ import annotations

from fastapi import Request, Response

from agent.schema import Snapshot, SnapshotAck
from app.routes import api_router
from app.api import json_body, snapshot_batch

router = api_router("/agent", tags=["agent"])


@router.post("/snapshots", response_model=SnapshotAck, responses={401: {}, 403: {}, 413: {}, 422: {}},
             openapi_extra={"requestBody": json_body.request_body(Snapshot)})
async def post_snapshot(request: Request) -> Response:
    """Ingest one snapshot (idempotent by ``(host, seq)``); answers with the host's
    current and upcoming reservations, its policy and the server time.

    The ack is serialised by pydantic directly: it is built from validated rows, and
    re-validating it against ``response_model`` on every snapshot cost more than the ingest.
    """
    snapshot, errors = json_body.parse(Snapshot, await request.body(), request.headers.get("content-type"))
    body = await snapshot_batch.batcher_for(request.app).ingest(request, snapshot, errors)
    return Response(content=body, media_type="application/json")

