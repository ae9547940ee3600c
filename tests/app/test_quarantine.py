"""Health quarantine: a device in a critical condition is refused for booking, never placed,
its holders and the admins told; admins clear it, slowdowns clear by themselves. Both databases."""

from __future__ import annotations

import pytest

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from tests.conftest import book, future, gpu, snapshot_body

XID = [{"kind": "xid", "state": "bad", "value": 79}]


def post(client, lab, seq, checks_by_index, **extra):
    devices = []
    for i, uuid in enumerate(lab.devices):
        d = gpu(uuid, i)
        d["health_checks"] = checks_by_index.get(i, [{"kind": "xid", "state": "ok"}])
        devices.append(d)
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", seq, devices, **extra), headers=lab.host.headers)
    assert r.status_code == 200, r.text
    return r


def notices(session_factory, username):
    from app.models import AuditLog

    with session_factory() as s:
        return [a.detail["text"] for a in s.scalars(select(AuditLog).where(
            AuditLog.action == "notice.reservation", AuditLog.target == f"user:{username}").order_by(AuditLog.id))]


def test_critical_xid_quarantines_the_device_and_booking_gets_409_naming_it(client, lab):
    post(client, lab, 2, {1: XID})
    r = book(client, lab.alice, [lab.devices[1]], future(2))
    assert r.status_code == 409, r.text
    assert lab.devices[1] in r.json()["detail"] and "XID 79" in r.json()["detail"]
    assert "quarantined since" in r.json()["detail"] and "+00:00" not in r.json()["detail"]
    listed = client.get("/api/v1/quarantines", headers=lab.alice.headers).json()
    assert [q["device"] for q in listed] == [lab.devices[1]]
    assert listed[0]["conditions"][0]["key"] == "xid:79" and listed[0]["self_clearing"] is False
    assert book(client, lab.alice, [lab.devices[0]], future(2)).status_code == 201


def test_application_xid_and_unknown_readings_quarantine_nothing(client, lab):
    post(client, lab, 2, {0: [{"kind": "xid", "state": "bad", "value": 13}],
                          1: [{"kind": "ecc_uncorrected", "state": "unknown"}, {"kind": "gpu_lost", "state": "unknown"}],
                          2: [{"kind": "ecc_uncorrected", "state": "ok", "value": 0}]})
    assert client.get("/api/v1/quarantines", headers=lab.alice.headers).json() == []


def test_placement_never_chooses_a_quarantined_device(client, lab):
    post(client, lab, 2, {i: XID for i in (0, 1, 3)})
    start = future(3).isoformat()
    r = client.post("/api/v1/reservations", json={"count": 1, "start": start, "duration": "PT1H"}, headers=lab.alice.headers)
    assert r.status_code == 201, r.text
    assert [d["uuid"] for d in r.json()["devices"]] == [lab.devices[2]]
    # the only healthy device is taken: placement moves to a later time rather than a quarantined device
    r = client.post("/api/v1/reservations", json={"count": 1, "start": start, "duration": "PT1H"}, headers=lab.bob.headers)
    assert r.status_code == 201, r.text
    assert [d["uuid"] for d in r.json()["devices"]] == [lab.devices[2]] and r.json()["start"] > start
    r = client.post("/api/v1/reservations", json={"count": 2, "start": start, "duration": "PT1H"}, headers=lab.alice.headers)
    assert r.status_code in (409, 422) and r.headers["content-type"].startswith("application/problem+json"), r.text


def test_series_and_mig_slices_of_a_quarantined_gpu_are_refused(client, lab, make_host):
    post(client, lab, 2, {0: XID})
    r = client.post("/api/v1/series", json={"host": "node-01", "devices": [0], "freq": "daily", "count": 2,
                                            "start_date": future(48).date().isoformat(), "start_time": "10:00",
                                            "duration": "PT1H"}, headers=lab.alice.headers)
    assert r.status_code == 409 and lab.devices[0] in r.json()["detail"], r.text
    host = make_host("node-mig")
    parent = "GPU-77777777-0000-0000-0000-000000000000"
    devices = [gpu(parent, 0, mig_mode=True, health_checks=[{"kind": "remapped_rows_failure", "state": "bad"}]),
               {"uuid": "MIG-77777777-0000-0000-0000-000000000001", "index": 0, "parent_uuid": parent,
                "mig_profile": "3g.40gb", "gpu_instance_id": 1, "memory_total_mib": 40192.0}]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-mig", 1, devices), headers=host.headers)
    assert r.status_code == 200, r.text
    r = book(client, lab.alice, ["MIG-77777777-0000-0000-0000-000000000001"], future(2), host="node-mig")
    assert r.status_code == 409 and "memory row remapping failed" in r.json()["detail"], r.text


def test_holders_are_told_with_an_equivalent_free_device_and_admins_are_told(client, lab, session_factory):
    assert book(client, lab.alice, [lab.devices[1]], "now", duration="PT1H").status_code == 201  # current
    assert book(client, lab.bob, [lab.devices[1]], future(5)).status_code == 201
    for other in (0, 2, 3):  # bob's window: every other device taken
        assert book(client, lab.admin, [lab.devices[other]], future(5)).status_code == 201
    post(client, lab, 2, {1: [{"kind": "ecc_uncorrected", "state": "bad", "value": 2}]})
    alice = notices(session_factory, "alice")
    assert len(alice) == 1 and "2 uncorrectable ECC errors" in alice[0]
    assert "An equivalent device is free for that time" in alice[0] and lab.devices[0] in alice[0]
    assert f"GPU 1 ({lab.devices[1]}) of host node-01" in alice[0] and f"GPU 0 ({lab.devices[0]})" in alice[0]
    bob = notices(session_factory, "bob")
    assert len(bob) == 1 and "No equivalent device is free" in bob[0]
    boss = notices(session_factory, "boss")
    assert len(boss) == 1 and "alice" in boss[0] and "bob" in boss[0] and "clear-quarantine" in boss[0]
    post(client, lab, 3, {1: [{"kind": "ecc_uncorrected", "state": "bad", "value": 2}]})  # same state: nobody told again
    assert len(notices(session_factory, "alice")) == 1


def test_admin_clear_acknowledges_the_count_until_it_rises(client, lab, session_factory):
    ecc = lambda n: {1: [{"kind": "ecc_uncorrected", "state": "bad", "value": n}]}  # noqa: E731
    post(client, lab, 2, ecc(3))
    uuid = lab.devices[1]
    assert client.post(f"/api/v1/devices/{uuid}/clear-quarantine", json={}, headers=lab.alice.headers).status_code == 403
    r = client.post(f"/api/v1/devices/{uuid}/clear-quarantine", json={"note": "reset"}, headers=lab.admin.headers)
    assert r.status_code == 200, r.text
    assert r.json()["cleared_by"] == "user:boss" and r.json()["clear_note"] == "reset"
    again = client.post(f"/api/v1/devices/{uuid}/clear-quarantine", json={}, headers=lab.admin.headers)
    assert again.status_code == 409 and again.headers["content-type"].startswith("application/problem+json")
    assert client.post("/api/v1/devices/GPU-nope/clear-quarantine", json={}, headers=lab.admin.headers).status_code == 404
    post(client, lab, 3, ecc(3))  # the acknowledged count: still bookable
    assert book(client, lab.alice, [uuid], future(2)).status_code == 201
    post(client, lab, 4, ecc(4))  # a new error: quarantined again
    assert book(client, lab.alice, [uuid], future(4)).status_code == 409
    from app.models import AuditLog

    with session_factory() as s:
        actions = [a.action for a in s.scalars(select(AuditLog).where(AuditLog.target == f"device:{uuid}").order_by(AuditLog.id))]
    assert actions == ["quarantine.open", "quarantine.clear", "quarantine.open"]


def test_thermal_slowdown_clears_itself_after_the_hold(app, client, lab, session_factory):
    from agent.schema import Snapshot
    from app.models import Host
    from app.services.ingest import ingest_snapshot

    settings = app.state.settings
    t0 = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)  # after the lab's snapshot

    def at(seq, t, hot):
        devices = []
        for i, uuid in enumerate(lab.devices):
            d = gpu(uuid, i)
            d["health_checks"] = [{"kind": "thermal_slowdown", "state": "bad" if hot and i == 2 else "ok"}]
            devices.append(d)
        snap = Snapshot.model_validate(snapshot_body("node-01", seq, devices, collected_at=t))
        with session_factory.begin() as s:
            host = s.scalar(select(Host).where(Host.name == "node-01"))
            ingest_snapshot(s, host=host, snap=snap, settings=settings, now=t)

    hold = timedelta(seconds=settings.health_self_clear_seconds)
    at(10, t0, True)
    assert book(client, lab.alice, [lab.devices[2]], future(2)).status_code == 409
    at(11, t0 + timedelta(seconds=10), False)  # cooled down: the hold starts
    at(12, t0 + timedelta(seconds=20), True)  # hot again: the hold starts over
    at(13, t0 + timedelta(seconds=30), False)
    at(14, t0 + timedelta(seconds=30) + hold - timedelta(seconds=1), False)
    assert book(client, lab.alice, [lab.devices[2]], future(2)).status_code == 409
    at(15, t0 + timedelta(seconds=30) + hold, False)
    assert book(client, lab.alice, [lab.devices[2]], future(2)).status_code == 201
    q = client.get("/api/v1/quarantines?include_cleared=true", headers=lab.alice.headers).json()[0]
    assert q["cleared_by"] == "system" and q["self_clearing"] is True


def test_lost_gpu_stays_quarantined_when_it_comes_back_and_stale_snapshots_change_nothing(client, lab):
    post(client, lab, 2, {3: XID}, stale=True)
    assert client.get("/api/v1/quarantines", headers=lab.alice.headers).json() == []
    devices = [gpu(u, i) for i, u in enumerate(lab.devices)]
    devices[0]["health"] = "lost"
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 3, devices), headers=lab.host.headers)
    assert r.status_code == 200
    post(client, lab, 4, {})  # back on the bus: still needs an admin
    listed = client.get("/api/v1/quarantines", headers=lab.alice.headers).json()
    assert [(q["device"], q["conditions"][0]["kind"]) for q in listed] == [(lab.devices[0], "gpu_lost")]


def test_maintenance_may_hold_a_quarantined_device(client, lab):
    post(client, lab, 2, {1: XID})
    r = client.post("/api/v1/maintenance", json={"host": "node-01", "devices": [lab.devices[1]],
                                                   "start": future(1).isoformat(), "reason": "reset GPU"},
                    headers=lab.admin.headers)
    assert r.status_code == 201, r.text


def test_metrics_export_the_health_state_per_device(client, lab):
    from prometheus_client.parser import text_string_to_metric_families

    post(client, lab, 2, {1: XID + [{"kind": "power_slowdown", "state": "bad"}]})
    fams = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    state = {s.labels["uuid"]: s.value for s in fams["gpuroster_device_quarantined"].samples}
    assert state == {lab.devices[0]: 0, lab.devices[1]: 1, lab.devices[2]: 0, lab.devices[3]: 0}
    conds = sorted((s.labels["uuid"], s.labels["kind"]) for s in fams["gpuroster_device_health_condition"].samples)
    assert conds == [(lab.devices[1], "power_slowdown"), (lab.devices[1], "xid")]


def test_a_replayed_capture_with_pending_retirement_quarantines_its_gpu(client, lab, make_host):
    from agent.replay import parse_capture
    from tests.conftest import CORPUS

    host = make_host("replay-01")
    cap = parse_capture((CORPUS / "pai__nvidia_smi_retired_pages.xml").read_bytes(), "retired_pages.xml")
    devices = [d.model_dump(mode="json", exclude_none=True) for d in cap.devices]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("replay-01", 1, devices, source="replay"),
                    headers=host.headers)
    assert r.status_code == 200, r.text
    listed = client.get("/api/v1/quarantines", headers=lab.alice.headers).json()
    assert [(q["host"], q["device"]) for q in listed] == [("replay-01", cap.devices[0].uuid)]
    assert {c["kind"] for c in listed[0]["conditions"]} == {"ecc_uncorrected", "retired_pages_pending"}


@pytest.mark.commits  # a CLI command reads what the test committed
def test_cli_clear_quarantine_clears_and_names_errors(client, lab, settings, monkeypatch):
    from typer.testing import CliRunner

    from app import cli

    post(client, lab, 2, {3: XID})
    monkeypatch.setattr(cli, "get_settings", lambda: settings)
    runner = CliRunner()
    r = runner.invoke(cli.cli, ["admin", "clear-quarantine", lab.devices[3], "--note", "reseated"])
    assert r.exit_code == 0, r.output
    assert "quarantine cleared (XID 79 error)" in r.output
    assert book(client, lab.alice, [lab.devices[3]], future(2)).status_code == 201
    r = runner.invoke(cli.cli, ["admin", "clear-quarantine", lab.devices[3]])
    assert r.exit_code == 2 and "is not quarantined" in r.output
    listed = client.get("/api/v1/quarantines?include_cleared=true", headers=lab.alice.headers).json()
    assert listed[0]["cleared_by"] == "cli" and listed[0]["clear_note"] == "reseated"


def test_ingest_reads_health_state_only_when_needed_and_writes_only_on_change(app, client, lab):
    from tests.app.test_booking_statements import _statements

    engine = app.state.engine
    _, healthy = _statements(engine, lambda: post(client, lab, 2, {}))
    assert not [s for s in healthy if "device_quarantines" in s or "health_ack" in s]
    post(client, lab, 3, {1: [{"kind": "remapped_rows_pending", "state": "bad"}]})
    _, same = _statements(engine, lambda: post(client, lab, 4, {1: [{"kind": "remapped_rows_pending", "state": "bad"}]}))
    touching = [s for s in same if "device_quarantines" in s or "health_watch" in s or "health_ack" in s]
    assert touching and all(s.lstrip().upper().startswith("SELECT") for s in touching), touching


def test_device_list_and_device_read_name_the_quarantine(client, lab):
    post(client, lab, 2, {1: [{"kind": "thermal_slowdown", "state": "bad"}]})
    listed = {d["uuid"]: d["quarantine"] for d in client.get("/api/v1/devices", headers=lab.alice.headers).json()}
    assert listed[lab.devices[0]] is None
    assert listed[lab.devices[1]]["reason"] == "thermal slowdown" and listed[lab.devices[1]]["self_clearing"] is True


def test_notices_name_a_mig_slice_as_people_read_it_everywhere():
    from app.models import Device, Host
    from app.services.quarantine_notices import device_label

    whole = Device(id=7, uuid="GPU-5e5e5e5e-0000-0000-0000-000000000000", index=2)
    mig = Device(id=8, uuid="MIG-40000000-0000-0000-0000-000000000000", index=0, parent_id=7, gpu_instance_id=4)
    session = type("S", (), {"get": staticmethod(lambda model, key: {7: whole}[key])})()
    host = Host(name="node-01")
    assert device_label(session, mig, host) == f"GPU 2 · MIG 4 ({mig.uuid}) of host node-01"
    assert device_label(session, whole, host) == f"GPU 2 ({whole.uuid}) of host node-01"
