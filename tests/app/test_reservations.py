"""Booking over the API on both databases: conflicts, half-open intervals, history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.conftest import book, future, gpu, snapshot_body


def test_booking_returns_devices_state_and_cuda_visible_devices(client, lab):
    start = future(2)
    r = book(client, lab.alice, [1, lab.devices[0]], start, duration="PT4H")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["user"] == "alice" and body["state"] == "upcoming"
    assert [d["index"] for d in body["devices"]] == [0, 1]
    assert body["cuda_visible_devices"] == f"{lab.devices[0]},{lab.devices[1]}"
    assert datetime.fromisoformat(body["end"]) - datetime.fromisoformat(body["start"]) == timedelta(hours=4)
    assert r.headers["location"] == f"/api/v1/reservations/{body['id']}"


def test_b22_back_to_back_bookings_half_open(client, lab):
    base = future(48)
    r1 = book(client, lab.alice, [0], base, base + timedelta(hours=1))
    assert r1.status_code == 201
    cases = [
        (base + timedelta(hours=1), base + timedelta(hours=2), 201),  # R2 starts at R1's end
        (base - timedelta(hours=1), base, 201),  # R3 ends at R1's start
        (base + timedelta(minutes=59), base + timedelta(minutes=61), 409),  # R4 straddles the end
        (base, base + timedelta(hours=1), 409),  # R5 same slot
    ]
    for start, end, expected in cases:
        r = book(client, lab.bob, [0], start, end)
        assert r.status_code == expected, (start, end, r.text)


def test_overlapping_booking_gets_409_naming_conflict_and_earliest_free(client, lab):
    start = future(5)
    r1 = book(client, lab.alice, [0, 1], start, start + timedelta(hours=2))
    assert r1.status_code == 201
    r = book(client, lab.bob, [1, 2], start + timedelta(minutes=30), duration="PT1H")
    assert r.status_code == 409
    assert r.headers["content-type"].startswith("application/problem+json")
    doc = r.json()
    assert doc["conflicts"][0]["id"] == r1.json()["id"]
    assert doc["conflicts"][0]["user"] == "alice"
    assert datetime.fromisoformat(doc["earliest_free_start"]) == start + timedelta(hours=2)
    # people read the detail: devices by their labels, times in the lab's zone; of alice's two
    # GPUs only the one in the way of bob's request is named (GPU 0 is none of his business)
    assert f"#{r1.json()['id']} by alice on GPU 1 [" in doc["detail"], doc["detail"]
    assert doc["conflicts"][0]["devices"] == [lab.devices[1]]
    assert "GPU-" not in doc["detail"]
    mine = book(client, lab.alice, [1, 0], start, duration="PT1H")  # the holder's own reservation is called hers
    assert mine.status_code == 409
    assert f"#{r1.json()['id']} yours on GPU 0, GPU 1 [" in mine.json()["detail"], mine.json()["detail"]
    assert mine.json()["conflicts"][0]["devices"] == [lab.devices[0], lab.devices[1]]


def test_a_body_that_is_not_json_is_a_422_naming_the_body_not_a_character_offset(client, lab):
    r = client.post("/api/v1/reservations", content=b'{"host":', headers={**lab.alice.headers, "Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["errors"] == [{"field": "body", "message": "not valid JSON at character 8: Expecting value"}]
    assert r.json()["detail"] == "body: not valid JSON at character 8: Expecting value"


def test_times_without_offset_zero_length_inverted_and_past_get_422(client, lab):
    s = future(3)
    assert book(client, lab.alice, [0], s.replace(tzinfo=None).isoformat()).json()["field"] == "start"
    for start, end in [(s, s), (s, s - timedelta(hours=1))]:
        r = book(client, lab.alice, [0], start, end)
        assert r.status_code == 422 and r.json()["field"] == "end"
    r = book(client, lab.alice, [0], datetime.now(UTC) - timedelta(hours=2), duration="PT1H")
    assert r.status_code == 422 and r.json()["field"] == "start"
    r = client.post("/api/v1/reservations", json={"host": "node-01", "devices": [0], "start": s.isoformat()}, headers=lab.alice.headers)
    assert r.status_code == 422 and "end" in r.json()["detail"]
    r = book(client, lab.alice, ["GPU-nope"], s)
    assert r.status_code == 422 and r.json()["field"] == "devices"


def test_b24_wall_time_with_zone_and_offset_give_same_instant(client, lab):
    year = datetime.now(UTC).year + 1
    r1 = book(client, lab.alice, [0], f"{year}-11-02T09:00", f"{year}-11-02T10:00", tz="Europe/Berlin")
    assert r1.status_code == 201, r1.text
    assert r1.json()["start"].startswith(f"{year}-11-02T08:00:00")
    r2 = book(client, lab.bob, [0], f"{year}-11-02T09:00:00+01:00", duration="PT1H")
    assert r2.status_code == 409


def test_cancel_upcoming_release_active_and_history_is_immutable(client, lab, session_factory):
    start = future(1)
    rid = book(client, lab.alice, [2], start).json()["id"]
    r = client.delete(f"/api/v1/reservations/{rid}", headers=lab.alice.headers)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    # the slot is free again, the row is kept
    assert book(client, lab.bob, [2], start).status_code == 201
    assert client.get(f"/api/v1/reservations/{rid}", headers=lab.bob.headers).json()["status"] == "cancelled"
    assert client.delete(f"/api/v1/reservations/{rid}", headers=lab.alice.headers).status_code == 409
    assert client.patch(f"/api/v1/reservations/{rid}", json={"note": "x"}, headers=lab.alice.headers).status_code == 409

    now_res = book(client, lab.alice, [3], "now", duration="PT2H").json()
    assert now_res["state"] == "active"
    r = client.post(f"/api/v1/reservations/{now_res['id']}/release", headers=lab.alice.headers)
    assert r.status_code == 200 and r.json()["state"] == "released"
    assert datetime.fromisoformat(r.json()["end"]) <= datetime.now(UTC)
    assert book(client, lab.bob, [3], "now", duration="PT1H").status_code == 201


def test_members_change_only_their_own_admins_all(client, lab):
    rid = book(client, lab.alice, [0], future(6)).json()["id"]
    assert client.patch(f"/api/v1/reservations/{rid}", json={"note": "mine"}, headers=lab.bob.headers).status_code == 403
    assert client.delete(f"/api/v1/reservations/{rid}", headers=lab.bob.headers).status_code == 403
    r = client.patch(f"/api/v1/reservations/{rid}", json={"note": "by admin"}, headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["note"] == "by admin"
    # members may not book for someone else; admins may
    assert book(client, lab.bob, [1], future(6), user="alice").status_code == 403
    r = book(client, lab.admin, [1], future(6), user="alice")
    assert r.status_code == 201 and r.json()["user"] == "alice"


def test_extend_checks_conflicts(client, lab):
    s = future(10)
    a = book(client, lab.alice, [0], s, s + timedelta(hours=1)).json()["id"]
    book(client, lab.bob, [0], s + timedelta(hours=2), s + timedelta(hours=3))
    ok = client.patch(f"/api/v1/reservations/{a}", json={"end": (s + timedelta(hours=2)).isoformat()}, headers=lab.alice.headers)
    assert ok.status_code == 200
    r = client.patch(f"/api/v1/reservations/{a}", json={"end": (s + timedelta(hours=2, minutes=30)).isoformat()}, headers=lab.alice.headers)
    assert r.status_code == 409 and r.json()["conflicts"][0]["user"] == "bob"


def test_b07_whole_gpu_and_mig_slice_exclude_each_other(client, lab, make_host):
    h = make_host("mig-01")
    parent = "GPU-5e5e5e5e-0000-0000-0000-000000000000"
    devs = [gpu(parent, 0, "NVIDIA H100 80GB HBM3", mig_mode=True)] + [
        {"uuid": f"MIG-{gi}0000000-0000-0000-0000-000000000000", "index": 0, "parent_uuid": parent, "gpu_instance_id": gi,
         "compute_instance_id": 0, "mig_profile": p}
        for gi, p in [(2, "3g.40gb"), (3, "2g.20gb")]
    ]
    assert client.post("/api/v1/agent/snapshots", json=snapshot_body("mig-01", 1, devs), headers=h.headers).status_code == 200
    s = future(3)
    gi2, gi3 = devs[1]["uuid"], devs[2]["uuid"]
    assert book(client, lab.alice, [gi3], s, host="mig-01").status_code == 201
    assert book(client, lab.bob, [gi2], s, host="mig-01").status_code == 201  # another slice: fine
    r = book(client, lab.bob, [parent], s, host="mig-01")  # whole GPU: conflicts with both slices
    assert r.status_code == 409 and len(r.json()["conflicts"]) == 2
    assert "by alice on GPU 0 · MIG 3 [" in r.json()["detail"] and "yours on GPU 0 · MIG 2 [" in r.json()["detail"]
    later = future(30)
    assert book(client, lab.bob, [0], later, host="mig-01").status_code == 201  # index 0 = the whole GPU
    clash = book(client, lab.alice, [gi3], later, host="mig-01")
    assert clash.status_code == 409 and clash.json()["conflicts"][0]["devices"] == [parent]  # the whole GPU is in the way
    assert " by bob on GPU 0 [" in clash.json()["detail"], clash.json()["detail"]
    assert r.json()["conflicts"][0]["devices"] in ([gi2], [gi3])  # each slice reservation: its own slice


def test_list_filters_and_pagination(client, lab):
    for i in range(3):
        book(client, lab.alice, [i], future(20 + i))
    book(client, lab.bob, [3], future(20))
    r = client.get("/api/v1/reservations", params={"user": "alice", "limit": 2}, headers=lab.bob.headers)
    page = r.json()
    assert page["total"] == 3 and len(page["items"]) == 2
    r = client.get("/api/v1/reservations", params={"device": lab.devices[3]}, headers=lab.bob.headers)
    assert [x["user"] for x in r.json()["items"]] == ["bob"]
    assert client.get("/api/v1/reservations", params={"limit": 100000}, headers=lab.bob.headers).status_code == 422
    assert client.get("/api/v1/reservations", params={"state": "bogus"}, headers=lab.bob.headers).status_code == 422


def test_lost_gpu_is_not_bookable_b08(client, lab):
    devs = [gpu(u, i) for i, u in enumerate(lab.devices)]
    devs[1]["health"] = "lost"
    devs[1]["error"] = "GPU is lost"
    client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, devs), headers=lab.host.headers)
    r = book(client, lab.alice, [1], future(2))
    assert r.status_code == 409 and "lost" in r.json()["detail"]
    assert book(client, lab.alice, [2], future(2)).status_code == 201
    listed = {d["index"]: d for d in client.get("/api/v1/devices", headers=lab.alice.headers).json()}
    assert listed[1]["status"] == "lost" and listed[0]["status"] == "free"


def test_body_over_256_kib_gets_413(client, lab):
    r = client.post("/api/v1/reservations", content=b"{" + b" " * (300 * 1024) + b"}",
                    headers={**lab.alice.headers, "content-type": "application/json"})
    assert r.status_code == 413


def test_plain_listings_are_paginated_with_a_capped_page_size(client, lab):
    r = client.get("/api/v1/devices", params={"limit": 3, "offset": 2}, headers=lab.alice.headers)
    assert r.status_code == 200 and r.headers["x-total-count"] == "4"
    assert [d["index"] for d in r.json()] == [2, 3]
    assert client.get("/api/v1/users", params={"limit": 5001}, headers=lab.alice.headers).status_code == 422
    r = client.get("/api/v1/users", params={"limit": 1}, headers=lab.alice.headers)
    assert len(r.json()) == 1 and r.headers["x-total-count"] == "3"  # boss, alice, bob
    assert r.json()[0]["email"] is None  # e-mail addresses only for admins


def test_b07_whole_gpu_with_a_reserved_mig_slice_is_not_shown_free(client, lab, make_host):
    h = make_host("mig-02")
    parent = "GPU-6e6e6e6e-0000-0000-0000-000000000000"
    devs = [gpu(parent, 0, "NVIDIA A100-SXM4-80GB", mig_mode=True),
            {"uuid": "MIG-6e000003-0000-0000-0000-000000000000", "parent_uuid": parent, "gpu_instance_id": 3,
             "compute_instance_id": 0, "mig_profile": "2g.20gb"}]
    assert client.post("/api/v1/agent/snapshots", json=snapshot_body("mig-02", 1, devs), headers=h.headers).status_code == 200
    assert book(client, lab.alice, [devs[1]["uuid"]], "now", host="mig-02", duration="PT2H").status_code == 201
    listed = {d["uuid"]: d for d in client.get("/api/v1/devices", params={"host": "mig-02"}, headers=lab.bob.headers).json()}
    assert listed[parent]["holder"]["user"] == "alice" and listed[parent]["status"] == "reserved-idle"
    assert book(client, lab.bob, [parent], "now", host="mig-02", duration="PT1H").status_code == 409


def test_every_422_names_its_field_the_same_two_ways(client, lab):
    """A value the service refuses (end before start) and one the schema refuses (a negative
    duration) answer in one shape: type, ``field`` and ``errors[].field``."""
    start = future(4)
    by_service = book(client, lab.alice, [0], start, start - timedelta(hours=1))
    by_schema = client.post("/api/v1/reservations", headers=lab.alice.headers,
                            json={"host": "node-01", "devices": [0], "start": start.isoformat(), "duration": "PT-1H"})
    for r, field in ((by_service, "end"), (by_schema, "duration")):
        doc = r.json()
        assert r.status_code == 422 and doc["type"] == "/problems/validation", doc
        assert doc["field"] == field and doc["errors"][0]["field"] == field, doc
        assert doc["errors"][0]["message"] and not doc["errors"][0]["message"].startswith(f"{field}:"), doc


def test_a_409_never_names_a_device_its_holder_gave_back_early(client, lab, session_factory):
    """The check-in sweep gives idle devices of a reservation back one by one (their rows end
    now): a later booking of both GPUs is in the way of the one still held, and only it is named."""
    from sqlalchemy import select, update

    from app.db import transaction
    from app.models import Device, ReservationDevice

    held = book(client, lab.bob, [0, 1], "now", duration="PT2H")
    assert held.status_code == 201, held.text
    rid = held.json()["id"]
    with transaction(session_factory, write=True) as s:
        gpu0 = s.scalar(select(Device.id).where(Device.uuid == lab.devices[0]))
        s.execute(update(ReservationDevice).where(ReservationDevice.reservation_id == rid,
                                                  ReservationDevice.device_id == gpu0).values(end_at=datetime.now(UTC)))
    r = book(client, lab.alice, [0, 1], future(1), duration="PT30M")
    assert r.status_code == 409, r.text
    assert r.json()["conflicts"][0]["devices"] == [lab.devices[1]]
    assert f"#{rid} by bob on GPU 1 [" in r.json()["detail"], r.json()["detail"]
