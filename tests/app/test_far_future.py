"""Far-future ends: an admin booking that ends in year 9999 must not break conflict answers,
availability or later bookings on its host (both databases)."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.conftest import book, future

FAR = "9999-12-31T23:59:59Z"


def test_booking_ending_in_year_9999_leaves_conflicts_and_availability_working(client, lab):
    r = book(client, lab.admin, [0], future(2), FAR)
    assert r.status_code == 201, r.text
    assert r.json()["end"].startswith("9999-12-31")
    clash = book(client, lab.alice, [0], future(30))
    assert clash.status_code == 409, clash.text
    doc = clash.json()
    assert doc["conflicts"][0]["id"] == r.json()["id"]
    assert doc["earliest_free_start"].startswith("9999-12-31")
    avail = client.get("/api/v1/availability", params={"duration": "4h", "host": "node-01"}, headers=lab.alice.headers)
    assert avail.status_code == 200, avail.text
    slots = avail.json()["slots"]
    assert slots and all(lab.devices[0] not in s["devices"] for s in slots)
    placed = client.post("/api/v1/reservations", json={"count": 3, "start": future(30).isoformat(), "duration": "PT4H"},
                         headers=lab.alice.headers)
    assert placed.status_code == 201, placed.text
    assert lab.devices[0] not in [d["uuid"] for d in placed.json()["devices"]]
    full = client.post("/api/v1/reservations", json={"count": 4, "start": future(30).isoformat(), "duration": "PT4H"},
                       headers=lab.bob.headers)
    assert full.status_code in (409, 422) and "out of the range" not in full.text
    assert datetime.fromisoformat(doc["earliest_free_start"]) > datetime(9999, 1, 1, tzinfo=UTC)


def test_year_9999_hold_shows_in_ics_reports_and_pages(client, lab):
    r = book(client, lab.admin, [1], "now", FAR)
    assert r.status_code == 201, r.text
    feed = client.get("/api/v1/hosts/node-01/feed", headers=lab.alice.headers)
    assert feed.status_code == 200, feed.text
    ics = client.get(feed.json()["url"])
    assert ics.status_code == 200 and "DTEND:99991231T235959Z" in ics.text, ics.text[:500]
    rep = client.get("/api/v1/reports/usage", params={"user": "boss"}, headers=lab.admin.headers)
    assert rep.status_code == 200, rep.text
    usage = client.get("/api/v1/me/usage", headers=lab.admin.headers)
    assert usage.status_code == 200 and "until open-ended" in usage.text, usage.text
    listed = client.get("/api/v1/reservations", params={"host": "node-01", "state": "active"}, headers=lab.alice.headers)
    assert listed.status_code == 200 and listed.json()["total"] == 1


def test_a_duration_that_ends_after_year_9999_is_refused_naming_the_field(client, lab):
    for start, duration, shown in (("2027-01-01T00:00:00Z", "P999999999D", "999999999d"),
                                   ("9999-12-31T23:00:00Z", "PT2H", "2h")):
        r = book(client, lab.alice, [0], start, duration=duration)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "duration", r.text
        assert r.json()["detail"] == f"duration: {shown} from the start ends after year 9999", r.text
    assert client.get("/api/v1/reservations", headers=lab.alice.headers).json()["total"] == 0
