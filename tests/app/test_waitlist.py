"""Waitlist over the API (both databases): entries are served first come, first served when
a reservation frees devices; auto-book goes through the rules (a refusal leaves the entry
waiting and the next one gets the slot); notify-only tells with a link; entries expire with
their window; owners list and cancel their own; bad input is a 4xx naming the field;
four cancels at once serve one entry once (on PostgreSQL, in parallel)."""

from __future__ import annotations

import pytest

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from app.models import AuditLog, Reservation, WaitlistEntry
from app.timeutil import fmt_local
from tests.conftest import book, future


def _entry(client, actor, start, end=None, *, count=1, duration="PT1H", **extra):
    body = {"count": count, "duration": duration, "start": start.isoformat() if isinstance(start, datetime) else start,
            **({"end": end.isoformat()} if end is not None else {}), **extra}
    return client.post("/api/v1/waitlist", json=body, headers=actor.headers)


def _told(session_factory, username: str) -> list[str]:
    with session_factory() as s:
        return [a.detail["text"] for a in s.scalars(select(AuditLog).where(
            AuditLog.action == "notice.reservation", AuditLog.target == f"user:{username}").order_by(AuditLog.id))]


def _get(client, actor, eid):
    r = client.get(f"/api/v1/waitlist/{eid}", headers=actor.headers)
    assert r.status_code == 200, r.text
    return r.json()


def _full(client, lab, start, hours=4, *, bob_devices=(0,)):
    """bob holds ``bob_devices`` and the admin every other GPU of node-01 for ``[start, start+hours)``."""
    held = book(client, lab.bob, list(bob_devices), start, duration=f"PT{hours}H")
    assert held.status_code == 201, held.text
    rest = [i for i in range(4) if i not in bob_devices]
    assert book(client, lab.admin, rest, start, duration=f"PT{hours}H").status_code == 201
    return held.json()["id"]


def test_first_entry_is_served_first_and_the_next_keeps_waiting(client, lab, make_user, session_factory):
    carol = make_user("carol")
    s = future(5)
    bobs = _full(client, lab, s)
    # both want GPU-hours that only the whole freed stretch holds: one of them can have it
    first = _entry(client, lab.alice, s, s + timedelta(hours=3), duration="PT3H", book=True)
    assert first.status_code == 201, first.text
    assert first.json()["state"] == "waiting" and first.json()["position"] == 1
    assert first.headers["location"] == f"/api/v1/waitlist/{first.json()['id']}"
    second = _entry(client, carol, s, s + timedelta(hours=3), duration="PT3H", book=True).json()
    assert second["state"] == "waiting" and second["position"] == 2
    assert client.delete(f"/api/v1/reservations/{bobs}", headers=lab.bob.headers).status_code == 200
    got = _get(client, lab.alice, first.json()["id"])
    assert got["state"] == "booked" and got["position"] is None
    r = client.get(f"/api/v1/reservations/{got['reservation_id']}", headers=lab.alice.headers).json()
    assert r["user"] == "alice" and r["state"] == "upcoming" and [d["index"] for d in r["devices"]] == [0]
    assert datetime.fromisoformat(r["start"]) == s and datetime.fromisoformat(r["end"]) == s + timedelta(hours=3)
    waiting = _get(client, carol, second["id"])
    assert waiting["state"] == "waiting" and waiting["position"] == 1, waiting
    told = _told(session_factory, "alice")
    assert len(told) == 1 and f"booked reservation {r['id']}" in told[0] and fmt_local(s, client.app.state.settings.tz) in told[0]


def test_a_quota_refusal_leaves_the_entry_waiting_and_the_next_gets_the_slot(client, lab, make_user):
    carol = make_user("carol")
    s = future(5)
    assert client.post("/api/v1/rules", json={"scope": "user", "user": "alice", "max_devices": 1},
                       headers=lab.admin.headers).status_code == 201
    assert book(client, lab.alice, [0], s, duration="PT4H").status_code == 201
    bobs = book(client, lab.bob, [1], s, duration="PT4H").json()["id"]
    assert book(client, lab.admin, [2, 3], s, duration="PT4H").status_code == 201
    alices = _entry(client, lab.alice, s, s + timedelta(hours=3), duration="PT3H", book=True).json()
    carols = _entry(client, carol, s, s + timedelta(hours=3), duration="PT3H", book=True).json()
    assert client.delete(f"/api/v1/reservations/{bobs}", headers=lab.bob.headers).status_code == 200
    a = _get(client, lab.alice, alices["id"])
    assert a["state"] == "waiting" and a["reservation_id"] is None
    assert a["last_refusal"].startswith("max_devices: 1 more device(s) would make 2 at once"), a["last_refusal"]
    c = _get(client, carol, carols["id"])
    assert c["state"] == "booked"
    held = client.get(f"/api/v1/reservations/{c['reservation_id']}", headers=carol.headers).json()
    assert held["user"] == "carol" and [d["index"] for d in held["devices"]] == [1]
    # the refused attempt left nothing behind: alice still holds only her first reservation
    mine = client.get("/api/v1/reservations", params={"user": "alice"}, headers=lab.alice.headers).json()
    assert mine["total"] == 1


def test_notify_only_tells_with_a_link_and_books_nothing(client, lab, session_factory):
    s = future(5)
    bobs = _full(client, lab, s)
    e = _entry(client, lab.alice, s, s + timedelta(hours=3), duration="PT90M").json()
    assert e["state"] == "waiting" and e["book"] is False
    assert client.delete(f"/api/v1/reservations/{bobs}", headers=lab.bob.headers).status_code == 200
    assert _get(client, lab.alice, e["id"])["state"] == "notified"
    text = _told(session_factory, "alice")[-1]
    tz = client.app.state.settings.tz
    assert "free for 1h30m from " + fmt_local(s, tz) in text and "Nothing is held for you" in text
    assert "http://testserver/book?mode=count&count=1&host=node-01&when=at&start=" in text and "length=1.5" in text
    listed = client.get("/api/v1/reservations", params={"user": "alice"}, headers=lab.alice.headers).json()
    assert listed["total"] == 0


def test_no_notice_when_the_waitlist_kind_is_turned_off(client, lab, session_factory):
    assert client.put("/api/v1/me/notice-preferences", json={"waitlist": False},
                      headers=lab.alice.headers).status_code == 200
    s = future(5)
    bobs = _full(client, lab, s)
    e = _entry(client, lab.alice, s, s + timedelta(hours=3)).json()
    assert client.delete(f"/api/v1/reservations/{bobs}", headers=lab.bob.headers).status_code == 200
    assert _get(client, lab.alice, e["id"])["state"] == "notified"
    with session_factory() as s:  # recorded for the record, neither e-mailed nor sent to a chat
        rows = list(s.scalars(select(AuditLog).where(AuditLog.action == "notice.reservation",
                                                     AuditLog.target == "user:alice")))
        assert [(a.detail["email"], a.detail["chats"], a.detail["kind"]) for a in rows] == [("not wanted", 0, "waitlist")]


def test_free_at_once_is_booked_when_the_entry_is_made(client, lab):
    s = future(3)
    e = _entry(client, lab.alice, s, within="PT2H", count=2, book=True, note="sweep")
    assert e.status_code == 201, e.text
    doc = e.json()
    assert doc["state"] == "booked" and doc["window_end"] and doc["duration_seconds"] == 3600
    r = client.get(f"/api/v1/reservations/{doc['reservation_id']}", headers=lab.alice.headers).json()
    assert len(r["devices"]) == 2 and r["note"] == "sweep" and datetime.fromisoformat(r["start"]) == s


def test_an_entry_expires_with_its_window(client, lab, session_factory):
    s = future(5)
    bobs = _full(client, lab, s)
    eid = _entry(client, lab.alice, s, s + timedelta(hours=2), book=True).json()["id"]
    short = _entry(client, lab.alice, s, s + timedelta(hours=2), book=True).json()["id"]
    now = datetime.now(UTC)
    with session_factory() as db, db.begin():
        db.execute(update(WaitlistEntry).where(WaitlistEntry.id == eid)
                   .values(window_start=now - timedelta(hours=3), window_end=now - timedelta(minutes=1)))
        # what is left of this window is shorter than the hour it wants
        db.execute(update(WaitlistEntry).where(WaitlistEntry.id == short)
                   .values(window_start=now - timedelta(hours=3), window_end=now + timedelta(minutes=30)))
    assert _get(client, lab.alice, eid)["state"] == "expired"
    assert [x["id"] for x in client.get("/api/v1/waitlist", params={"state": "expired"},
                                        headers=lab.alice.headers).json()] == [eid]
    gone = client.delete(f"/api/v1/waitlist/{eid}", headers=lab.alice.headers)
    assert gone.status_code == 409 and "expired" in gone.json()["detail"]
    with session_factory() as db:
        assert db.get(WaitlistEntry, eid).status == "waiting"  # shown expired, stored by the sweep
    from app.db import run_in_transaction
    from app.services import waitlist_serving

    settings = client.app.state.settings
    assert run_in_transaction(session_factory, lambda db: waitlist_serving.expire_ended(
        db, now=datetime.now(UTC), settings=settings)) == 1
    assert client.delete(f"/api/v1/reservations/{bobs}", headers=lab.bob.headers).status_code == 200
    with session_factory() as db:
        assert db.get(WaitlistEntry, eid).status == "expired"
        assert db.get(WaitlistEntry, short).status == "expired"  # met by the serving round, never fits
        assert db.scalar(select(Reservation).where(Reservation.note.like("%waitlist%"))) is None
        assert db.scalar(select(AuditLog.action).where(AuditLog.target == f"waitlist:{eid}",
                                                       AuditLog.action == "waitlist.expire")) == "waitlist.expire"
    assert run_in_transaction(session_factory, lambda db: waitlist_serving.expire_ended(
        db, now=datetime.now(UTC), settings=settings)) == 0


def test_owner_lists_and_cancels_own_entries_admin_sees_all(client, lab, session_factory):
    s = future(5)
    bobs = _full(client, lab, s)
    mine = _entry(client, lab.alice, s, s + timedelta(hours=3), book=True).json()["id"]
    theirs = _entry(client, lab.bob, s, s + timedelta(hours=3)).json()["id"]
    assert [x["id"] for x in client.get("/api/v1/waitlist", headers=lab.alice.headers).json()] == [mine]
    assert {x["id"] for x in client.get("/api/v1/waitlist", headers=lab.admin.headers).json()} == {mine, theirs}
    assert client.get("/api/v1/waitlist", params={"user": "alice"}, headers=lab.bob.headers).status_code == 403
    assert client.delete(f"/api/v1/waitlist/{mine}", headers=lab.bob.headers).status_code == 403
    done = client.delete(f"/api/v1/waitlist/{mine}", headers=lab.alice.headers)
    assert done.status_code == 200 and done.json()["state"] == "cancelled"
    again = client.delete(f"/api/v1/waitlist/{mine}", headers=lab.alice.headers)
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]
    assert client.delete("/api/v1/waitlist/99999", headers=lab.alice.headers).status_code == 404
    # a cancelled entry is not served: bob's freed slot goes to nobody of the waitlist but bob's notify entry
    assert client.delete(f"/api/v1/reservations/{bobs}", headers=lab.bob.headers).status_code == 200
    assert _get(client, lab.alice, mine)["state"] == "cancelled"
    assert _get(client, lab.bob, theirs)["state"] == "notified"


def test_release_serves_the_waitlist(client, lab):
    running = _full(client, lab, "now")
    e = _entry(client, lab.alice, "now", within="PT3H", book=True).json()
    assert e["state"] == "waiting"
    assert client.post(f"/api/v1/reservations/{running}/release", headers=lab.bob.headers).status_code == 200
    got = _get(client, lab.alice, e["id"])
    assert got["state"] == "booked"
    r = client.get(f"/api/v1/reservations/{got['reservation_id']}", headers=lab.alice.headers).json()
    assert r["state"] == "active" and [d["index"] for d in r["devices"]] == [0]


def test_deny_serves_the_waitlist(client, lab):
    assert client.post("/api/v1/rules", json={"scope": "default", "approval_above_devices": 1},
                       headers=lab.admin.headers).status_code == 201
    s = future(5)
    pending = book(client, lab.bob, [0, 1], s, duration="PT4H").json()
    assert pending["state"] == "pending"
    assert book(client, lab.admin, [2, 3], s, duration="PT4H").status_code == 201
    e = _entry(client, lab.alice, s, s + timedelta(hours=2), book=True).json()
    assert e["state"] == "waiting"
    assert client.post(f"/api/v1/reservations/{pending['id']}/deny", headers=lab.admin.headers).status_code == 200
    assert _get(client, lab.alice, e["id"])["state"] == "booked"


def test_expiry_of_an_unapproved_pending_serves_the_waitlist(client, lab, session_factory):
    from app.db import run_in_transaction
    from app.services import approvals
    from app.services import reservations as reservation_service

    assert client.post("/api/v1/rules", json={"scope": "default", "approval_above_devices": 1},
                       headers=lab.admin.headers).status_code == 201
    s = future(0.1) + timedelta(minutes=5)
    pending = book(client, lab.bob, [0, 1], s, duration="PT1H").json()
    assert pending["state"] == "pending"
    assert book(client, lab.admin, [2, 3], "now", duration="PT3H").status_code == 201
    e = _entry(client, lab.alice, "now", s + timedelta(hours=1), duration="PT30M", count=2, book=True).json()
    assert e["state"] == "waiting"
    settings = client.app.state.settings
    expired = run_in_transaction(session_factory, lambda db: [r.id for r in approvals.expire_due(
        db, now=s + timedelta(seconds=1), settings=settings, load=reservation_service.load_locked)])
    assert expired == [pending["id"]]
    got = _get(client, lab.alice, e["id"])
    assert got["state"] == "booked", got
    r = client.get(f"/api/v1/reservations/{got['reservation_id']}", headers=lab.alice.headers).json()
    assert sorted(d["index"] for d in r["devices"]) == [0, 1]


def test_maintenance_override_keeps_its_window_and_the_entry_waits(client, lab):
    s = future(5)
    bobs = _full(client, lab, s, hours=2)
    e = _entry(client, lab.alice, s, s + timedelta(hours=2), book=True).json()
    assert e["state"] == "waiting"
    m = client.post("/api/v1/maintenance", json={"host": "node-01", "devices": [0], "start": s.isoformat(),
                                                 "end": (s + timedelta(hours=5)).isoformat(), "reason": "swap",
                                                 "override": True}, headers=lab.admin.headers)
    assert m.status_code == 201, m.text
    assert [o["id"] for o in m.json()["overridden"]] == [bobs]
    assert _get(client, lab.alice, e["id"])["state"] == "waiting"


def test_bad_input_is_a_4xx_naming_the_field(client, lab):
    s = future(5)
    cases = [
        (dict(start=s, end=s + timedelta(minutes=30)), 422, "within"),  # window shorter than the length
        (dict(start=s, count=5, within="P1D"), 422, "count"),  # more GPUs than any host has
        (dict(start=s, within="P1D", constraints={"model": "H100"}), 422, "count"),
        (dict(start=s, within="P1D", host="nowhere"), 404, "host"),
        (dict(start=s, end=s + timedelta(hours=3), within="P1D"), 422, "within"),
        (dict(start=s), 422, "within"),
        (dict(start=datetime.now(UTC) - timedelta(hours=2), within="P1D"), 422, "start"),
        (dict(start=s, within="P400D"), 422, "within"),
        (dict(start="tomorrow", within="P1D"), 422, "start"),
        (dict(start=s, within="P1D", duration="PT10S"), 422, "duration"),
        (dict(start=s, within="-PT1H"), 422, "within"),
        (dict(start=s, within="P999999999D"), 422, "within"),  # past the largest instant: named, never a 500
        (dict(start=s, within="P1D", duration="P999999999D"), 422, "duration"),
        (dict(start="9999-12-31T23:00:00Z", within="P1D"), 422, "start"),
    ]
    for extra, status, field in cases:
        r = _entry(client, lab.alice, **extra)
        assert (r.status_code, r.json().get("field")) == (status, field), (extra, r.text)
    r = client.post("/api/v1/waitlist", json={"count": 1, "duration": "PT1H", "within": "P1D", "bogus": 1},
                    headers=lab.alice.headers)
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
    assert client.get("/api/v1/waitlist", headers=lab.alice.headers).json() == []


def test_the_same_idempotency_key_makes_one_entry(client, lab):
    s = future(5)
    _full(client, lab, s)
    body = {"count": 1, "duration": "PT1H", "start": s.isoformat(), "within": "PT3H"}
    headers = {**lab.alice.headers, "Idempotency-Key": "wait-once-0001"}
    one = client.post("/api/v1/waitlist", json=body, headers=headers)
    two = client.post("/api/v1/waitlist", json=body, headers=headers)
    assert one.status_code == two.status_code == 201 and one.json()["id"] == two.json()["id"]
    assert len(client.get("/api/v1/waitlist", headers=lab.alice.headers).json()) == 1


def test_cancelling_a_series_serves_the_waitlist(client, lab):
    day = (datetime.now(UTC) + timedelta(days=3)).date()
    body = {"host": "node-01", "devices": [0], "freq": "daily", "start_date": day.isoformat(), "start_time": "10:00",
            "duration": "PT2H", "tz": "UTC", "count": 2}
    series = client.post("/api/v1/series", json=body, headers=lab.bob.headers)
    assert series.status_code == 201, series.text
    first = datetime.fromisoformat(series.json()["occurrences"][0]["start"])
    assert book(client, lab.admin, [1, 2, 3], first, duration="PT2H").status_code == 201
    e = _entry(client, lab.alice, first, first + timedelta(hours=2), duration="PT2H", book=True).json()
    assert e["state"] == "waiting"
    assert client.delete(f"/api/v1/series/{series.json()['id']}", headers=lab.bob.headers).status_code == 200
    got = _get(client, lab.alice, e["id"])
    assert got["state"] == "booked"
    r = client.get(f"/api/v1/reservations/{got['reservation_id']}", headers=lab.alice.headers).json()
    assert datetime.fromisoformat(r["start"]) == first and [d["index"] for d in r["devices"]] == [0]


def test_a_savepoint_rolled_back_after_the_freeing_change_still_serves(client, lab, session_factory):
    from app.db import lock_for_write
    from app.models import User
    from app.services import reservations as reservation_service

    s = future(5)
    bobs = _full(client, lab, s)
    e = _entry(client, lab.alice, s, s + timedelta(hours=3), book=True).json()
    with session_factory() as db:
        lock_for_write(db)
        bob = db.scalar(select(User).where(User.username == "bob"))
        reservation_service.end_reservation(db, actor=bob, reservation_id=bobs, tz=client.app.state.settings.tz)
        nested = db.begin_nested()  # some later step of the same change tries something and gives up
        nested.rollback()
        db.commit()
    assert _get(client, lab.alice, e["id"])["state"] == "booked"


@pytest.mark.commits  # parallel requests, each on its own connection
def test_freed_at_once_by_four_cancels_the_entry_is_served_once(client, lab):
    import threading

    s = future(5)
    held = [book(client, lab.bob, [i], s, duration="PT4H").json()["id"] for i in range(4)]
    e = _entry(client, lab.alice, s, s + timedelta(hours=3), book=True).json()
    gate = threading.Barrier(len(held))
    codes: list[int] = []

    def cancel(rid: int) -> None:
        gate.wait()
        codes.append(client.delete(f"/api/v1/reservations/{rid}", headers=lab.bob.headers).status_code)

    threads = [threading.Thread(target=cancel, args=(rid,)) for rid in held]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200] * len(held)
    assert _get(client, lab.alice, e["id"])["state"] == "booked"
    mine = client.get("/api/v1/reservations", params={"user": "alice"}, headers=lab.alice.headers).json()
    assert mine["total"] == 1  # one entry, one booking, however many slots were freed at once
