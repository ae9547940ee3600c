"""The snapshot route's own path (raw body validated in one pass, one worker-thread call):
it answers bad input exactly as FastAPI's generic body handling does, refuses a rotated or
unknown host token on the next snapshot, keeps its request schema in the OpenAPI document,
and costs a fixed number of statements per snapshot, on both databases."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from agent.schema import Snapshot
from app.db import run_in_transaction
from app.problems import install_error_handlers
from app.services import hosts as host_service
from tests.conftest import Actor, gpu, request_statements, snapshot_body

URL = "/api/v1/agent/snapshots"
DEVICES = [gpu(f"GPU-{i}{i}{i}{i}bbbb-0000-0000-0000-00000000000{i}", i) for i in range(4)]


def _generic_client() -> TestClient:
    """A route taking the snapshot as FastAPI's ordinary body parameter, with the service's
    error handlers: the reference for what bad input is answered with."""
    ref = FastAPI()
    install_error_handlers(ref)

    @ref.post(URL)
    def take(snapshot: Snapshot) -> dict:
        return {}

    return TestClient(ref)


GOOD = json.dumps(snapshot_body("node-01", 1, DEVICES)).encode()
BAD_BODIES = [
    (b"", "application/json"),
    (b"{not json", "application/json"),
    (b"\xff\xfe{}", "application/json"),
    (b"[]", "application/json"),
    (b"{}", "application/json"),
    (json.dumps({**json.loads(GOOD), "seq": -1}).encode(), "application/json"),
    (json.dumps({**json.loads(GOOD), "collected_at": "2026-01-01T00:00:00"}).encode(), "application/json"),
    (json.dumps({**json.loads(GOOD), "devices": [{"uuid": ""}]}).encode(), "application/json"),
    (json.dumps({**json.loads(GOOD), "surprise": 1}).encode(), "application/json"),
    (json.dumps({**json.loads(GOOD), "devices": [{**DEVICES[0], "utilization_gpu": 101}]}).encode(), "application/json"),
    (GOOD, "text/plain"),
    (GOOD, "application/json; charset=utf-8"),  # valid: both answer past validation
    (GOOD, None),
]


@pytest.mark.parametrize("body,ctype", BAD_BODIES)
def test_bad_input_is_answered_as_fastapi_answers_it(client, make_host, body, ctype) -> None:
    host = make_host("node-01")
    headers = {**host.headers, **({"content-type": ctype} if ctype else {})}
    ours = client.post(URL, content=body, headers=headers)
    with _generic_client() as ref_client:
        ref = ref_client.post(URL, content=body, headers=headers)
    if ref.status_code == 200:
        assert ours.status_code == 200, ours.text
        return
    assert (ours.status_code, ours.json()["errors"] if ours.status_code == 422 else ours.json()["detail"]) == (
        ref.status_code, ref.json()["errors"] if ref.status_code == 422 else ref.json()["detail"])


def test_validation_comes_after_authentication_and_decoding_before(client) -> None:
    """As with FastAPI's dependencies: an undecodable body is a 422 whoever sends it, an
    invalid snapshot from an unknown token a 401."""
    bad_token = {"Authorization": "Bearer gph_nope"}
    assert client.post(URL, content=b"{", headers={**bad_token, "content-type": "application/json"}).status_code == 422
    assert client.post(URL, json={"seq": 1}, headers=bad_token).status_code == 401
    assert client.post(URL, json={"seq": 1}, headers={"Authorization": "Bearer user-token"}).status_code == 403
    assert client.post(URL, json={"seq": 1}).status_code == 401


def test_rotated_token_is_refused_on_the_next_snapshot(client, make_host, session_factory) -> None:
    host = make_host("node-01")
    assert client.post(URL, json=snapshot_body("node-01", 1, DEVICES), headers=host.headers).status_code == 200

    def rotate(s):
        return host_service.rotate_host_token(s, host=host_service.get_host(s, "node-01"), actor="test")

    new = Actor("node-01", run_in_transaction(session_factory, rotate))
    r = client.post(URL, json=snapshot_body("node-01", 2, DEVICES), headers=host.headers)
    assert r.status_code == 401, r.text
    assert client.post(URL, json=snapshot_body("node-01", 3, DEVICES), headers=new.headers).status_code == 200


def test_request_schema_stays_in_the_openapi_document(client) -> None:
    doc = client.get("/openapi.json").json()
    body = doc["paths"][URL]["post"]["requestBody"]
    assert body == {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Snapshot"}}}, "required": True}
    schemas = doc["components"]["schemas"]
    for name in ("Snapshot", "DeviceReport", "ProcessReport", "FindingReport", "HealthCheck", "MonitoringReport"):
        assert name in schemas
    assert schemas["Snapshot"]["additionalProperties"] is False


@pytest.mark.commits  # counts every statement: the test transaction's savepoints would add to them
def test_statements_per_unchanged_snapshot(app, client, make_host) -> None:
    """A snapshot that changes nothing but its time: host lookup, seq claim, devices with
    their telemetry, three touches (devices, telemetry, processes), processes read, host row,
    check-in, rollups, and the ack's one read (table, open devices, uid table). On PostgreSQL
    the touches are CTEs of the host row's UPDATE: 8 statements instead of 11. Either way the
    touched rows carry the new snapshot's times afterwards."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import text

    host = make_host("node-01")
    procs = [{"device_uuid": DEVICES[0]["uuid"], "pid": 4242, "used_memory_mib": 100.0, "unix_user": "alice"}]
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    for seq in (1, 2):
        body = snapshot_body("node-01", seq, DEVICES, procs, collected_at=t0 + timedelta(seconds=seq))
        assert client.post(URL, json=body, headers=host.headers).status_code == 200
    with request_statements(app.state.engine) as statements:
        body = snapshot_body("node-01", 3, DEVICES, procs, collected_at=t0 + timedelta(seconds=3))
        assert client.post(URL, json=body, headers=host.headers).status_code == 200
    seen = [" ".join(s.split()[:3]).upper() for s in statements]
    work = [s for s in seen if s.split()[0] not in ("BEGIN", "SAVEPOINT", "RELEASE")]
    assert len(work) == (8 if app.state.engine.dialect.name == "postgresql" else 11), "\n".join(seen)
    with app.state.engine.connect() as c:
        host_row = c.execute(text("SELECT id, last_collected_at, last_seen_at FROM hosts WHERE name = 'node-01'")).one()
        collected = {r[0] for r in c.execute(text("SELECT collected_at FROM device_telemetry t JOIN devices d "
                                                 "ON d.id = t.device_id WHERE d.host_id = :h"), {"h": host_row[0]})}
        seen_at = {r[0] for r in c.execute(text("SELECT seen_at FROM device_processes WHERE host_id = :h"), {"h": host_row[0]})}
        last_seen = {r[0] for r in c.execute(text("SELECT last_seen_at FROM devices WHERE host_id = :h"), {"h": host_row[0]})}
    as_utc = lambda v: (v if isinstance(v, datetime) else datetime.fromisoformat(v)).replace(tzinfo=UTC)  # noqa: E731
    assert as_utc(host_row[1]) == t0 + timedelta(seconds=3)
    assert {as_utc(v) for v in collected} == {t0 + timedelta(seconds=3)} and len(collected) == 1
    assert {as_utc(v) for v in seen_at} == {t0 + timedelta(seconds=3)}
    assert {as_utc(v) for v in last_seen} == {as_utc(host_row[2])}  # receipt time, as the host row's
