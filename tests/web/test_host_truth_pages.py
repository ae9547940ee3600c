"""Pages for host, clock and NVML truth: the Now page shows occupied/unreliable devices and
a host's clock offset; the next holder of an occupied device is warned before it starts;
admins see device conflicts and move a GPU (both databases)."""

from __future__ import annotations

from sqlalchemy import select

from app.db import transaction
from app.models import AuditLog
from tests.conftest import book, future, gpu, snapshot_body
from tests.web.test_now import _device_block, _host_block

POST = "/api/v1/agent/snapshots"


def _post(client, weblab, seq: int, devices: list[dict], **extra) -> None:
    r = client.post(POST, json=snapshot_body("node-01", seq, devices, **extra),
                    headers={"Authorization": f"Bearer {weblab.host_token}"})
    assert r.status_code == 200, r.text


def test_now_page_shows_occupied_unreliable_and_clock_offset(client, weblab):
    devices = [gpu(u, i) for i, u in enumerate(weblab.devices)]
    devices[0].update(memory_used_mib=8192.0, process_data="unlisted", last_owner="bob",
                      process_data_detail="8192 MiB in use but no process listed")
    devices[1].update(memory_used_mib=6144.0, process_data="defunct", process_data_detail="memory held by defunct (zombie) process 41002")
    devices[2].update(process_data="unreliable", process_data_detail="processes hold 4096 MiB but the device has 1024 MiB in use")
    _post(client, weblab, 2, devices, clock_offset_s=600.0)
    html = weblab.alice.get("/").text
    first = _device_block(html, weblab.devices[0])
    assert 'data-status="occupied-unlisted"' in first and "occupied, unlisted process" in first
    assert "last seen: bob" in first and ">free<" not in first and "Nothing is signalled" in first
    second = _device_block(html, weblab.devices[1])
    assert 'data-status="occupied-unlisted"' in second and "defunct (zombie)" in second
    third = _device_block(html, weblab.devices[2])
    assert 'data-status="unreliable"' in third and "Process data unreliable" in third
    host = _host_block(html, "node-01")
    assert "Host clock 600.0 s behind the service" in host
    admin = weblab.admin.get("/admin").text
    assert "Host clock 600.0 s behind the service" in admin


def test_next_holder_of_an_occupied_device_is_warned_before_it_starts(client, weblab, session_factory, make_user):
    carol = make_user("carol")
    r = book(client, carol, [weblab.devices[0]], future(3), future(4))
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    devices = [gpu(u, i) for i, u in enumerate(weblab.devices)]
    devices[0].update(memory_used_mib=8192.0, process_data="unlisted", last_owner="bob")
    _post(client, weblab, 2, devices)
    _post(client, weblab, 3, devices)  # warned once, not on every snapshot
    with session_factory() as s:
        rows = list(s.scalars(select(AuditLog).where(AuditLog.action == "reservation.occupied_warning")))
    assert [(a.target, a.detail["user"]) for a in rows] == [(f"reservation:{rid}/device:{weblab.devices[0]}", "carol")]
    assert "last seen: bob" in rows[0].detail["message"]
    # alice books the same GPU later: her "My reservations" page carries the warning
    r = book(client, _actor(session_factory, "alice"), [weblab.devices[0]], future(6), future(7))
    assert r.status_code == 201, r.text
    mine = weblab.alice.get("/me/reservations").text
    assert f"{weblab.devices[0]} is occupied by a process NVML does not list (last seen: bob)" in mine


def _actor(session_factory, username: str):
    from app.models import User
    from app.services import users as user_service
    from tests.conftest import Actor

    with transaction(session_factory, write=True) as s:
        user = s.scalar(select(User).where(User.username == username))
        token = user_service.create_api_token(s, user=user, name="t")[1]
    return Actor(username, token)


def test_admin_page_lists_conflicts_and_moves_the_gpu(client, weblab, make_host):
    other = make_host("node-02")
    r = client.post(POST, json=snapshot_body("node-02", 1, [gpu(weblab.devices[3], 0)]),
                    headers={"Authorization": f"Bearer {other.token}"})
    assert r.status_code == 200
    page = weblab.admin.get("/admin").text
    assert "a host reported another host's GPU" in page and weblab.devices[3] in page and "Move to node-02" in page
    r = weblab.admin.post("/admin/devices/move", {"uuid": weblab.devices[3], "host": "node-02"})
    assert r.status_code == 303
    assert "a host reported another host's GPU" not in weblab.admin.get("/admin").text
    now = weblab.alice.get("/").text
    assert weblab.devices[3] in _host_block(now, "node-02")
