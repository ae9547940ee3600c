"""``/metrics``: parsed with prometheus_client's own parser, values from the latest snapshot,
no series for what vanished, counters from database rows (so every process agrees)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, update

from app.db import run_in_transaction
from app.models import Finding, Host, Notice
from tests.conftest import future, gpu, snapshot_body

MIB = 1024 * 1024


def scrape(client) -> dict[str, list]:
    """Metric name -> samples of a scrape, parsed by prometheus_client."""
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def by_uuid(samples: dict[str, list], name: str) -> dict[str, tuple[dict, float]]:
    return {s.labels["uuid"]: (s.labels, s.value) for s in samples.get(name, [])}


def telemetry(**kw) -> dict:
    base = dict(memory_used_mib=1000.0, utilization_gpu=50.0, temperature_c=60.0, power_draw_w=200.0)
    base.update(kw)
    return base


def test_device_gauges_match_the_latest_snapshot_with_holder_label(client, lab):
    d0, d1, d2, d3 = lab.devices
    r = client.post("/api/v1/reservations", headers=lab.alice.headers,
                    json={"host": "node-01", "devices": [d1], "start": "now", "end": future(2).isoformat()})
    assert r.status_code == 201, r.text
    devices = [
        gpu(d0, 0, **telemetry(utilization_gpu=97.0, memory_used_mib=40960.0, temperature_c=71.0, power_draw_w=312.5)),
        gpu(d1, 1, **telemetry(utilization_gpu=3.0, memory_used_mib=512.0, temperature_c=35.0, power_draw_w=61.0)),
        gpu(d2, 2, **telemetry(utilization_gpu=None, power_draw_w=None)),  # NVML could not say: no sample, never 0
        gpu(d3, 3, **telemetry()),
    ]
    procs = [{"device_uuid": d0, "pid": 4242, "unix_user": "bob", "uid": 1002, "used_memory_mib": 40000.0, "name": "python"}]
    r = client.post("/api/v1/agent/snapshots", headers=lab.host.headers, json=snapshot_body("node-01", 2, devices, procs))
    assert r.status_code == 200, r.text

    m = scrape(client)
    util = by_uuid(m, "gpuroster_device_utilization_percent")
    assert util[d0][1] == 97.0 and util[d1][1] == 3.0
    assert d2 not in util, "a value NVML could not give must have no sample"
    labels = util[d1][0]
    assert labels == {"host": "node-01", "index": "1", "uuid": d1, "model": "NVIDIA A100-SXM4-80GB", "holder": "alice"}
    assert util[d0][0]["holder"] == ""
    assert by_uuid(m, "gpuroster_device_memory_used_bytes")[d0][1] == 40960.0 * MIB
    assert by_uuid(m, "gpuroster_device_memory_total_bytes")[d0][1] == 81920 * MIB
    assert by_uuid(m, "gpuroster_device_temperature_celsius")[d1][1] == 35.0
    power = by_uuid(m, "gpuroster_device_power_watts")
    assert power[d0][1] == 312.5 and d2 not in power
    proc = m["gpuroster_process_memory_used_bytes"]
    assert [(s.labels["pid"], s.labels["user"], s.value) for s in proc] == [("4242", "bob", 40000.0 * MIB)]
    age = {s.labels["host"]: s.value for s in m["gpuroster_host_seconds_since_snapshot"]}
    assert 0 <= age["node-01"] < 30
    assert {s.labels["host"]: s.value for s in m["gpuroster_host_up"]} == {"node-01": 1.0}


def test_vanished_device_and_process_have_no_series(client, lab):
    d0, d1, d2, d3 = lab.devices
    procs = [{"device_uuid": d0, "pid": 77, "unix_user": "bob", "uid": 1002, "used_memory_mib": 100.0}]
    all_four = [gpu(u, i, **telemetry()) for i, u in enumerate(lab.devices)]
    assert client.post("/api/v1/agent/snapshots", headers=lab.host.headers,
                       json=snapshot_body("node-01", 2, all_four, procs)).status_code == 200
    m = scrape(client)
    assert set(by_uuid(m, "gpuroster_device_utilization_percent")) == set(lab.devices)
    assert len(m["gpuroster_process_memory_used_bytes"]) == 1

    # GPU 3 falls off the bus and the process ends: the next snapshot lists neither.
    three = [gpu(u, i, **telemetry()) for i, u in enumerate(lab.devices[:3])]
    assert client.post("/api/v1/agent/snapshots", headers=lab.host.headers,
                       json=snapshot_body("node-01", 3, three)).status_code == 200
    m = scrape(client)
    for name in ("gpuroster_device_utilization_percent", "gpuroster_device_memory_used_bytes",
                 "gpuroster_device_temperature_celsius"):
        assert set(by_uuid(m, name)) == {d0, d1, d2}, name
    assert "gpuroster_process_memory_used_bytes" not in m


def test_stale_host_drops_device_gauges_and_reports_its_age(client, lab, session_factory):
    devices = [gpu(u, i, **telemetry()) for i, u in enumerate(lab.devices)]
    assert client.post("/api/v1/agent/snapshots", headers=lab.host.headers,
                       json=snapshot_body("node-01", 2, devices)).status_code == 200
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    run_in_transaction(session_factory, lambda s: s.execute(update(Host).values(last_seen_at=long_ago)))
    m = scrape(client)
    assert "gpuroster_device_utilization_percent" not in m
    assert {s.labels["host"]: s.value for s in m["gpuroster_host_up"]} == {"node-01": 0.0}
    age = {s.labels["host"]: s.value for s in m["gpuroster_host_seconds_since_snapshot"]}["node-01"]
    assert 590 < age < 700


def test_counters_count_bookings_conflicts_findings_and_notices(client, lab, session_factory):
    d0 = lab.devices[0]
    body = {"host": "node-01", "devices": [d0], "start": future(1).isoformat(), "end": future(3).isoformat()}
    assert client.post("/api/v1/reservations", headers=lab.alice.headers, json=body).status_code == 201
    refused = client.post("/api/v1/reservations", headers=lab.bob.headers, json=body)
    assert refused.status_code == 409
    problem = refused.json()
    assert problem["type"] == "/problems/reservation-conflict" and problem["conflicts"], "the 409 must be unchanged"
    assert client.post("/api/v1/reservations", headers=lab.bob.headers, json=body).status_code == 409

    now = datetime.now(UTC)
    finding = {"key": f"{d0}:999:-:unreserved", "kind": "unreserved", "device_uuid": d0, "pid": 999,
               "unix_user": "bob", "uid": 1002, "first_seen": now.isoformat(), "last_seen": now.isoformat()}
    devices = [gpu(u, i) for i, u in enumerate(lab.devices)]
    assert client.post("/api/v1/agent/snapshots", headers=lab.host.headers,
                       json=snapshot_body("node-01", 2, devices, findings=[finding])).status_code == 200

    def add_notice(s):
        f = s.query(Finding).one()
        s.add(Notice(finding_id=f.id, channel="terminal", recipient="bob", sent_at=now))

    run_in_transaction(session_factory, add_notice)
    m = scrape(client)
    assert m["gpuroster_reservations_created_total"][0].value == 1
    assert m["gpuroster_reservation_conflicts_total"][0].value == 2
    assert {s.labels["kind"]: s.value for s in m["gpuroster_findings_total"]} == {"unreserved": 1}
    notices = {s.labels["channel"]: s.value for s in m["gpuroster_notices_total"]}
    with session_factory() as s:  # the service may add notices of its own (web): the counter is the row count
        rows = dict(s.execute(select(Notice.channel, func.count()).group_by(Notice.channel)).all())
    assert notices == rows and notices["terminal"] == 1
    assert [(s.labels, s.value) for s in m["gpuroster_findings_open"]] == [({"host": "node-01", "kind": "unreserved"}, 1)]


@pytest.mark.commits  # a second app reads what the first committed
def test_two_app_instances_on_one_database_scrape_the_same(settings, client, lab):
    """Nothing comes from a process's memory: a second app (another worker) answers the same."""
    from app.main import create_app

    devices = [gpu(u, i, **telemetry(utilization_gpu=10.0 * i)) for i, u in enumerate(lab.devices)]
    assert client.post("/api/v1/agent/snapshots", headers=lab.host.headers,
                       json=snapshot_body("node-01", 2, devices)).status_code == 200
    body = {"host": "node-01", "devices": [lab.devices[0]], "start": future(1).isoformat(), "end": future(2).isoformat()}
    assert client.post("/api/v1/reservations", headers=lab.alice.headers, json=body).status_code == 201
    with TestClient(create_app(settings)) as other:
        assert other.post("/api/v1/reservations", headers=lab.bob.headers, json=body).status_code == 409

        def stable(c):
            return {k: sorted((tuple(sorted(s.labels.items())), s.value) for s in v)
                    for k, v in scrape(c).items() if k != "gpuroster_host_seconds_since_snapshot"}

        assert stable(client) == stable(other)
        assert scrape(client)["gpuroster_reservation_conflicts_total"][0].value == 1


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_health_endpoints_answer(client, path):
    r = client.get(path)
    assert r.status_code == 200
    assert r.json()["status"] in ("ok", "ready")


@pytest.mark.commits  # an app on an unmigrated database of its own
def test_readyz_is_503_not_500_when_the_database_is_behind(tmp_path):
    """A database that was never migrated: not ready (503 naming the fix), never a 500."""
    from app.config import Settings
    from app.main import create_app

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'empty.db'}", data_dir=tmp_path, environment="test")
    with TestClient(create_app(settings)) as c:
        r = c.get("/readyz")
        assert r.status_code == 503
        assert "gpuroster migrate" in r.json()["detail"]
        assert c.get("/healthz").status_code == 200


def test_text_gauge_writes_what_prometheus_client_writes():
    """The per-device families skip prometheus_client's per-sample work but must read the same."""
    from prometheus_client import generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from app.services.metrics import TextGauge, _Families

    labels = ("host", "uuid", "model")
    samples = [
        (("node-01", "GPU-1", 'A100 "SXM4"\\80GB\nx'), 97.0),
        (("node-02", "MIG-2", ""), 81920 * MIB),
        (("nödé", "GPU-3", "H100"), 1e-7),
        (("n", "GPU-4", "H100"), 123456789012.5),
        (("n", "GPU-5", "H100"), float("nan")),
    ]
    ours = TextGauge("gpuroster_x_bytes", "a help text, with \\ and\nnewline", labels)
    theirs = GaugeMetricFamily("gpuroster_x_bytes", "a help text, with \\ and\nnewline", labels=labels)
    for lab, value in samples:
        ours.add_metric(lab, value)
        theirs.add_metric(lab, value)
    assert ours.text().encode() == generate_latest(_Families([theirs]))
    empty = TextGauge("gpuroster_y", "nothing", labels)
    assert empty.text().encode() == generate_latest(_Families([GaugeMetricFamily("gpuroster_y", "nothing", labels=labels)]))


def test_mig_instances_are_labelled_parent_index_slash_gpu_instance(client, lab, make_host):
    mig = make_host("node-09")
    parent = "GPU-99999999-0000-0000-0000-000000000009"
    devices = [
        gpu(parent, 3, mig_mode=True, **telemetry()),
        {"uuid": "MIG-11111111-0000-0000-0000-000000000009", "index": 0, "parent_uuid": parent, "mig_profile": "3g.40gb",
         "gpu_instance_id": 2, "memory_total_mib": 40192.0, **telemetry(utilization_gpu=None)},
    ]
    r = client.post("/api/v1/agent/snapshots", headers=mig.headers, json=snapshot_body("node-09", 1, devices))
    assert r.status_code == 200, r.text
    mem = by_uuid(scrape(client), "gpuroster_device_memory_total_bytes")
    assert mem[parent][0]["index"] == "3"
    assert mem["MIG-11111111-0000-0000-0000-000000000009"][0]["index"] == "3/2"
    assert mem["MIG-11111111-0000-0000-0000-000000000009"][1] == 40192.0 * MIB
