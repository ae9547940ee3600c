"""``GET /api/v1/devices`` and ``GET /metrics`` answer from per-process caches keyed on what
each request reads of the database: every change shows on the next request (a booking, a
cancel and a release, a new snapshot, a quarantine opened and cleared, a device retired or
moved), a second app on the same database (a replica) answers the same, and the answers are
those of the uncached code (``device_list.device_list``, ``DatabaseCollector``). Both
databases."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from tests.conftest import FRESH_FOR, book, future, gpu, snapshot_body

pytestmark = pytest.mark.commits  # a second app (a replica) reads what the first committed


def _uncached_list(session_factory) -> list[dict]:
    from app.models import utcnow
    from app.services import device_list

    with session_factory() as s:
        return json.loads(device_list.to_json_bytes(device_list.device_list(s, now=utcnow())))


@pytest.fixture
def replica(settings, client):
    """A second app (another serve process) on the same database, its caches its own."""
    from app.main import create_app

    with TestClient(create_app(settings)) as other:
        yield other


def _check(app, client, replica, lab, session_factory) -> dict[str, dict]:
    """Both apps' lists equal the uncached one; the cached scrape is the collector's, byte for byte."""
    from app.models import utcnow
    from app.services.metrics import DatabaseCollector

    got = client.get("/api/v1/devices", headers=lab.alice.headers)
    assert got.status_code == 200, got.text
    assert got.json() == _uncached_list(session_factory)
    assert replica.get("/api/v1/devices", headers=lab.alice.headers).json() == got.json()
    for c in (client, replica):
        assert c.get("/metrics").status_code == 200
    now = utcnow()
    with session_factory() as s:
        assert app.state.metrics_cache.exposition(s, now=now) == DatabaseCollector(s, now=now).exposition()
    return {d["uuid"]: d for d in got.json()}


def _scrape_line(c, family: str, uuid: str) -> str:
    return next(line for line in c.get("/metrics").text.splitlines() if line.startswith(family + "{") and uuid in line)


def test_every_change_shows_on_the_next_request_of_both_apps(app, client, replica, lab, make_host, session_factory):
    d0, d1, d2, d3 = lab.devices
    _check(app, client, replica, lab, session_factory)  # both caches filled

    now_booking = book(client, lab.alice, [d0], "now", duration="PT2H")
    assert now_booking.status_code == 201, now_booking.text
    later = book(client, lab.bob, [d1], future(3))
    assert later.status_code == 201, later.text
    seen = _check(app, client, replica, lab, session_factory)
    assert seen[d0]["holder"]["user"] == "alice" and seen[d0]["status"] == "reserved-idle"
    assert seen[d1]["next_reservation"]["user"] == "bob"
    assert 'holder="alice"' in _scrape_line(replica, "gpuroster_device_memory_total_bytes", d0)

    assert client.delete(f"/api/v1/reservations/{later.json()['id']}", headers=lab.bob.headers).status_code == 200
    r = client.post(f"/api/v1/reservations/{now_booking.json()['id']}/release", headers=lab.alice.headers)
    assert r.status_code == 200, r.text
    seen = _check(app, client, replica, lab, session_factory)
    assert seen[d0]["holder"] is None and seen[d0]["status"] == "free" and seen[d1]["next_reservation"] is None
    assert 'holder=""' in _scrape_line(replica, "gpuroster_device_memory_total_bytes", d0)

    devices = [gpu(u, i, memory_used_mib=2048.0 if i == 2 else 0.0) for i, u in enumerate(lab.devices)]
    procs = [{"device_uuid": d2, "pid": 4242, "unix_user": "bob", "uid": 1002, "used_memory_mib": 2000.0, "name": "python"}]
    r = client.post("/api/v1/agent/snapshots", headers=lab.host.headers, json=snapshot_body("node-01", 2, devices, procs, interval_seconds=FRESH_FOR))
    assert r.status_code == 200, r.text
    seen = _check(app, client, replica, lab, session_factory)
    assert seen[d2]["telemetry"]["memory_used_mib"] == 2048.0 and [p["pid"] for p in seen[d2]["processes"]] == [4242]

    devices[1]["health_checks"] = [{"kind": "xid", "state": "bad", "value": 79}]
    r = client.post("/api/v1/agent/snapshots", headers=lab.host.headers, json=snapshot_body("node-01", 3, devices, procs, interval_seconds=FRESH_FOR))
    assert r.status_code == 200, r.text
    assert _check(app, client, replica, lab, session_factory)[d1]["quarantine"] is not None
    r = client.post(f"/api/v1/devices/{d1}/clear-quarantine", json={"note": "reset"}, headers=lab.admin.headers)
    assert r.status_code == 200, r.text
    assert _check(app, client, replica, lab, session_factory)[d1]["quarantine"] is None  # no snapshot in between

    assert client.patch(f"/api/v1/devices/{d3}", json={"retired": True}, headers=lab.admin.headers).status_code == 200
    assert d3 not in _check(app, client, replica, lab, session_factory)

    other = make_host("node-02")
    r = client.post("/api/v1/agent/snapshots", headers=other.headers,
                    json=snapshot_body("node-02", 1, [gpu("GPU-77777777-0000-0000-0000-000000000002", 0)], interval_seconds=FRESH_FOR))
    assert r.status_code == 200, r.text
    assert client.post(f"/api/v1/devices/{d0}/move", json={"host": "node-02"}, headers=lab.admin.headers).status_code == 200
    seen = _check(app, client, replica, lab, session_factory)
    assert seen[d0]["host"] == "node-02"
    assert 'host="node-02"' in _scrape_line(replica, "gpuroster_device_memory_total_bytes", "GPU-77777777")


def test_pages_and_one_host_come_from_the_same_documents(client, lab, session_factory):
    whole = client.get("/api/v1/devices", headers=lab.alice.headers).json()
    assert whole == _uncached_list(session_factory)
    r = client.get("/api/v1/devices?limit=2&offset=1", headers=lab.alice.headers)
    assert r.json() == whole[1:3] and r.headers["X-Total-Count"] == str(len(whole))
    assert client.get("/api/v1/devices?host=node-01", headers=lab.alice.headers).json() == whole
    # compressed once and kept: the same bytes as the middleware would send, decompressed
    packed = client.get("/api/v1/devices", headers={**lab.alice.headers, "Accept-Encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip" and "Accept-Encoding" in packed.headers["vary"]
    assert packed.json() == whole
    plain = client.get("/api/v1/devices", headers={**lab.alice.headers, "Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.json() == whole


def test_a_reservation_starting_moves_the_holder_without_any_write(client, lab, session_factory):
    """The cached holders are dropped at the first start or end after the instant they were read for."""
    from app.models import utcnow
    from app.services.lab_holds import HoldsCache
    from app.services.now_state import lab_key

    r = book(client, lab.bob, [lab.devices[1]], future(1), future(2))
    assert r.status_code == 201, r.text
    cache = HoldsCache()
    with session_factory() as s:
        key, now = lab_key(s), utcnow()
        before = cache.read(s, now=now, lab=key)
        dev_id = next(iter(before.upcoming))
        assert before.current == {} and before.upcoming[dev_id].id == r.json()["id"]
        assert cache.read(s, now=now + timedelta(seconds=1), lab=key) is before  # nothing changed: reused
        during = cache.read(s, now=future(1) + timedelta(minutes=1), lab=key)
        assert during.current[dev_id].id == r.json()["id"] and during.upcoming == {}
        assert cache.read(s, now=future(2) + timedelta(minutes=1), lab=key).current == {}
