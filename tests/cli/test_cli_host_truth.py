"""``gpuroster status`` shows occupied/unreliable devices and a host's clock offset;
``gpuroster move-device`` is the admin's way to move a GPU (live server, both databases)."""

from __future__ import annotations

import pytest

import httpx

from tests.cli.test_cli import lab, server  # noqa: F401 - fixtures
from tests.conftest import gpu, snapshot_body

pytestmark = pytest.mark.commits  # CLI commands read what the test committed

NEW_GPU = "GPU-9999dddd-0000-0000-0000-000000000009"


def test_status_shows_unlisted_defunct_unreliable_and_clock_offset(lab, server):  # noqa: F811
    from app.config import Settings
    from app.db import build_engine, build_session_factory, run_in_transaction
    from app.services import hosts as host_service

    engine = build_engine(Settings(database_url=server.db_url))
    token = run_in_transaction(build_session_factory(engine), lambda s: host_service.rotate_host_token(
        s, host=host_service.get_host(s, "node-01"), actor="test"))
    engine.dispose()
    devices = [gpu(u, i) for i, u in enumerate(lab.devices)]
    devices[0].update(memory_used_mib=8192.0, process_data="unlisted", last_owner="bob",
                      process_data_detail="8192 MiB in use but no process listed")
    devices[3].update(process_data="unreliable", process_data_detail="processes hold 4096 MiB but the device has 1024 MiB")
    r = httpx.post(server.url + "/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {token}"},
                   json=snapshot_body("node-01", 2, devices, agent_instance="t", clock_offset_s=-7.5))
    assert r.status_code == 200, r.text
    out = lab.cli("status", token="alice")
    assert out.returncode == 0, out.stderr
    row0 = next(x for x in out.stdout.splitlines() if x.startswith("node-01") and x.split()[1] == "0")
    assert "occupied-unlisted" in row0 and "[unlisted process, last seen: bob]" in row0 and "free" not in row0
    row3 = next(x for x in out.stdout.splitlines() if x.startswith("node-01") and x.split()[1] == "3")
    assert "unreliable" in row3 and "[process data unreliable]" in row3
    assert "node-01: host clock 7.5 s ahead of the service's" in out.stdout


def test_move_device_is_an_admin_command(lab, server):  # noqa: F811
    assert lab.api("POST", "/hosts", lab.admin, json={"name": "node-02"}).status_code == 201
    out = lab.cli("move-device", lab.devices[3], "--to", "node-02", token="alice")
    assert out.returncode != 0 and "admin" in (out.stderr + out.stdout).lower()
    out = lab.cli("move-device", lab.devices[3], "--to", "node-02", token="admin")
    assert out.returncode == 0, out.stderr
    assert f"{lab.devices[3]} now belongs to node-02" in out.stdout
    devices = {d["uuid"]: d["host"] for d in lab.api("GET", "/devices", lab.admin).json()}
    assert devices[lab.devices[3]] == "node-02"
