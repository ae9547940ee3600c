"""The no-show loop end to end over simulated time: a booking nobody checks in to is warned,
then released, and the waitlist entry that waited for those GPUs is booked with the freed
slot; an idle holder who answers "keep" is left alone. Both databases."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.models import Reservation, WaitlistEntry
from tests.app.test_checkin import Agent, _booked, _res, _rule, _told


def test_no_show_is_warned_released_and_the_waitlist_gets_the_slot(client, lab, session_factory, settings):
    agent = Agent(session_factory, settings, lab)
    _rule(client, lab, checkin_minutes=30, checkin_grace_minutes=15)
    # every GPU of the host for 4 h, so nothing fits the 3 h window until the booking goes
    rid, t0 = _booked(client, lab, session_factory, devices=(0, 1, 2, 3))
    r = client.post("/api/v1/waitlist", json={"count": 2, "duration": "PT1H", "within": "PT3H", "host": "node-01",
                                              "book": True}, headers=lab.bob.headers)
    assert r.status_code == 201, r.text
    entry = r.json()
    assert entry["state"] == "waiting", entry

    assert agent.sweep(t0 + timedelta(minutes=31)).warned == [rid]
    assert "No check-in yet: keep it?" in _told(session_factory, "alice")[-1]
    assert client.get(f"/api/v1/waitlist/{entry['id']}", headers=lab.bob.headers).json()["state"] == "waiting"

    released_at = t0 + timedelta(minutes=46)
    assert agent.sweep(released_at).released == [rid]
    assert _res(session_factory, rid).status == "released"

    served = client.get(f"/api/v1/waitlist/{entry['id']}", headers=lab.bob.headers).json()
    assert served["state"] == "booked", served
    with session_factory() as s:
        booked_id = s.get(WaitlistEntry, entry["id"]).reservation_id
        items = s.scalar(select(Reservation).where(Reservation.id == booked_id))
        start, end = items.start_at, items.end_at
    booked = client.get(f"/api/v1/reservations/{booked_id}", headers=lab.bob.headers).json()
    assert booked["user"] == "bob" and len(booked["devices"]) == 2, booked
    assert start >= released_at - timedelta(seconds=1)  # the slot alice's release freed
    assert end - start == timedelta(hours=1)
    assert any("booked" in t.lower() for t in _told(session_factory, "bob"))


def test_idle_holder_who_answers_keep_is_left_alone(client, lab, session_factory, settings):
    agent = Agent(session_factory, settings, lab)
    _rule(client, lab, idle_below_percent=5, idle_after_minutes=30, idle_grace_minutes=10, idle_silence="release")
    rid, t0 = _booked(client, lab, session_factory, devices=(0,))
    proc = {"device_uuid": lab.devices[0], "pid": 4242, "unix_user": "alice", "used_memory_mib": 1000.0}
    for m in range(2, 34):  # checked in, memory held, compute idle minute after minute
        agent.post(t0 + timedelta(minutes=m), processes=[proc], util=0.0)
    assert agent.sweep(t0 + timedelta(minutes=34), processes=[proc], util=0.0).asked == [rid]
    assert client.get(f"/api/v1/reservations/{rid}", headers=lab.alice.headers).json()["question"] == "idle"
    assert client.post(f"/api/v1/reservations/{rid}/keep", headers=lab.alice.headers).status_code == 200
    for m in range(35, 90, 5):  # still idle well past the grace: kept means kept
        out = agent.sweep(t0 + timedelta(minutes=m), processes=[proc], util=0.0)
        assert rid not in out.released and rid not in out.asked
    assert _res(session_factory, rid).status == "confirmed"
