"""Helpers for the rules tests: rule set-up (booking over the API is ``tests.conftest.book``)."""

from __future__ import annotations


from sqlalchemy import select

from tests.conftest import book  # noqa: F401  (re-exported for the rules tests)


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
