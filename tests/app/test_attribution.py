"""Attribution on the service, both databases: users' Unix uids (API, server CLI), the
uids in the agent's ack, findings nobody can be named for (B37, B38) with their container
details, the admins told, and ``GET /devices`` showing such owners (the pages: in
``tests/web/test_attribution_pages.py``)."""

from __future__ import annotations

import pytest

from datetime import UTC, datetime

from sqlalchemy import select
from typer.testing import CliRunner

from agent.schema import DeviceReport, FindingReport, ProcessReport, Snapshot
from app.db import run_in_transaction
from app.models import AuditLog, User
from app.services import hosts as host_service
from app.services import ingest
from app.services import notices
from app.services import users as user_service
from tests.app.test_notices import conf, factory, mailbox  # noqa: F401 - fixtures: SMTP server, settings
from tests.conftest import book, snapshot_body

CID = "d0c4e7" + "0" * 58
NOW = datetime.now(UTC).replace(microsecond=0)


def test_admin_sets_a_users_unix_uid_unique_and_clearable(client, lab) -> None:
    r = client.patch("/api/v1/users/alice", json={"unix_uid": 20001}, headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["unix_uid"] == 20001
    r = client.patch("/api/v1/users/bob", json={"unix_uid": 20001}, headers=lab.admin.headers)
    assert r.status_code == 409 and "unix_uid" in r.text and "alice" in r.text
    for bad in (-1, 2**32 - 1, "x"):
        r = client.patch("/api/v1/users/bob", json={"unix_uid": bad}, headers=lab.admin.headers)
        assert r.status_code == 422 and "unix_uid" in r.text
    assert client.patch("/api/v1/users/alice", json={"unix_uid": 7}, headers=lab.alice.headers).status_code == 403
    r = client.post("/api/v1/users", json={"username": "dana", "unix_uid": 20001}, headers=lab.admin.headers)
    assert r.status_code == 409 and "unix_uid" in r.text
    r = client.post("/api/v1/users", json={"username": "dana", "unix_uid": 20002}, headers=lab.admin.headers)
    assert r.status_code == 201 and r.json()["unix_uid"] == 20002
    r = client.patch("/api/v1/users/alice", json={"unix_uid": None}, headers=lab.admin.headers)
    assert r.status_code == 200 and r.json()["unix_uid"] is None
    assert client.patch("/api/v1/users/bob", json={"unix_uid": 20001}, headers=lab.admin.headers).status_code == 200


def test_ack_carries_the_holders_uid_and_the_uid_table(client, lab) -> None:
    client.patch("/api/v1/users/alice", json={"unix_uid": 20001}, headers=lab.admin.headers)
    client.patch("/api/v1/users/bob", json={"unix_uid": 20002, "active": False}, headers=lab.admin.headers)
    assert book(client, lab.alice, [0], "now", duration="PT2H").status_code == 201
    devices = [{"uuid": u, "index": i} for i, u in enumerate(lab.devices)]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, devices), headers=lab.host.headers)
    ack = r.json()
    assert [(e["unix_name"], e["unix_uid"]) for e in ack["reservations"]] == [("alice", 20001)]
    assert ack["unix_uids"] == {"20001": "alice"}  # bob is deactivated


def _uid_process(lab, **kw) -> dict:
    return {"device_uuid": lab.devices[0], "pid": 20011, "uid": 20001, "unix_user": None, "name": "python",
            "command": "python train.py", "used_memory_mib": 20480, "owner_status": "uid_only",
            "identity": "123456@6f0e-boot", **kw}


def test_B37_uid_without_passwd_entry_is_shown_by_uid_then_by_its_user(client, lab) -> None:
    devices = [{"uuid": u, "index": i} for i, u in enumerate(lab.devices)]
    body = snapshot_body("node-01", 2, devices, [_uid_process(lab)])
    assert client.post("/api/v1/agent/snapshots", json=body, headers=lab.host.headers).status_code == 200
    [d0] = [d for d in client.get("/api/v1/devices", headers=lab.bob.headers).json() if d["uuid"] == lab.devices[0]]
    assert d0["status"] == "in-use" and d0["processes"][0]["owner"] == "uid 20001, unknown to gpuroster"
    client.patch("/api/v1/users/alice", json={"unix_uid": 20001}, headers=lab.admin.headers)
    [d0] = [d for d in client.get("/api/v1/devices", headers=lab.bob.headers).json() if d["uuid"] == lab.devices[0]]
    assert d0["processes"][0]["owner"] == "alice (uid 20001)"


def test_B38_unattributed_container_finding_reaches_the_api_and_the_device_view(client, lab) -> None:
    assert book(client, lab.bob, [0], "now", duration="PT2H").status_code == 201
    devices = [{"uuid": u, "index": i} for i, u in enumerate(lab.devices)]
    proc = {"device_uuid": lab.devices[0], "pid": 41001, "uid": 0, "unix_user": None, "name": "python",
            "used_memory_mib": 30720, "owner_status": "unattributed", "container_id": CID,
            "container_name": "jupyter", "container_image": "jupyter/base-notebook:latest", "identity": "77@boot"}
    finding = {"key": f"{lab.devices[0]}:41001:77@boot:unattributed", "kind": "unattributed",
               "device_uuid": lab.devices[0], "pid": 41001, "identity": "77@boot", "uid": 0, "container_id": CID,
               "container_name": "jupyter", "container_image": "jupyter/base-notebook:latest", "holder": "bob",
               "first_seen": NOW.isoformat(), "last_seen": NOW.isoformat(), "state": "open"}
    body = snapshot_body("node-01", 2, devices, [proc], findings=[finding])
    assert client.post("/api/v1/agent/snapshots", json=body, headers=lab.host.headers).status_code == 200
    [f] = client.get("/api/v1/findings", params={"kind": "unattributed"}, headers=lab.admin.headers).json()["items"]
    assert client.get("/api/v1/findings", params={"kind": "unknown_uid"}, headers=lab.admin.headers).json()["items"] == []
    assert (f["kind"], f["unix_user"], f["holder"], f["container_id"], f["container_name"], f["container_image"]) == (
        "unattributed", None, "bob", CID, "jupyter", "jupyter/base-notebook:latest")
    [d0] = [d for d in client.get("/api/v1/devices", headers=lab.bob.headers).json() if d["uuid"] == lab.devices[0]]
    assert d0["status"] == "finding" and d0["processes"][0]["owner"] == "unattributed container"
    assert d0["processes"][0]["unix_user"] is None  # the device never shows bob, the holder, as its user


@pytest.mark.commits  # a CLI command reads what the test committed
def test_server_cli_sets_and_clears_a_uid(client, lab, settings, session_factory, monkeypatch) -> None:
    from app import cli

    monkeypatch.setattr(cli, "get_settings", lambda: settings)
    runner = CliRunner()
    r = runner.invoke(cli.cli, ["admin", "set-uid", "alice", "20001"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli.cli, ["admin", "set-uid", "bob", "20001"])
    assert r.exit_code == 2 and "unix_uid" in r.output
    r = runner.invoke(cli.cli, ["admin", "set-uid", "bob", "12x"])
    assert r.exit_code == 2 and "unix_uid" in r.output
    with session_factory() as s:
        assert s.scalar(select(User.unix_uid).where(User.username == "alice")) == 20001
        assert s.scalar(select(AuditLog.actor).where(AuditLog.action == "user.update")) == "cli"
    assert runner.invoke(cli.cli, ["admin", "set-uid", "alice", "none"]).exit_code == 0
    with session_factory() as s:
        assert s.scalar(select(User.unix_uid).where(User.username == "alice")) is None


def test_admins_are_told_of_unattributed_and_unknown_uid_findings(factory, conf, mailbox) -> None:  # noqa: F811
    box, _ = mailbox

    def setup(s):
        user_service.create_user(s, username="boss", email="boss@lab.example", admin=True)
        user_service.create_user(s, username="bob", email="bob@lab.example")
        host_service.create_host(s, name="node-01")

    run_in_transaction(factory, setup)
    g0 = "GPU-eeee0000-0000-0000-0000-000000000000"
    t0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    reports = [
        FindingReport(key=f"{g0}:41001:77@b:unattributed", kind="unattributed", device_uuid=g0, pid=41001, uid=0,
                      container_id=CID, container_name="jupyter", container_image="jupyter/base-notebook:latest",
                      holder="bob", first_seen=t0, last_seen=t0, state="open"),
        FindingReport(key=f"{g0}:20011:78@b:unknown_uid", kind="unknown_uid", device_uuid=g0, pid=20011, uid=20001,
                      holder="bob", first_seen=t0, last_seen=t0, state="open"),
    ]

    def work(s):
        h = host_service.get_host(s, "node-01")
        snap = Snapshot(host="node-01", seq=1, collected_at=t0, devices=[DeviceReport(uuid=g0, index=0)],
                        processes=[ProcessReport(device_uuid=g0, pid=20011, uid=20001, owner_status="uid_only")],
                        findings=reports)
        return ingest.ingest_snapshot(s, host=h, snap=snap, settings=conf, now=t0)

    run_in_transaction(factory, work)
    assert notices.wait_idle(30)
    to_admin = box.to("boss@lab.example")
    assert len(to_admin) == 2 and len(box.to("bob@lab.example")) == 2
    bodies = " ".join(m.get_payload() for m in to_admin)
    assert "name jupyter, image jupyter/base-notebook:latest" in bodies and "uid 20001, unknown to gpuroster" in bodies
    assert not any("None" in m["Subject"] for m in to_admin)
