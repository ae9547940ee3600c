"""``GET /api/v1/devices`` answers from plain rows (app.services.device_list): the same
document as the model-built view (app.services.devices.list_devices), for every status."""

from __future__ import annotations

import pytest

from datetime import UTC, datetime, timedelta

from pydantic import TypeAdapter
from sqlalchemy import update

from app.schemas.host import DeviceRead
from tests.conftest import book, future, gpu, request_statements, snapshot_body

DEVICES = TypeAdapter(list[DeviceRead])


def _rich_lab(client, lab, make_host, session_factory):
    """Holders now and next, a whole GPU split into MIG slices (one reserved), processes of
    every kind, an open finding, a lost GPU, a stale host and a retired device."""
    now = datetime.now(UTC)
    assert book(client, lab.alice, [lab.devices[0]], "now", duration="PT2H").status_code == 201
    assert book(client, lab.bob, [lab.devices[0]], future(3)).status_code == 201
    assert book(client, lab.bob, [lab.devices[1]], future(5)).status_code == 201
    mig = make_host("node-02")
    parent = "GPU-99999999-0000-0000-0000-000000000000"
    devices = [
        gpu(parent, 0, mig_mode=True, memory_used_mib=1234.5, utilization_gpu=12.0, throttle_reasons=["sw_power_cap"]),
        {"uuid": "MIG-11111111-0000-0000-0000-000000000000", "index": 0, "parent_uuid": parent, "mig_profile": "3g.40gb",
         "gpu_instance_id": 1, "memory_total_mib": 40192.0},
        {"uuid": "MIG-22222222-0000-0000-0000-000000000000", "index": 1, "parent_uuid": parent, "mig_profile": "3g.40gb",
         "gpu_instance_id": 2, "memory_total_mib": 40192.0},
        gpu("GPU-88888888-0000-0000-0000-000000000000", 1, health="lost", error="GPU is lost"),
        gpu("GPU-77777777-0000-0000-0000-000000000000", 2),
        gpu("GPU-66666666-0000-0000-0000-000000000000", 3, temperature_c=71.0, power_draw_w=250.5),
    ]
    procs = [
        {"device_uuid": "MIG-11111111-0000-0000-0000-000000000000", "pid": 4242, "used_memory_mib": 2048.0,
         "unix_user": "mallory", "uid": 1666, "command": "python steal.py", "name": "python"},
        {"device_uuid": "GPU-77777777-0000-0000-0000-000000000000", "pid": 900, "type": "G", "used_memory_mib": 12.0,
         "unix_user": "root", "uid": 0, "name": "Xorg"},
        {"device_uuid": "GPU-66666666-0000-0000-0000-000000000000", "pid": 77, "used_memory_mib": 100.0,
         "unix_user": "alice", "uid": 1001, "name": "python", "container_id": "c" * 64},
        {"device_uuid": "GPU-66666666-0000-0000-0000-000000000000", "pid": 5, "used_memory_mib": None,
         "unix_user": None, "uid": None, "name": "(unnamed)"},
    ]
    findings = [{"key": "MIG-11111111:4242:1.0:unreserved", "kind": "unreserved",
                 "device_uuid": "MIG-11111111-0000-0000-0000-000000000000", "pid": 4242, "unix_user": "mallory",
                 "first_seen": (now - timedelta(minutes=2)).isoformat(), "last_seen": now.isoformat()}]
    r = client.post("/api/v1/agent/snapshots", headers=mig.headers,
                    json=snapshot_body("node-02", 1, devices, procs, findings=findings))
    assert r.status_code == 200, r.text
    assert book(client, lab.bob, ["MIG-22222222-0000-0000-0000-000000000000"], "now", host="node-02",
                duration="PT1H").status_code == 201
    stale = make_host("node-03")
    r = client.post("/api/v1/agent/snapshots", headers=stale.headers, json=snapshot_body(
        "node-03", 1, [gpu("GPU-55555555-0000-0000-0000-000000000000", 0)], collected_at=now - timedelta(hours=1),
        interval_seconds=5.0))
    assert r.status_code == 200, r.text
    # staleness is judged by when the service received the last snapshot: an hour ago
    from app.db import run_in_transaction
    from app.models import Host

    run_in_transaction(session_factory, lambda s: s.execute(
        update(Host).where(Host.name == "node-03").values(last_seen_at=now - timedelta(hours=1))))
    r = client.patch(f"/api/v1/devices/{lab.devices[3]}", json={"retired": True}, headers=lab.admin.headers)
    assert r.status_code == 200, r.text


def _model_view(session_factory, host=None):
    from app.models import utcnow
    from app.services import devices as device_service

    with session_factory() as s:
        return DEVICES.dump_python(device_service.list_devices(s, now=utcnow(), host=host), mode="json")


def test_device_list_is_the_model_view_for_every_status(client, lab, make_host, session_factory):
    _rich_lab(client, lab, make_host, session_factory)
    r = client.get("/api/v1/devices", headers=lab.alice.headers)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got == _model_view(session_factory)
    statuses = {d["uuid"][:12]: d["status"] for d in got}
    assert statuses["GPU-88888888"] == "lost"
    assert statuses["GPU-55555555"] == "stale"
    assert statuses["MIG-11111111"] == "finding"
    assert statuses["GPU-66666666"] == "in-use"
    assert statuses["GPU-0000aaaa"] == "reserved-idle"
    assert lab.devices[3] not in {d["uuid"] for d in got}  # retired devices are not listed
    assert int(r.headers["X-Total-Count"]) == len(got)
    DEVICES.validate_python(got)  # the documented schema


def test_device_list_by_host_and_pages_match(client, lab, make_host, session_factory):
    _rich_lab(client, lab, make_host, session_factory)
    r = client.get("/api/v1/devices?host=node-02", headers=lab.alice.headers)
    assert r.json() == _model_view(session_factory, host="node-02")
    r = client.get("/api/v1/devices?limit=2&offset=1", headers=lab.alice.headers)
    assert r.json() == _model_view(session_factory)[1:3]
    assert int(r.headers["X-Total-Count"]) == len(_model_view(session_factory))
    # a host that does not exist is named, not answered with an empty list; a host without
    # devices yet is an empty list
    r = client.get("/api/v1/devices?host=nope", headers=lab.alice.headers)
    assert r.status_code == 404 and r.json()["field"] == "host" and "'nope'" in r.json()["detail"], r.text
    make_host("node-empty")
    r = client.get("/api/v1/devices?host=node-empty", headers=lab.alice.headers)
    assert r.status_code == 200 and r.json() == [], r.text
    for query, field in (("host=nope", "host"), ("user=nobody", "user"), ("device=GPU-nope", "device")):
        r = client.get(f"/api/v1/reservations?{query}", headers=lab.alice.headers)
        assert r.status_code == 404 and r.json()["field"] == field, r.text
    r = client.get("/api/v1/findings?host=nope", headers=lab.admin.headers)
    assert r.status_code == 404 and r.json()["field"] == "host", r.text
    # a finding's user is a Unix name, which need not be anyone's account: an empty page
    r = client.get("/api/v1/findings?user=nobody", headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["total"] == 0, r.text
    r = client.get("/api/v1/reservations?host=node-empty&user=bob", headers=lab.alice.headers)
    assert r.status_code == 200 and r.json()["total"] == 0, r.text


@pytest.mark.commits  # counts every statement: the test transaction's savepoints would add to them
def test_device_list_statement_count_does_not_grow_with_devices(app, client, lab, make_host, session_factory):
    _rich_lab(client, lab, make_host, session_factory)
    def count() -> list[str]:
        with request_statements(app.state.engine) as seen:
            assert client.get("/api/v1/devices", headers=lab.alice.headers).status_code == 200
        return seen

    first, again = count(), count()
    # BEGIN (SQLite), the token, hosts, the devices' key, live findings, open quarantines,
    # reserved devices not ended, the lab's devices (holder rule), then the base of every
    # host: devices, telemetry, processes, findings
    assert len(first) <= 12, "\n".join(s.split("\n")[0] for s in first)
    # nothing changed: the keys only, no device read again
    assert len(again) <= 7, "\n".join(s.split("\n")[0] for s in again)
