"""The findings page: open and recent findings with offender, device, process, state and
notices, as reported by an agent; on both databases."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import gpu, snapshot_body


@pytest.fixture
def reported(weblab, client):
    now = datetime.now(UTC)
    t0 = now - timedelta(minutes=10)
    uuid0, uuid1 = weblab.devices[0], weblab.devices[1]
    findings = [
        {"key": f"{uuid0}:4711:1.0:unreserved", "kind": "unreserved", "device_uuid": uuid0, "pid": 4711, "create_time": 1.0,
         "unix_user": "mallory", "uid": 1500, "command": "python train.py --epochs 90", "container_id": "c0ffee1234567890abcd",
         "first_seen": t0.isoformat(), "last_seen": now.isoformat(), "state": "notified",
         "notices": [{"channel": "terminal", "recipient": "mallory", "at": now.isoformat(), "delivered": 2}]},
        {"key": f"{uuid1}:5000:2.0:overrun", "kind": "overrun", "device_uuid": uuid1, "pid": 5000, "create_time": 2.0,
         "unix_user": "eve", "uid": 1501, "command": "./sim", "first_seen": t0.isoformat(),
         "last_seen": (now - timedelta(minutes=1)).isoformat(), "state": "terminated",
         "actions": [{"action": "sigterm", "pid": 5000, "create_time": 2.0, "at": now.isoformat(), "reason": "grace over"}]},
    ]
    body = snapshot_body("node-01", 2, [gpu(u, i) for i, u in enumerate(weblab.devices)], findings=findings)
    r = client.post("/api/v1/agent/snapshots", json=body, headers={"Authorization": f"Bearer {weblab.host_token}"})
    assert r.status_code == 200, r.text


def _section(page: str, title: str) -> str:
    return page.split(f"<h2>{title}", 1)[1].split("</section>", 1)[0]


def test_open_finding_shows_offender_device_process_state_and_notices(weblab, reported):
    page = weblab.admin.get("/findings").text
    open_ = _section(page, "Open")
    assert "(1)" in open_
    assert "<strong>mallory</strong>" in open_ and "uid 1500" in open_
    assert f'title="UUID {weblab.devices[0]}' in open_ and "node-01 · " in open_ and ">GPU 0</span>" in open_
    assert "pid 4711" in open_ and "python train.py --epochs 90" in open_ and "c0ffee123456" in open_
    assert 'class="badge k-notified">notified</span>' in open_
    assert re.search(r"\d+ sent", open_) and "terminal to mallory" in open_
    assert "eve" not in open_


def test_closed_finding_is_listed_with_its_enforcement_action(weblab, reported):
    closed = _section(weblab.bob.get("/findings").text, "Closed in the last 7 days")
    assert "<strong>eve</strong>" in closed and 'class="badge k-terminated">terminated</span>' in closed
    assert "sigterm" in closed and "overrun" in closed and ">GPU 1</span>" in closed


def test_notice_recipients_only_for_admins_and_the_offender(weblab, reported):
    page = weblab.bob.get("/findings").text
    open_ = _section(page, "Open")
    assert re.search(r"\d+ sent", open_) and "to mallory" not in open_ and "<div>terminal, <time" in open_


def test_no_findings(weblab):
    page = weblab.bob.get("/findings").text
    assert "No open findings." in page and "None." in page


def test_a_finding_of_a_replayed_host_is_marked_replay(weblab, client, reported):
    page = weblab.admin.get("/findings").text
    assert "badge replay" not in page  # node-01 reports live GPUs
    body = snapshot_body("node-01", 3, [gpu(u, i) for i, u in enumerate(weblab.devices)], source="replay",
                         replay_of=["k80.xml"])
    assert client.post("/api/v1/agent/snapshots", json=body,
                       headers={"Authorization": f"Bearer {weblab.host_token}"}).status_code == 200
    open_ = _section(weblab.admin.get("/findings").text, "Open")
    assert 'node-01 <span class="badge replay"' in open_
