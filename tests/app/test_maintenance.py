"""Maintenance: an admin's hold of a host, open-ended allowed; without override the answer
lists the conflicts (409), with it each conflicting reservation is shortened or cancelled and
its holder told why and by whom (both databases)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from app.models import AuditLog
from tests.conftest import book, future


def test_open_ended_maintenance_without_override_lists_conflicts(client, lab):
    held = book(client, lab.alice, [0], future(2)).json()["id"]
    r = client.post("/api/v1/maintenance", json={"host": "node-01", "reason": "driver update"}, headers=lab.admin.headers)
    assert r.status_code == 409, r.text
    assert [c["id"] for c in r.json()["conflicts"]] == [held]
    assert client.get(f"/api/v1/reservations/{held}", headers=lab.alice.headers).json()["state"] == "upcoming"
    member = client.post("/api/v1/maintenance", json={"host": "node-01", "reason": "x"}, headers=lab.alice.headers)
    assert member.status_code == 403


def test_override_shortens_the_running_cancels_the_later_and_tells_each(client, lab, session_factory):
    running = book(client, lab.alice, [0], "now", duration="PT4H").json()["id"]
    later = book(client, lab.bob, [1], future(30)).json()["id"]
    start = future(1)
    r = client.post("/api/v1/maintenance", json={"host": "node-01", "start": start.isoformat(), "reason": "PSU swap",
                                                 "override": True}, headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    doc = r.json()
    m = doc["maintenance"]
    assert m["kind"] == "maintenance" and m["end"].startswith("9999-12-31") and len(m["devices"]) == 4
    got = {o["id"]: o["action"] for o in doc["overridden"]}
    assert got == {running: "shortened", later: "cancelled"}
    a = client.get(f"/api/v1/reservations/{running}", headers=lab.alice.headers).json()
    assert a["state"] == "active"
    assert datetime.fromisoformat(a["end"]) == datetime.fromisoformat(m["start"]) == start
    assert client.get(f"/api/v1/reservations/{later}", headers=lab.bob.headers).json()["state"] == "cancelled"
    with session_factory() as s:
        told = {x.target: x.detail["text"] for x in s.scalars(select(AuditLog).where(AuditLog.action == "notice.reservation"))}
    assert "shortened" in told["user:alice"] and "by boss for maintenance: PSU swap" in told["user:alice"]
    assert "cancelled by boss for maintenance: PSU swap" in told["user:bob"]
    # later bookings meet the open-ended hold as an ordinary conflict; the admin ends it by release
    clash = book(client, lab.bob, [2], future(400))
    assert clash.status_code == 409 and clash.json()["conflicts"][0]["id"] == m["id"]
    gone = client.delete(f"/api/v1/reservations/{m['id']}", headers=lab.admin.headers)
    assert gone.status_code == 200 and gone.json()["state"] == "cancelled"
    assert book(client, lab.bob, [2], future(400)).status_code == 201


def test_maintenance_of_some_devices_until_a_time(client, lab):
    start = future(5)
    r = client.post("/api/v1/maintenance", json={"host": "node-01", "devices": [3], "start": start.isoformat(),
                                                 "end": (start + timedelta(hours=2)).isoformat(), "reason": "reseat"},
                    headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    assert [d["index"] for d in r.json()["maintenance"]["devices"]] == [3]
    assert book(client, lab.alice, [2], start).status_code == 201
    bad = client.post("/api/v1/maintenance", json={"host": "node-01", "start": start.isoformat(),
                                                   "end": start.isoformat(), "reason": "x"}, headers=lab.admin.headers)
    assert bad.status_code == 422 and bad.json()["field"] == "end"
