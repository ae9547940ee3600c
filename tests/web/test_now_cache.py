"""The Now page reuses a host's devices between its snapshots, yet every change shows on the
next view: a new snapshot, a booking and its release, a retired device; and views between
snapshots read no device of a host again."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.services.now_state import NowCache
from tests.conftest import future, gpu, snapshot_body
from tests.web.test_now import HX, _device_block


def _post(client, weblab, seq: int, used: float) -> None:
    devices = [gpu(u, i, memory_used_mib=used if i == 0 else 0.0) for i, u in enumerate(weblab.devices)]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("node-01", seq, devices),
                    headers={"Authorization": f"Bearer {weblab.host_token}"})
    assert r.status_code == 200, r.text


def test_views_between_snapshots_reuse_the_devices_and_a_new_snapshot_shows_at_once(app, client, weblab):
    _post(client, weblab, 2, 2048.0)
    assert "2.0 GiB" in _device_block(weblab.alice.get("/", headers=HX).text, weblab.devices[0])
    cache: NowCache = app.state.now_cache
    misses = cache.misses
    for _ in range(3):
        assert "2.0 GiB" in _device_block(weblab.alice.get("/", headers=HX).text, weblab.devices[0])
    assert cache.misses == misses  # no new snapshot: the host's devices were not read again
    _post(client, weblab, 3, 3072.0)
    block = _device_block(weblab.alice.get("/", headers=HX).text, weblab.devices[0])
    assert "3.0 GiB" in block and "2.0 GiB" not in block
    assert cache.misses == misses + 1


@pytest.mark.parametrize("url", ["/", "/?all=1"], ids=["page", "every-host"])
def test_booking_and_release_show_on_the_next_view_without_a_snapshot(weblab, url):
    # "/?all=1" takes the holders from the lab-wide cache shared with the device list and /metrics
    uuid = weblab.devices[1]
    assert "free" in _device_block(weblab.alice.get(url, headers=HX).text, uuid)
    later = {"host": "node-01", "devices": [1], "start": future(5).isoformat(), "duration": "PT1H", "note": "next-one"}
    r = weblab.bob.client.post("/api/v1/reservations", json=later, headers={"X-CSRF-Token": weblab.bob.csrf})
    assert r.status_code == 201, r.text
    assert "next-one" in _device_block(weblab.alice.get(url, headers=HX).text, uuid) or \
        "bob" in _device_block(weblab.alice.get(url, headers=HX).text, uuid)
    body = {"host": "node-01", "devices": [1], "start": "now", "duration": "PT2H", "note": "cache-check"}
    r = weblab.alice.client.post("/api/v1/reservations", json=body, headers={"X-CSRF-Token": weblab.alice.csrf})
    assert r.status_code == 201, r.text
    block = _device_block(weblab.bob.get(url, headers=HX).text, uuid)
    assert "<strong>alice</strong> until" in block and "cache-check" in block
    r = weblab.alice.client.post(f"/api/v1/reservations/{r.json()['id']}/release",
                                 headers={"X-CSRF-Token": weblab.alice.csrf})
    assert r.status_code == 200, r.text
    block = _device_block(weblab.bob.get(url, headers=HX).text, uuid)
    assert "alice" not in block and "cache-check" not in block


def test_retired_device_leaves_the_page_on_the_next_view(weblab):
    uuid = weblab.devices[3]
    assert uuid in weblab.alice.get("/", headers=HX).text
    r = weblab.admin.client.patch(f"/api/v1/devices/{uuid}", json={"retired": True},
                                  headers={"X-CSRF-Token": weblab.admin.csrf})
    assert r.status_code == 200, r.text
    assert uuid not in weblab.alice.get("/", headers=HX).text


def test_clearing_a_quarantine_shows_on_the_next_view_without_a_snapshot(client, weblab):
    from tests.web.test_quarantine_pages import quarantine

    uuid = weblab.devices[2]
    quarantine(client, weblab, 2, [{"kind": "xid", "state": "bad", "value": 48}])
    block = _device_block(weblab.alice.get("/", headers=HX).text, uuid)
    assert "data-quarantined" in block and "not bookable" in block and "XID 48 error" in block
    assert "XID 48 error" in _device_block(weblab.alice.get("/", headers=HX).text, uuid)  # drawn once, reused
    r = weblab.admin.post("/admin/devices/clear-quarantine", {"uuid": uuid, "note": "GPU reset"})
    assert r.status_code == 303, r.text
    block = _device_block(weblab.alice.get("/", headers=HX).text, uuid)
    assert "data-quarantined" not in block and "not bookable" not in block and "XID 48 error" not in block
    assert ">free<" in block


def _host_head(html: str) -> str:
    """The head of host ``node-01``'s card on the Now page."""
    return html.split('<header class="host-head">', 1)[1].split("</header>", 1)[0]


def test_host_head_is_drawn_once_yet_its_age_and_each_change_show_on_the_next_view(app, client, weblab):
    from sqlalchemy import select

    from app.db import run_in_transaction
    from app.models import Host

    cache: NowCache = app.state.now_cache
    r = client.post("/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {weblab.host_token}"},
                    json=snapshot_body("node-01", 2, [gpu(u, i) for i, u in enumerate(weblab.devices)],
                                       interval_seconds=600, driver_version="550.54.15"))
    assert r.status_code == 200, r.text
    head = _host_head(weblab.alice.get("/", headers=HX).text)
    assert "driver 550.54.15" in head and "last snapshot 0s ago" in head
    (host_id,) = cache._drawn  # the only host: its head drawn once, in English

    def seen_ago(minutes: int) -> None:
        def work(s):
            for host in s.scalars(select(Host)):
                host.last_seen_at -= timedelta(minutes=minutes)
        run_in_transaction(app.state.session_factory, work)

    seen_ago(5)  # the age moves without a snapshot: the same drawing, the new age
    drawn = dict(cache.drawn(host_id))
    head = _host_head(weblab.alice.get("/", headers=HX).text)
    assert "last snapshot 5m ago" in head and "driver 550.54.15" in head
    assert cache.drawn(host_id) == drawn
    assert "<ago/>" not in weblab.alice.get("/?all=1").text

    # what the agent reports changes the head; a marker-like value is text, not a marker
    r = client.post("/api/v1/agent/snapshots", headers={"Authorization": f"Bearer {weblab.host_token}"},
                    json=snapshot_body("node-01", 3, [gpu(u, i) for i, u in enumerate(weblab.devices)],
                                       interval_seconds=600, driver_version="560.1 <ago/>"))
    assert r.status_code == 200, r.text
    head = _host_head(weblab.alice.get("/", headers=HX).text)
    assert "driver 560.1 &lt;ago/&gt;" in head and "550.54.15" not in head and "last snapshot 0s ago" in head

    seen_ago(60)  # stale: the badge changes with the age alone
    head = _host_head(weblab.alice.get("/", headers=HX).text)
    assert "stale agent" in head and "last snapshot 1h" in head

    # the reader's language: drawn again in Chinese beside the English drawing
    weblab.alice.client.headers["Accept-Language"] = "zh-CN"
    try:
        html = weblab.alice.get("/", headers=HX).text
    finally:
        del weblab.alice.client.headers["Accept-Language"]
    assert len(cache.drawn(host_id)) == 2 and "最近快照" in _host_head(html)
