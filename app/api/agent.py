"""``/api/v1/agent``: the agent side of the wire contract (host tokens only)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from agent.schema import Snapshot, SnapshotAck
from app.api.deps import CurrentHost, SettingsDep, WriteSessionDep
from app.services import ingest

router = APIRouter(prefix="/agent", tags=["agent"])


@router.post("/snapshots", response_model=SnapshotAck, responses={401: {}, 403: {}, 413: {}, 422: {}})
def post_snapshot(snapshot: Snapshot, host: CurrentHost, session: WriteSessionDep, settings: SettingsDep) -> Response:
    """Ingest one snapshot (idempotent by ``(host, seq)``); answers with the host's
    current and upcoming reservations, its policy and the server time.

    The ack is serialised by pydantic directly: it is built from validated rows, and
    re-validating it against ``response_model`` on every snapshot cost more than the ingest.
    """
    ack = ingest.ingest_snapshot(session, host=host, snap=snapshot, settings=settings)
    return Response(content=ack.model_dump_json(), media_type="application/json")
