"""The service's side of clocks, restarts, device ownership and refused input (B40, B46,
D1, D3, D4, D6); both databases."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from agent.collect import SnapshotBuilder, fit_body
from agent.schema import DeviceReport
from agent.telemetry import RawProcess, Telemetry
from app.db import run_in_transaction
from app.models import AuditLog, Device, Host
from tests.conftest import gpu, snapshot_body
from tests.ops.test_metrics import scrape

POST = "/api/v1/agent/snapshots"
GA = "GPU-aaaa0000-0000-0000-0000-00000000000a"
GB = "GPU-bbbb0000-0000-0000-0000-00000000000b"


def _proc(uuid: str, pid: int, user: str = "alice", **kw) -> dict:
    return {"device_uuid": uuid, "pid": pid, "used_memory_mib": 1024.0, "uid": 1001, "unix_user": user,
            "command": "python train.py", "name": "python", **kw}


def _host(client, make_host, name: str, uuid: str, **kw):
    host = make_host(name)
    r = client.post(POST, json=snapshot_body(name, 1, [gpu(uuid, 0)], **kw), headers=host.headers)
    assert r.status_code == 200, r.text
    return host


# -- D4 / B40: time is the service's ----------------------------------------------------------


def test_d4_snapshot_an_hour_ahead_never_freezes_the_host(client, make_host, make_user, caplog):
    admin = make_user("boss", admin=True)
    host = _host(client, make_host, "node-01", GA)
    now = datetime.now(UTC)
    with caplog.at_level(logging.WARNING):
        r = client.post(POST, json=snapshot_body("node-01", 2, [gpu(GA, 0, utilization_gpu=11)],
                                                 collected_at=now + timedelta(hours=1)), headers=host.headers)
    assert r.status_code == 200
    assert any("clock trouble" in rec.getMessage() for rec in caplog.records)
    for seq, util in ((3, 22), (4, 33)):
        r = client.post(POST, json=snapshot_body("node-01", seq, [gpu(GA, 0, utilization_gpu=util)],
                                                 collected_at=datetime.now(UTC)), headers=host.headers)
        assert r.status_code == 200 and not r.json()["duplicate"]
        dev = client.get("/api/v1/devices", headers=admin.headers).json()[0]
        assert dev["telemetry"]["utilization_gpu"] == util  # each normal snapshot updates the host at once
        assert dev["status"] != "stale"
    h = client.get("/api/v1/hosts/node-01", headers=admin.headers).json()
    assert h["status"] == "ok" and h["seconds_since_snapshot"] < 60
    assert h["clock_trouble"] and "seq 2" in h["clock_trouble"] and "after it was received" in h["clock_trouble"]


def test_d4_implausibly_old_collected_at_is_flagged_and_filed_at_receipt(client, make_host, make_user):
    admin = make_user("boss", admin=True)
    host = _host(client, make_host, "node-01", GA)
    r = client.post(POST, json=snapshot_body("node-01", 2, [gpu(GA, 0, utilization_gpu=44)],
                                             collected_at=datetime(2001, 1, 1, tzinfo=UTC)), headers=host.headers)
    assert r.status_code == 200
    dev = client.get("/api/v1/devices", headers=admin.headers).json()[0]
    assert dev["telemetry"]["utilization_gpu"] == 44  # the host's data, under its time of receipt
    assert abs((datetime.fromisoformat(dev["telemetry"]["collected_at"]) - datetime.now(UTC)).total_seconds()) < 60
    assert "older than the 7-day replay window" in client.get("/api/v1/hosts/node-01", headers=admin.headers).json()["clock_trouble"]


def test_b40_clock_offset_reported_shown_for_the_host_and_in_metrics(client, make_host, make_user):
    admin = make_user("boss", admin=True)
    host = _host(client, make_host, "node-01", GA)
    r = client.post(POST, json=snapshot_body("node-01", 2, [gpu(GA, 0)], clock_offset_s=600.25), headers=host.headers)
    assert r.status_code == 200
    server_time = datetime.fromisoformat(r.json()["server_time"])
    assert abs((server_time - datetime.now(UTC)).total_seconds()) < 60  # the ack carries the service's time
    assert client.get("/api/v1/hosts/node-01", headers=admin.headers).json()["clock_offset_s"] == 600.25
    samples = {s.labels["host"]: s.value for s in scrape(client)["gpuroster_host_clock_offset_seconds"]}
    assert samples == {"node-01": 600.25}


# -- B46: a wiped state directory -----------------------------------------------------------


def test_b46_new_agent_instance_from_seq_0_is_taken_at_once_findings_included(client, make_host, make_user):
    admin = make_user("boss", admin=True)
    host = make_host("node-01")
    old = datetime.now(UTC) - timedelta(minutes=10)
    for seq in range(41):
        body = snapshot_body("node-01", seq, [gpu(GA, 0)], [_proc(GA, 1234, "bob")], agent_instance="old-agent",
                             collected_at=old + timedelta(seconds=5 * seq))
        assert client.post(POST, json=body, headers=host.headers).status_code == 200
    finding = {"key": f"{GA}:47700:1:unreserved", "kind": "unreserved", "device_uuid": GA, "pid": 47700,
               "unix_user": "alice", "first_seen": datetime.now(UTC).isoformat(), "last_seen": datetime.now(UTC).isoformat()}
    body = snapshot_body("node-01", 0, [gpu(GA, 0)], [_proc(GA, 47700)], agent_instance="new-agent", findings=[finding])
    r = client.post(POST, json=body, headers=host.headers)
    assert r.status_code == 200 and r.json()["duplicate"] is False
    dev = client.get("/api/v1/devices", headers=admin.headers).json()[0]
    assert [p["pid"] for p in dev["processes"]] == [47700]  # the old data is not shown as current
    found = client.get("/api/v1/findings", headers=admin.headers).json()["items"]
    assert [f["pid"] for f in found] == [47700]
    # the very same snapshot again is a true replay: duplicate, no conflict
    again = client.post(POST, json=body, headers=host.headers).json()
    assert again["duplicate"] is True and again["conflict"] is None


def test_b46_seq_reused_by_a_different_snapshot_is_a_logged_conflict(client, make_host, caplog):
    host = make_host("node-01")
    t = datetime.now(UTC)
    assert client.post(POST, json=snapshot_body("node-01", 5, [gpu(GA, 0)], collected_at=t - timedelta(hours=1)),
                       headers=host.headers).status_code == 200
    with caplog.at_level(logging.ERROR):
        ack = client.post(POST, json=snapshot_body("node-01", 5, [gpu(GA, 0)], collected_at=t), headers=host.headers).json()
    assert ack["duplicate"] is True and "already used by a snapshot collected at" in ack["conflict"]
    assert any("duplicate the service never had" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


# -- D1: a host token reaches only its own devices ------------------------------------------------


def test_d1_host_token_cannot_take_another_hosts_gpu(client, make_host, make_user, session_factory):
    admin = make_user("boss", admin=True)
    alice = make_user("alice")
    _host(client, make_host, "node-b", GB)
    node_a = _host(client, make_host, "node-a", GA)
    body = snapshot_body("node-a", 2, [gpu(GA, 0), gpu(GB, 1)], [_proc(GA, 11), _proc(GB, 22)])
    r = client.post(POST, json=body, headers=node_a.headers)
    assert r.status_code == 200
    devs = {d["uuid"]: d for d in client.get("/api/v1/devices", headers=admin.headers).json()}
    assert devs[GB]["host"] == "node-b" and devs[GB]["processes"] == []  # node-b keeps it, nothing mixed in
    assert devs[GA]["host"] == "node-a" and [p["pid"] for p in devs[GA]["processes"]] == [11]
    conflicts = client.get("/api/v1/device-conflicts", headers=admin.headers).json()
    assert [(c["uuid"], c["owner_host"], c["claimed_by"], c["count"]) for c in conflicts] == [(GB, "node-b", "node-a", 1)]
    assert client.get("/api/v1/device-conflicts", headers=alice.headers).status_code == 403
    client.post(POST, json={**body, "seq": 3}, headers=node_a.headers)
    assert client.get("/api/v1/device-conflicts", headers=admin.headers).json()[0]["count"] == 2
    audit = run_in_transaction(session_factory, lambda s: [
        (a.actor, a.action, a.target) for a in s.scalars(select(AuditLog).where(AuditLog.action == "device.claim_refused"))])
    assert audit == [("host:node-a", "device.claim_refused", f"device:{GB}")]  # once, not per snapshot
    # moving the GPU is an admin action
    assert client.post(f"/api/v1/devices/{GB}/move", json={"host": "node-a"}, headers=alice.headers).status_code == 403
    r = client.post(f"/api/v1/devices/{GB}/move", json={"host": "nope"}, headers=admin.headers)
    assert r.status_code == 404
    r = client.post(f"/api/v1/devices/{GB}/move", json={"host": "node-a"}, headers=admin.headers)
    assert r.status_code == 200 and r.json()["host"] == "node-a"
    assert client.get("/api/v1/device-conflicts", headers=admin.headers).json() == []
    owner = run_in_transaction(session_factory, lambda s: s.scalar(
        select(Host.name).join(Device, Device.host_id == Host.id).where(Device.uuid == GB)))
    assert owner == "node-a"


def test_d1_same_capture_replayed_under_two_host_names_is_not_mixed(client, make_host, make_user):
    admin = make_user("boss", admin=True)
    first = make_host("demo-a")
    second = make_host("demo-b")
    devices = [gpu(GA, 0), gpu(GB, 1)]
    assert client.post(POST, json=snapshot_body("demo-a", 1, devices, [_proc(GA, 5)]), headers=first.headers).status_code == 200
    assert client.post(POST, json=snapshot_body("demo-b", 1, devices, [_proc(GA, 6)]), headers=second.headers).status_code == 200
    devs = client.get("/api/v1/devices", headers=admin.headers).json()
    assert {d["host"] for d in devs} == {"demo-a"} and len(devs) == 2
    assert [p["pid"] for d in devs for p in d["processes"]] == [5]
    assert {c["claimed_by"] for c in client.get("/api/v1/device-conflicts", headers=admin.headers).json()} == {"demo-b"}


def test_move_refused_while_a_reservation_holds_the_gpu(client, make_host, make_user):
    from tests.conftest import book, future

    admin = make_user("boss", admin=True)
    alice = make_user("alice")
    _host(client, make_host, "node-01", GA)
    make_host("node-02")
    r = book(client, alice, [GA], future(2), future(3))
    assert r.status_code == 201, r.text
    r = client.post(f"/api/v1/devices/{GA}/move", json={"host": "node-02"}, headers=admin.headers)
    assert r.status_code == 409 and "reservation" in r.text


# -- D6 / D3: refused input is a 422 naming the field; bounded snapshots are taken ---------------------


def test_d6_naive_finding_times_are_a_422_naming_the_field(client, make_host):
    host = _host(client, make_host, "node-01", GA)
    finding = {"key": "k", "kind": "unreserved", "device_uuid": GA, "pid": 7, "first_seen": "2026-05-04T09:00:00",
               "last_seen": "2026-05-04T09:00:00"}
    r = client.post(POST, json=snapshot_body("node-01", 2, [gpu(GA, 0)], findings=[finding]), headers=host.headers)
    assert r.status_code == 422
    fields = {e["field"] for e in r.json()["errors"]}
    assert any("first_seen" in f for f in fields) and any("last_seen" in f for f in fields)


def test_d6_collected_at_out_of_utc_range_is_a_422(client, make_host):
    host = _host(client, make_host, "node-01", GA)
    body = snapshot_body("node-01", 2, [gpu(GA, 0)])
    body["collected_at"] = "9999-12-31T23:59:59-14:00"
    r = client.post(POST, json=body, headers=host.headers)
    assert r.status_code == 422 and any("collected_at" in e["field"] for e in r.json()["errors"])
    assert "out of range" in r.text


def test_d6_usage_report_from_year_9999_is_a_422(client, make_user):
    alice = make_user("alice")
    r = client.get("/api/v1/reports/usage?from=9999-12-01", headers=alice.headers)
    assert r.status_code == 422 and "from" in r.text
    assert client.get("/api/v1/reports/usage?to=0001-01-01", headers=alice.headers).status_code == 422


def test_d3_thirty_processes_with_4kb_command_lines_are_taken(client, make_host, make_user):
    admin = make_user("boss", admin=True)
    host = _host(client, make_host, "node-01", GA)

    class Source:
        def poll(self) -> Telemetry:
            return Telemetry(source="replay", replay_owners={}, devices=[DeviceReport(uuid=GA, index=0)], processes=[
                RawProcess(device_uuid=GA, pid=30000 + i, used_memory_mib=100.0, command="python " + "y" * 4090)
                for i in range(30)])

        def close(self) -> None:
            pass

    snap = SnapshotBuilder(Source(), host="node-01", max_command_length=4096).build(2, datetime.now(UTC))
    raw = snap.model_dump_json().encode()
    body = fit_body(snap, 64 * 1024)  # a tighter limit than the service's 256 KiB, to exercise trimming
    assert len(raw) > 64 * 1024 >= len(body)
    r = client.post(POST, content=body, headers={**host.headers, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    dev = client.get("/api/v1/devices", headers=admin.headers).json()[0]
    assert len(dev["processes"]) == 30  # command lines cut, every process kept


def test_d4_findings_of_a_future_dated_snapshot_do_not_outrank_later_reports(client, make_host, make_user):
    admin = make_user("boss", admin=True)
    host = _host(client, make_host, "node-01", GA)
    ahead = datetime.now(UTC) + timedelta(hours=1)

    def finding(at: datetime, state: str) -> dict:
        return {"key": f"{GA}:4242:1:unreserved", "kind": "unreserved", "device_uuid": GA, "pid": 4242, "unix_user": "alice",
                "first_seen": at.isoformat(), "last_seen": at.isoformat(), "state": state}

    r = client.post(POST, json=snapshot_body("node-01", 2, [gpu(GA, 0)], collected_at=ahead,
                                             findings=[finding(ahead, "open")]), headers=host.headers)
    assert r.status_code == 200
    now = datetime.now(UTC)
    r = client.post(POST, json=snapshot_body("node-01", 3, [gpu(GA, 0)], collected_at=now,
                                             findings=[finding(now, "notified")]), headers=host.headers)
    assert r.status_code == 200
    (f,) = client.get("/api/v1/findings", headers=admin.headers).json()["items"]
    assert f["state"] == "notified"
