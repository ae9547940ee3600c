"""``/api/v1/agent``: the agent side of the wire contract (host tokens only)."""

from __future__ import annotations

from fastapi import APIRouter

from agent.schema import Snapshot, SnapshotAck
from app.api.deps import CurrentHost, SettingsDep, WriteSessionDep
from app.services import ingest

router = APIRouter(prefix="/agent", tags=["agent"])


@router.post("/snapshots", response_model=SnapshotAck, responses={401: {}, 403: {}, 413: {}, 422: {}})
def post_snapshot(snapshot: Snapshot, host: CurrentHost, session: WriteSessionDep, settings: SettingsDep) -> SnapshotAck:
    """Ingest one snapshot (idempotent by ``(host, seq)``); answers with the host's
    current and upcoming reservations, its policy and the server time."""
    return ingest.ingest_snapshot(session, host=host, snap=snapshot, settings=settings)
