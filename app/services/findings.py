"""Findings reported by agents: stored once per (host, key), updated on every snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.schema import FindingReport
from app.models import Device, Finding, Host


def record_findings(session: Session, *, host: Host, reports: Sequence[FindingReport], now: datetime) -> list[Finding]:
    """Upsert the agent's findings by ``(host, key)``; returns the rows touched."""
    if not reports:
        return []
    keys = [r.key for r in reports]
    existing = {f.key: f for f in session.scalars(select(Finding).where(Finding.host_id == host.id, Finding.key.in_(keys)))}
    uuids = {r.device_uuid for r in reports}
    dev_ids = dict(session.execute(select(Device.uuid, Device.id).where(Device.uuid.in_(uuids))).all())
    out: list[Finding] = []
    for rep in reports:
        f = existing.get(rep.key)
        if f is None:
            f = Finding(host_id=host.id, key=rep.key, first_seen_at=rep.first_seen)
            session.add(f)
        f.kind = rep.kind
        f.device_id = dev_ids.get(rep.device_uuid)
        f.pid = rep.pid
        f.create_time = rep.create_time
        f.unix_user = rep.unix_user
        f.uid = rep.uid
        f.command = rep.command
        f.container_id = rep.container_id
        f.reservation_id = rep.reservation_id
        f.holder = rep.holder
        f.message = rep.message
        if f.last_seen_at is None or rep.last_seen >= f.last_seen_at:
            f.last_seen_at = rep.last_seen
            f.state = rep.state
            f.resolved_at = now if rep.state == "resolved" else None
        out.append(f)
    return out
