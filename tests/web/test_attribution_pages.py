"""The admin page sets a user's Unix uid (directory users), refuses a taken or malformed one
naming the field, and clears it; both databases."""

from __future__ import annotations

from sqlalchemy import select

from app.models import User


def _uid(session_factory, name: str) -> int | None:
    with session_factory() as s:
        return s.scalar(select(User.unix_uid).where(User.username == name))


def test_admin_page_sets_refuses_and_clears_a_unix_uid(weblab, session_factory) -> None:
    form = {"role": "member", "unix_name": "alice", "unix_uid": "20005"}
    r = weblab.admin.post("/admin/users/alice", form)
    assert r.status_code == 303, r.text
    assert _uid(session_factory, "alice") == 20005
    assert 'value="20005"' in weblab.admin.get("/admin").text
    r = weblab.admin.post("/admin/users/bob", {**form, "unix_name": "bob"})
    assert r.status_code == 409 and "unix_uid" in r.text and "alice" in r.text
    r = weblab.admin.post("/admin/users/bob", {**form, "unix_name": "bob", "unix_uid": "x1"})
    assert r.status_code in (400, 422) and "unix_uid" in r.text
    assert _uid(session_factory, "bob") is None
    r = weblab.admin.post("/admin/users", {"username": "dana", "unix_uid": "20006"})
    assert r.status_code == 303 and _uid(session_factory, "dana") == 20006
    # the activation form carries no uid: it leaves the uid alone
    assert weblab.admin.post("/admin/users/alice", {"active": "0"}).status_code == 303
    assert _uid(session_factory, "alice") == 20005
    assert weblab.admin.post("/admin/users/alice", {**form, "unix_uid": ""}).status_code == 303
    assert _uid(session_factory, "alice") is None
    assert weblab.bob.post("/admin/users/bob", {**form, "unix_name": "bob"}).status_code == 403


def test_now_and_findings_pages_show_owners_nobody_can_name(client, weblab) -> None:
    """B37/B38 as the pages show them: 'uid 20001, unknown to gpuroster' and 'unattributed
    container' on the Now page; the container's name and image on the admins' findings page."""
    from datetime import UTC, datetime

    from tests.conftest import gpu, snapshot_body

    now = datetime.now(UTC).replace(microsecond=0).isoformat()
    cid = "d0c4e7" + "0" * 58
    devices = [gpu(u, i) for i, u in enumerate(weblab.devices)]
    procs = [
        {"device_uuid": weblab.devices[0], "pid": 41001, "uid": 0, "name": "python", "owner_status": "unattributed",
         "container_id": cid, "container_name": "jupyter", "container_image": "jupyter/base-notebook:latest"},
        {"device_uuid": weblab.devices[1], "pid": 20011, "uid": 20001, "name": "python", "owner_status": "uid_only"},
    ]
    finding = {"key": f"{weblab.devices[0]}:41001:77@boot:unattributed", "kind": "unattributed",
               "device_uuid": weblab.devices[0], "pid": 41001, "uid": 0, "container_id": cid,
               "container_name": "jupyter", "container_image": "jupyter/base-notebook:latest",
               "first_seen": now, "last_seen": now, "state": "open"}
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", 2, devices, procs, findings=[finding]),
                    headers={"Authorization": f"Bearer {weblab.host_token}"})
    assert r.status_code == 200, r.text
    page = weblab.bob.get("/").text
    assert "unattributed container" in page and "uid 20001, unknown to gpuroster" in page
    findings = weblab.admin.get("/findings").text
    assert "unattributed container" in findings and "jupyter/base-notebook:latest" in findings
