"""Helpers for the rules tests: booking over the API and rule set-up."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select


def book(client, actor, devices, start, end=None, *, host="node-01", **extra):
    """POST /api/v1/reservations; ``start``/``end`` may be datetimes or strings."""
    body = {"host": host, "devices": devices, "start": start.isoformat() if isinstance(start, datetime) else start, **extra}
    if end is not None:
        body["end"] = end.isoformat() if isinstance(end, datetime) else end
    elif "duration" not in extra:
        body["duration"] = "PT1H"
    return client.post("/api/v1/reservations", json=body, headers=actor.headers)


def rule(client, admin, **body):
    """Create a rule as ``admin``; asserts 201 and returns the body."""
    r = client.post("/api/v1/rules", json=body, headers=admin.headers)
    assert r.status_code == 201, r.text
    return r.json()


def group(client, admin, name, *members):
    r = client.post("/api/v1/groups", json={"name": name, "members": list(members)}, headers=admin.headers)
    assert r.status_code == 201, r.text
    return r.json()


def usage_of(client, actor):
    r = client.get("/api/v1/me/usage", headers=actor.headers)
    assert r.status_code == 200, r.text
    return {item["rule"]: item for item in r.json()["limits"]}


def audit(session_factory, action):
    from app.models import AuditLog

    with session_factory() as s:
        return list(s.scalars(select(AuditLog).where(AuditLog.action == action).order_by(AuditLog.id)))
