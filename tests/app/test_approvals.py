"""Approval: a booking above a rule's threshold is pending, holds its slot, and is approved,
denied, cancelled or expires; deciders are admins and the owner's group managers; the
loser of a second decision gets a 409 naming the first (both databases)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from app.models import AuditLog, Reservation, ReservationDevice
from tests.conftest import book, future


def _threshold(client, lab, **values):
    r = client.post("/api/v1/rules", json={"scope": "default", **values}, headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    return r.json()


def _told(session_factory, username: str) -> list[str]:
    with session_factory() as s:
        return [a.detail["text"] for a in s.scalars(select(AuditLog).where(
            AuditLog.action == "notice.reservation", AuditLog.target == f"user:{username}").order_by(AuditLog.id))]


def test_booking_above_a_threshold_is_pending_and_holds_its_slot(client, lab, session_factory):
    rule = _threshold(client, lab, approval_above_devices=1)
    assert rule["approval_above_devices"] == 1
    small = book(client, lab.alice, [0], future(30))
    assert small.status_code == 201 and small.json()["state"] == "upcoming"
    start = future(50)
    big = book(client, lab.alice, [1, 2], start)
    assert big.status_code == 201, big.text
    assert big.json()["state"] == "pending" and big.json()["status"] == "pending"
    clash = book(client, lab.bob, [2], start + timedelta(minutes=30))
    assert clash.status_code == 409 and clash.json()["conflicts"][0]["id"] == big.json()["id"]
    listed = client.get("/api/v1/reservations", params={"state": "pending"}, headers=lab.bob.headers).json()
    assert [x["id"] for x in listed["items"]] == [big.json()["id"]]
    # an admin's own booking is never pending
    assert book(client, lab.admin, [0, 3], future(80)).json()["state"] == "upcoming"


def test_admin_approves_requester_told_second_approval_409_names_first(client, lab, session_factory):
    _threshold(client, lab, approval_above_seconds=3600)
    rid = book(client, lab.alice, [0], future(30), duration="PT3H").json()["id"]
    assert client.get("/api/v1/approvals", headers=lab.alice.headers).json() == []
    assert [x["id"] for x in client.get("/api/v1/approvals", headers=lab.admin.headers).json()] == [rid]
    assert client.post(f"/api/v1/reservations/{rid}/approve", headers=lab.alice.headers).status_code == 403
    ok = client.post(f"/api/v1/reservations/{rid}/approve", json={"reason": "fine"}, headers=lab.admin.headers)
    assert ok.status_code == 200 and ok.json()["state"] == "upcoming", ok.text
    again = client.post(f"/api/v1/reservations/{rid}/deny", headers=lab.admin.headers)
    assert again.status_code == 409
    doc = again.json()
    assert doc["changed_by"] == "boss" and doc["changed_action"] == "approve" and "approve by boss" in doc["detail"]
    told = _told(session_factory, "alice")
    assert len(told) == 1 and "was approved by boss: fine" in told[0]


def test_deny_frees_the_slot_and_tells_the_reason(client, lab, session_factory):
    from app.services import slot_freed

    freed: list[int] = []
    listener = lambda s, r: freed.append(r.id)  # noqa: E731
    slot_freed.subscribe(listener)
    try:
        _threshold(client, lab, approval_above_gpu_hours=2)
        start = future(30)
        rid = book(client, lab.alice, [0, 1], start, duration="PT2H").json()["id"]
        denied = client.post(f"/api/v1/reservations/{rid}/deny", json={"reason": "cluster is full"},
                             headers=lab.admin.headers)
        assert denied.status_code == 200 and denied.json()["state"] == "denied", denied.text
        assert freed == [rid]
    finally:
        slot_freed.unsubscribe(listener)
    assert book(client, lab.bob, [0], start).status_code == 201
    assert "denied by boss: cluster is full" in _told(session_factory, "alice")[-1]
    assert client.delete(f"/api/v1/reservations/{rid}", headers=lab.alice.headers).status_code == 409


def test_owner_cancels_pending_then_approval_is_409_naming_the_cancel(client, lab):
    _threshold(client, lab, approval_above_ahead_seconds=3600)
    rid = book(client, lab.alice, [0], future(30)).json()["id"]
    gone = client.delete(f"/api/v1/reservations/{rid}", headers=lab.alice.headers)
    assert gone.status_code == 200 and gone.json()["state"] == "cancelled"
    late = client.post(f"/api/v1/reservations/{rid}/approve", headers=lab.admin.headers)
    assert late.status_code == 409 and late.json()["changed_by"] == "alice" and late.json()["changed_action"] == "cancel"


def test_group_manager_decides_only_for_their_group(client, lab, make_user):
    carol = make_user("carol")
    _threshold(client, lab, approval_above_devices=1)
    g = client.post("/api/v1/groups", json={"name": "vision", "members": ["alice", "bob"]}, headers=lab.admin.headers)
    assert g.status_code == 201, g.text
    assert client.post("/api/v1/groups/vision/managers", json={"users": ["carol"]},
                       headers=lab.admin.headers).status_code == 422
    assert client.post("/api/v1/groups/vision/managers", json={"users": ["bob"]},
                       headers=lab.bob.headers).status_code == 403
    made = client.post("/api/v1/groups/vision/managers", json={"users": ["bob"]}, headers=lab.admin.headers)
    assert made.status_code == 200 and made.json() == ["bob"]
    rid = book(client, lab.alice, [0, 1], future(30)).json()["id"]
    assert [x["id"] for x in client.get("/api/v1/approvals", headers=lab.bob.headers).json()] == [rid]
    carol_rid = book(client, carol, [2, 3], future(30)).json()["id"]
    assert client.post(f"/api/v1/reservations/{carol_rid}/approve", headers=lab.bob.headers).status_code == 403
    assert client.post(f"/api/v1/reservations/{rid}/approve", headers=lab.bob.headers).json()["state"] == "upcoming"


def test_pending_reaching_its_start_expires_and_frees_the_devices(client, lab, session_factory):
    _threshold(client, lab, approval_above_devices=0)
    rid = book(client, lab.alice, [0], future(30)).json()["id"]
    past = datetime.now(UTC) - timedelta(minutes=5)
    with session_factory.begin() as s:  # its start passes while nobody decides
        s.execute(update(Reservation).where(Reservation.id == rid).values(start_at=past))
        s.execute(update(ReservationDevice).where(ReservationDevice.reservation_id == rid).values(start_at=past))
    assert client.get(f"/api/v1/reservations/{rid}", headers=lab.alice.headers).json()["state"] == "expired"
    late = client.post(f"/api/v1/reservations/{rid}/approve", headers=lab.admin.headers)
    assert late.status_code == 409 and "expired unapproved" in late.json()["detail"]
    now = book(client, lab.admin, [0], "now")
    assert now.status_code == 201, now.text
    with session_factory() as s:
        assert s.get(Reservation, rid).status == "expired"
    assert "without approval and expired" in _told(session_factory, "alice")[-1]


def test_the_sweep_expires_pending_reservations_past_their_start(app, client, lab, session_factory):
    from app.api.approvals import expire_once

    _threshold(client, lab, approval_above_devices=0)
    rid = book(client, lab.alice, [1], future(30)).json()["id"]
    keep = book(client, lab.alice, [2], future(30)).json()["id"]
    past = datetime.now(UTC) - timedelta(minutes=1)
    with session_factory.begin() as s:
        s.execute(update(Reservation).where(Reservation.id == rid).values(start_at=past))
        s.execute(update(ReservationDevice).where(ReservationDevice.reservation_id == rid).values(start_at=past))
    assert expire_once(app) == 1
    assert expire_once(app) == 0
    with session_factory() as s:
        assert s.get(Reservation, rid).status == "expired" and s.get(Reservation, keep).status == "pending"
        assert not any(i.active for i in s.scalars(select(ReservationDevice).where(ReservationDevice.reservation_id == rid)))
