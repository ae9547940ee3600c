"""Quota boosts: a member asks, an admin or a group manager approves or denies, the boost
raises the limit for bookings that end by its end, shows in usage, expires by time, is
audited and the member is told (both databases)."""

from __future__ import annotations

import pytest

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from app.models import AuditLog, QuotaBoost, User
from app.services.limits import resolve_limits
from tests.conftest import book, future


def _rule(client, lab, **values):
    r = client.post("/api/v1/rules", json={"scope": "default", **values}, headers=lab.admin.headers)
    assert r.status_code == 201, r.text


def _ask(client, actor, limit="max_devices", value=2, end=None, reason="paper deadline", **extra):
    end = end or (datetime.now(UTC) + timedelta(days=3)).isoformat()
    return client.post("/api/v1/boosts", json={"limit": limit, "value": value, "end": end, "reason": reason, **extra},
                       headers=actor.headers)


def _told(session_factory, username):
    with session_factory() as s:
        return [a.detail for a in s.scalars(select(AuditLog).where(
            AuditLog.action == "notice.reservation", AuditLog.target == f"user:{username}").order_by(AuditLog.id))]


def _actions(session_factory, target):
    with session_factory() as s:
        return [(a.action, a.actor) for a in s.scalars(select(AuditLog).where(AuditLog.target == target)
                                                       .order_by(AuditLog.id))]


def test_approved_boost_applies_until_its_end_and_shows_in_usage(client, lab, session_factory):
    _rule(client, lab, max_devices=1)
    assert book(client, lab.alice, [0, 1], future(2)).status_code == 403
    asked = _ask(client, lab.alice)
    assert asked.status_code == 201, asked.text
    b = asked.json()
    assert (b["state"], b["limit"], b["value"], b["unit"], b["user"]) == ("pending", "max_devices", 2, "devices", "alice")
    assert book(client, lab.alice, [0, 1], future(2)).status_code == 403  # pending changes nothing
    ok = client.post(f"/api/v1/boosts/{b['id']}/approve", json={"reason": "good luck"}, headers=lab.admin.headers)
    assert ok.status_code == 200 and ok.json()["state"] == "active" and ok.json()["decided_by"] == "boss", ok.text
    assert book(client, lab.alice, [0, 1], future(2)).status_code == 201
    # a booking that ends after the boost is checked against the rules' own limit
    late = book(client, lab.alice, [2, 3], future(24 * 3 + 2))
    assert late.status_code == 403 and late.json()["rule"] == "max_devices"
    assert book(client, lab.bob, [2, 3], future(5)).status_code == 403  # only alice's limit is raised
    usage = client.get("/api/v1/me/usage", headers=lab.alice.headers).json()
    dev = {i["rule"]: i for i in usage["limits"]}["max_devices"]
    assert (dev["limit"], dev["boosted_from"], dev["scope"]) == (2, 1, f"boost:{b['id']}")
    assert f"raised by boost {b['id']}" in dev["detail"]
    assert [x["id"] for x in usage["boosts"]] == [b["id"]] and usage["boosts"][0]["state"] == "active"
    told = _told(session_factory, "alice")
    assert len(told) == 1 and told[0]["boost"] == b["id"]
    assert "max_devices to 2 devices" in told[0]["text"] and "was approved by boss: good luck" in told[0]["text"]
    assert _actions(session_factory, f"boost:{b['id']}") == [("boost.ask", "user:alice"), ("boost.approve", "user:boss")]
    again = client.post(f"/api/v1/boosts/{b['id']}/deny", headers=lab.admin.headers)
    assert again.status_code == 409 and "already approved by boss" in again.json()["detail"]


def test_boost_expires_by_itself(client, lab, session_factory):
    _rule(client, lab, max_gpu_hours_week=2)
    b = _ask(client, lab.alice, limit="max_gpu_hours_week", value=50).json()
    assert client.post(f"/api/v1/boosts/{b['id']}/approve", headers=lab.admin.headers).status_code == 200
    with session_factory() as s:
        alice = s.scalar(select(User).where(User.username == "alice"))
        now = datetime.now(UTC)
        assert resolve_limits(s, alice, now=now)["max_gpu_hours_week"].value == 50
        after = now + timedelta(days=4)
        assert resolve_limits(s, alice, now=after)["max_gpu_hours_week"].value == 2
    with session_factory.begin() as s:  # its end passes
        s.execute(update(QuotaBoost).values(ends_at=datetime.now(UTC) - timedelta(minutes=1)))
    r = book(client, lab.alice, [0], future(2), duration="PT3H")
    assert r.status_code == 403 and r.json()["rule"] == "max_gpu_hours_week" and r.json()["limit"] == 2
    listed = client.get("/api/v1/boosts", params={"state": "expired"}, headers=lab.alice.headers).json()
    assert [x["id"] for x in listed] == [b["id"]] and listed[0]["state"] == "expired"
    assert client.get("/api/v1/boosts", params={"state": "active"}, headers=lab.alice.headers).json() == []
    assert client.get("/api/v1/me/usage", headers=lab.alice.headers).json()["boosts"] == []


def test_pending_boost_past_its_end_cannot_be_decided(client, lab, session_factory):
    _rule(client, lab, max_devices=1)
    b = _ask(client, lab.alice).json()
    with session_factory.begin() as s:
        s.execute(update(QuotaBoost).values(ends_at=datetime.now(UTC) - timedelta(minutes=1)))
    r = client.post(f"/api/v1/boosts/{b['id']}/approve", headers=lab.admin.headers)
    assert r.status_code == 409 and "without a decision" in r.json()["detail"]


def test_deny_tells_the_reason_and_raises_nothing(client, lab, session_factory):
    _rule(client, lab, max_devices=1)
    b = _ask(client, lab.alice).json()
    r = client.post(f"/api/v1/boosts/{b['id']}/deny", json={"reason": "GPUs are short this week"},
                    headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["state"] == "denied" and r.json()["decision_reason"] == "GPUs are short this week"
    assert book(client, lab.alice, [0, 1], future(2)).status_code == 403
    told = _told(session_factory, "alice")
    assert len(told) == 1 and "was denied by boss: GPUs are short this week" in told[0]["text"]
    assert ("boost.deny", "user:boss") in _actions(session_factory, f"boost:{b['id']}")
    assert client.post(f"/api/v1/boosts/{b['id']}/approve", headers=lab.admin.headers).status_code == 409


def test_group_manager_decides_for_members_not_for_themselves(client, lab, session_factory):
    _rule(client, lab, max_devices=1)
    assert client.post("/api/v1/groups", json={"name": "vision", "members": ["alice", "bob"]},
                       headers=lab.admin.headers).status_code == 201
    assert client.post("/api/v1/groups/vision/managers", json={"users": ["bob"]}, headers=lab.admin.headers).status_code == 200
    mine = _ask(client, lab.bob).json()
    hers = _ask(client, lab.alice).json()
    assert [x["id"] for x in client.get("/api/v1/boosts", params={"state": "pending"}, headers=lab.bob.headers).json()] \
        == [hers["id"], mine["id"]]
    assert [x["id"] for x in client.get("/api/v1/boosts", headers=lab.alice.headers).json()] == [hers["id"]]
    assert client.post(f"/api/v1/boosts/{mine['id']}/approve", headers=lab.bob.headers).status_code == 403
    assert client.post(f"/api/v1/boosts/{hers['id']}/approve", headers=lab.alice.headers).status_code == 403
    assert client.post(f"/api/v1/boosts/{hers['id']}/approve", headers=lab.bob.headers).status_code == 200
    assert book(client, lab.alice, [0, 1], future(2)).status_code == 201


def test_bad_requests_are_422_naming_the_field_and_write_nothing(client, lab, session_factory):
    _rule(client, lab, max_devices=2, max_duration_seconds=3600)
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    far = (datetime.now(UTC) + timedelta(days=400)).isoformat()
    cases = [
        ({"limit": "allowed_hosts"}, "limit"),
        ({"limit": "max_gpu_hours_7d", "value": 100}, "limit"),  # unlimited: nothing to raise
        ({"value": 2}, "value"),  # not above the current 2
        ({"value": 2.5}, "value"),  # devices are whole
        ({"end": past}, "end"),
        ({"end": far}, "end"),
        ({"end": "next friday"}, "end"),
        ({"reason": "   "}, "reason"),
    ]
    for change, field in cases:
        body = {"limit": "max_devices", "value": 3, "reason": "deadline",
                "end": (datetime.now(UTC) + timedelta(days=2)).isoformat(), **change}
        r = client.post("/api/v1/boosts", json=body, headers=lab.alice.headers)
        assert r.status_code == 422, (change, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert field in r.text, (change, r.text)
    with session_factory() as s:
        assert s.scalar(select(QuotaBoost.id)) is None
    assert client.post("/api/v1/boosts/999/approve", headers=lab.admin.headers).status_code == 404


def test_a_date_end_lasts_through_that_lab_day_and_idempotency_key_asks_once(client, lab, session_factory):
    _rule(client, lab, max_duration_seconds=3600)
    day = (datetime.now(UTC) + timedelta(days=5)).date()
    headers = {**lab.alice.headers, "Idempotency-Key": "boost-once-1"}
    body = {"limit": "max_duration_seconds", "value": 4 * 3600, "end": day.isoformat(), "reason": "long run"}
    first = client.post("/api/v1/boosts", json=body, headers=headers)
    second = client.post("/api/v1/boosts", json=body, headers=headers)
    assert first.status_code == second.status_code == 201 and first.json() == second.json()
    end = datetime.fromisoformat(first.json()["end"])
    from zoneinfo import ZoneInfo

    local = end.astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.date(), local.hour, local.minute) == (day + timedelta(days=1), 0, 0)
    with session_factory() as s:
        assert len(list(s.scalars(select(QuotaBoost.id)))) == 1


def test_boost_raises_a_calendar_limit(client, lab):
    _rule(client, lab, max_gpu_hours_day=1)
    start = future(24 * 2).replace(hour=9)
    assert book(client, lab.alice, [0, 1], start, duration="PT2H").status_code == 403
    b = _ask(client, lab.alice, limit="max_gpu_hours_day", value=8).json()
    assert client.post(f"/api/v1/boosts/{b['id']}/approve", headers=lab.admin.headers).status_code == 200
    assert book(client, lab.alice, [0, 1], start, duration="PT2H").status_code == 201


@pytest.mark.commits  # a decision in flight on another connection
def test_a_decision_waits_for_the_one_in_flight_and_then_gets_409(client, lab, session_factory, settings):
    """While one decision holds the boost's row lock (uncommitted), a second waits for it and
    then gets a 409 naming the first; the audit log holds one decision."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import pytest

    from app.db import lock_for_write, transaction
    from app.errors import Conflict
    from app.services import boosts as boost_service

    _rule(client, lab, max_gpu_hours_month=10)
    bid = _ask(client, lab.alice, limit="max_gpu_hours_month", value=20).json()["id"]

    def decide(username: str, approve: bool):
        with transaction(session_factory, write=True) as s:
            actor = s.scalar(select(User).where(User.username == username))
            boost_service.decide(s, actor=actor, boost_id=bid, approve=approve, reason=None, settings=settings,
                                 now=datetime.now(UTC))

    with session_factory() as first, ThreadPoolExecutor(max_workers=1) as pool:
        lock_for_write(first)
        boss = first.scalar(select(User).where(User.username == "boss"))
        boost_service.decide(first, actor=boss, boost_id=bid, approve=True, reason=None, settings=settings,
                             now=datetime.now(UTC))
        second = pool.submit(decide, "boss", False)
        time.sleep(0.5)
        assert not second.done()  # waiting for the row lock
        first.commit()
        with pytest.raises(Conflict) as e:
            second.result(timeout=30)
    assert "already approved by boss" in e.value.detail
    decisions = [a for a, _ in _actions(session_factory, f"boost:{bid}") if a in ("boost.approve", "boost.deny")]
    assert decisions == ["boost.approve"]
