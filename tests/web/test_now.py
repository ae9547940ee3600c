"""The Now page and its htmx fragment with replayed telemetry (a real nvidia-smi capture
played back by the agent's replay source): a finding, a lost GPU, a stale agent."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from agent.collect import SnapshotBuilder
from agent.replay import ReplaySource
from agent.schema import FindingReport, ProcessReport
from app.db import transaction
from app.models import Host
from tests.conftest import future, gpu, snapshot_body

CAPTURE = Path(__file__).resolve().parents[2] / "agent" / "captures" / "pai__nvidia_smi_out_of_order.xml"
HX = {"HX-Request": "true"}


def _device_block(html: str, uuid: str) -> str:
    """The ``<article>`` of one device on the Now page."""
    for part in html.split('<article class="dev')[1:]:
        block = part.split("</article>", 1)[0]
        if uuid in block:
            return block
    raise AssertionError(f"device {uuid} not on the page")


def _host_block(html: str, name: str) -> str:
    for part in html.split('<section class="card host"')[1:]:
        if f">{name}</h2>" in part:
            return part.split("</section>", 1)[0]
    raise AssertionError(f"host {name} not on the page")


@pytest.fixture
def replayed(weblab, client, make_host, tmp_path, session_factory):
    """Host ``k80-replay`` fed from a capture: GPU 3 lost, a finding on pid 58813, a process
    with no name and unknown memory; host ``stale-01`` silent for longer than 3 intervals;
    alice holds GPU 1 of node-01 now, bob has GPU 2 later."""
    owners = tmp_path / "owners.json"
    owners.write_text(json.dumps({"58813": {"user": "mallory", "uid": 1234, "container_id": "0123456789abcdef0123"},
                                  "58642": "alice"}))
    host = make_host("k80-replay")
    now = datetime.now(UTC)
    snap = SnapshotBuilder(ReplaySource([CAPTURE], owners=owners), host="k80-replay").build(seq=1, now=now)
    by_index = {d.index: d for d in snap.devices}
    lost = by_index[3]
    lost.health, lost.error = "lost", "GPU is lost"
    lost.memory_used_mib = lost.utilization_gpu = lost.temperature_c = lost.power_draw_w = None
    offender = next(p for p in snap.processes if p.pid == 58813)
    snap.processes.append(ProcessReport(device_uuid=by_index[2].uuid, pid=4242, used_memory_mib=None, name=None,
                                        owner_status="unknown"))
    snap.findings.append(FindingReport(
        key=f"{offender.device_uuid}:58813:0:unreserved", kind="unreserved", device_uuid=offender.device_uuid,
        pid=58813, unix_user="mallory", uid=1234, command="python", first_seen=now - timedelta(minutes=5),
        last_seen=now, state="open", message="no reservation covers this process",
    ))
    r = client.post("/api/v1/agent/snapshots", json=snap.model_dump(mode="json"), headers=host.headers)
    assert r.status_code == 200, r.text

    stale = make_host("stale-01")
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("stale-01", 1, [gpu("GPU-5555stale", 0)]), headers=stale.headers)
    assert r.status_code == 200
    with transaction(session_factory, write=True) as s:
        s.execute(update(Host).where(Host.name == "stale-01").values(last_seen_at=datetime.now(UTC) - timedelta(minutes=5)))

    for who, dev, start in ((weblab.alice, 1, "now"), (weblab.bob, 2, future(3).isoformat())):
        body = {"host": "node-01", "devices": [dev], "start": start, "duration": "PT2H", "note": f"{who.username}-job"}
        r = who.client.post("/api/v1/reservations", json=body, headers={"X-CSRF-Token": who.csrf})
        assert r.status_code == 201, r.text
    return {"snap": snap, "offender": offender, "lost": lost, "by_index": by_index}


def test_fragment_is_only_the_hosts_block_and_varies_on_hx_request(weblab, replayed):
    r = weblab.alice.get("/", headers=HX)
    assert r.status_code == 200
    assert "HX-Request" in r.headers["vary"]
    assert "<html" not in r.text and "<nav" not in r.text and 'id="hosts"' not in r.text
    assert "k80-replay" in r.text and "node-01" in r.text
    full = weblab.alice.get("/")
    assert "HX-Request" in full.headers["vary"]
    assert "<html" in full.text and 'hx-get="/"' in full.text
    # polling pauses in a hidden tab through static/app.js (a trigger filter would need eval, which the CSP forbids)
    assert 'hx-trigger="every 5s" data-poll-when-visible' in full.text


def test_replayed_host_is_labelled_replay_with_capture_names(weblab, replayed):
    block = _host_block(weblab.alice.get("/", headers=HX).text, "k80-replay")
    assert 'class="badge replay"' in block and ">replay</span>" in block
    assert "Replay of pai__nvidia_smi_out_of_order.xml" in block
    assert "replay" not in _host_block(weblab.alice.get("/", headers=HX).text, "node-01").lower()


def test_finding_process_is_marked_with_user_pid_container_and_memory(weblab, replayed):
    off = replayed["offender"]
    block = _device_block(weblab.alice.get("/", headers=HX).text, off.device_uuid)
    assert 'class="badge s-finding">finding</span>' in block
    row = next(r for r in block.split("<tr")[1:] if ">58813<" in r)
    assert 'class="finding"' in row and "finding: unreserved" in row
    assert "mallory" in row and "python" in row and "0123456789ab" in row
    assert f"{off.used_memory_mib:.0f} MiB" in row
    other = next(p for p in replayed["snap"].processes if p.pid == 58642)
    other_row = next(r for r in _device_block(weblab.alice.get("/", headers=HX).text, other.device_uuid).split("<tr")[1:] if ">58642<" in r)
    assert 'class="finding"' not in other_row and "alice" in other_row


def test_lost_gpu_shows_badge_and_na_never_zero(weblab, replayed):
    block = _device_block(weblab.alice.get("/", headers=HX).text, replayed["lost"].uuid)
    assert 'class="badge s-lost">lost GPU</span>' in block
    assert "NVML reports this GPU lost: GPU is lost" in block
    assert re.search(r"n/a / [\d.]+ GiB</span>", block)
    assert "<span class=\"k\">util</span> n/a" in block and "<span class=\"k\">temp</span> n/a" in block


def test_unknown_memory_and_empty_name_read_na_and_unnamed(weblab, replayed):
    block = _device_block(weblab.alice.get("/", headers=HX).text, replayed["by_index"][2].uuid)
    row = next(r for r in block.split("<tr")[1:] if ">4242<" in r)
    assert "(unnamed)" in row and ">n/a</td>" in row and "unknown" in row


def test_stale_agent_marks_host_and_its_devices(weblab, replayed):
    html = weblab.alice.get("/", headers=HX).text
    block = _host_block(html, "stale-01")
    assert 'class="badge h-stale">stale agent</span>' in block
    assert 'class="badge s-stale">stale agent</span>' in _device_block(html, "GPU-5555stale")
    assert "last snapshot 5m ago" in block


def test_holder_until_and_free_until_and_free(weblab, replayed):
    html = weblab.alice.get("/", headers=HX).text
    held = _device_block(html, weblab.devices[1])
    assert "<strong>alice</strong> until" in held and "alice-job" in held
    assert 'class="badge s-reserved-idle">reserved, idle</span>' in held
    later = _device_block(html, weblab.devices[2])
    assert 'class="badge s-free">free</span>' in later and "<span>until <time" in later and "then bob" in later
    free = _device_block(html, weblab.devices[3])  # the badge says it, once: "free", not "free free"
    assert 'class="badge s-free">free</span>' in free and "<span>free</span>" not in free and "reserved" not in free
    # a device in use with no reservation: the text says what is reserved (nothing), never "free"
    offender = _device_block(html, replayed["offender"].device_uuid)
    assert 'class="badge s-finding">finding</span>' in offender and "<span>not reserved</span>" in offender
    assert ">free<" not in offender


def test_uuid_and_bus_id_are_on_the_page(weblab, replayed):
    block = _device_block(weblab.alice.get("/", headers=HX).text, weblab.devices[0])
    assert f"<code>{weblab.devices[0]}</code>" in block and "<code>00000000:01:00.0</code>" in block
    assert f'title="UUID {weblab.devices[0]} · bus id 00000000:01:00.0"' in block


def test_times_are_in_lab_zone_with_utc_on_hover(weblab, replayed, settings):
    html = weblab.alice.get("/", headers=HX).text
    held = _device_block(html, weblab.devices[1])
    m = re.search(r'until <time datetime="([^"]+)" title="([^"]+) UTC">([^<]+)</time>', held)
    assert m, held
    end = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
    assert m.group(2) == end.strftime("%Y-%m-%d %H:%M")
    assert end.astimezone(settings.tz).strftime("%H:%M") in m.group(3)


def test_now_shows_25_hosts_a_page_with_links_and_all_on_request(weblab, client, make_host):
    for i in range(30):
        h = make_host(f"rack-{i:02d}")
        body = snapshot_body(f"rack-{i:02d}", 1, [gpu(f"GPU-{i:04d}0000-page-0000-0000-000000000000", 0)])
        assert client.post("/api/v1/agent/snapshots", json=body, headers=h.headers).status_code == 200
    first = weblab.alice.get("/")
    assert "Page 1 of 2" in first.text and 'href="/?page=2"' in first.text and 'hx-get="/"' in first.text
    assert first.text.count('class="card host"') == 25 and "rack-23" in first.text and "rack-24" not in first.text
    second = weblab.alice.get("/?page=2", headers=HX)  # the fragment the second page polls
    assert second.text.count('class="card host"') == 6 and "rack-24" in second.text and "node-01" not in second.text
    every = weblab.alice.get("/?all=1")
    assert every.text.count('class="card host"') == 31 and 'hx-get="/?all=1"' in every.text
    assert weblab.alice.get("/?page=99").text.count('class="card host"') == 6  # past the end: the last page
