"""Who holds a device: one rule (``conflicts.holdings``) seen through every surface.

The case: a whole GPU in MIG mode whose slice "GPU 0 · MIG 3" alice booked now. The whole
GPU is not free (its memory and SMs are partly hers), the booked slice is hers, the other
slice is free. The API, the Now page, the Timeline, ``/metrics`` and the CLI must all say so,
and all name the slice the same way.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from app.client import api as client_api
from app.client.api import Api
from app.services.conflicts import Holding, holder_at
from tests.conftest import book, gpu, snapshot_body
from tests.web.conftest import PASSWORD

WHOLE = "GPU-5e5e5e5e-0000-0000-0000-000000000000"
GI2 = "MIG-20000000-0000-0000-0000-000000000000"
GI3 = "MIG-30000000-0000-0000-0000-000000000000"
TELEMETRY = dict(memory_used_mib=1000.0, utilization_gpu=50.0, temperature_c=60.0, power_draw_w=200.0)


@pytest.fixture
def mig_lab(client, make_user, make_host, browser_for):
    """Host ``mig-01``: GPU 0 (H100, MIG mode) with slices GI 2 and GI 3; alice holds GI 3 for
    the next hour. Returns alice's and bob's actors and signed-in browsers."""
    alice = make_user("alice", password=PASSWORD)
    bob = make_user("bob", password=PASSWORD)
    host = make_host("mig-01")
    devs = [gpu(WHOLE, 0, "NVIDIA H100 80GB HBM3", mig_mode=True, **TELEMETRY)] + [
        {"uuid": uuid, "index": 0, "parent_uuid": WHOLE, "gpu_instance_id": gi, "compute_instance_id": 0,
         "mig_profile": profile, "memory_total_mib": 40192, **TELEMETRY}
        for uuid, gi, profile in [(GI2, 2, "3g.40gb"), (GI3, 3, "3g.40gb")]
    ]
    r = client.post("/api/v1/agent/snapshots", json=snapshot_body("mig-01", 1, devs), headers=host.headers)
    assert r.status_code == 200, r.text
    r = book(client, alice, [GI3], "now", host="mig-01")
    assert r.status_code == 201, r.text
    return {"alice": alice, "bob": bob, "bob_browser": browser_for("bob"), "reservation": r.json()["id"]}


def test_api_devices_whole_gpu_with_a_booked_slice_is_held_by_the_slice_holder(client, mig_lab):
    devices = {d["uuid"]: d for d in client.get("/api/v1/devices", headers=mig_lab["bob"].headers).json()}
    assert devices[WHOLE]["holder"]["user"] == "alice" and devices[WHOLE]["status"] == "reserved-idle"
    assert devices[GI3]["holder"]["user"] == "alice"
    assert devices[GI2]["holder"] is None and devices[GI2]["status"] == "free"  # siblings never hold each other
    assert [devices[u]["label"] for u in (WHOLE, GI2, GI3)] == ["GPU 0", "GPU 0 · MIG 2", "GPU 0 · MIG 3"]


def test_metrics_whole_gpu_with_a_booked_slice_has_the_slice_holder(client, mig_lab):
    r = client.get("/metrics")
    assert r.status_code == 200
    holders = {s.labels["uuid"]: s.labels["holder"]
               for fam in text_string_to_metric_families(r.text) if fam.name == "gpuroster_device_utilization_percent"
               for s in fam.samples}
    assert holders == {WHOLE: "alice", GI3: "alice", GI2: ""}


def test_now_page_whole_gpu_with_a_booked_slice_shows_the_holder(mig_lab):
    html = mig_lab["bob_browser"].get("/").text
    blocks = {u: next(p.split("</article>", 1)[0] for p in html.split('<article class="dev')[1:] if u in p)
              for u in (WHOLE, GI2, GI3)}
    assert "alice" in blocks[WHOLE] and 'data-status="reserved-idle"' in blocks[WHOLE]
    assert "alice" in blocks[GI3] and "alice" not in blocks[GI2]
    assert ">GPU 0 · MIG 3<" in blocks[GI3]


def test_timeline_whole_gpu_row_names_the_slice_of_each_booking(mig_lab):
    html = mig_lab["bob_browser"].get("/timeline").text
    rows = {m.group(1): m.group(0) for m in re.finditer(r'title="UUID ([^"]+)">.*?</div>\s*</div>', html, re.S)}
    assert "alice · MIG 3" in rows[WHOLE]
    assert "alice<" in rows[GI3] or "alice " in rows[GI3]
    assert "alice" not in rows[GI2]
    assert ">GPU 0 · MIG 3<" in rows[GI3]


def test_timeline_stacks_two_slices_booked_at_the_same_time_on_the_whole_gpu_row(client, mig_lab):
    assert book(client, mig_lab["bob"], [GI2], "now", host="mig-01").status_code == 201
    html = mig_lab["bob_browser"].get("/timeline").text
    row = next(m.group(0) for m in re.finditer(r'title="UUID ([^"]+)">.*?</div>\s*</div>', html, re.S)
               if m.group(1) == WHOLE)
    assert "bob · MIG 2" in row and "alice · MIG 3" in row
    tops = re.findall(r'class="tl-bar[^"]*" style="[^"]*top: ([0-9.]+)rem', row)
    assert len(tops) == 2 and len(set(tops)) == 2, "two bookings at once must not be drawn on top of each other"


def test_cli_status_whole_gpu_with_a_booked_slice_shows_the_holder(client, mig_lab, monkeypatch, tmp_path):
    """``gpuroster status`` run in-process against the app (the TestClient's transport)."""
    from app.cli import cli

    # the CLI imports its client class when a command first calls the service (--help needs no httpx)
    monkeypatch.setattr(client_api, "Api", lambda server, token: Api(server, token, transport=client._transport))
    env = {"GPUROSTER_SERVER": "http://testserver", "GPUROSTER_TOKEN": mig_lab["bob"].token,
           "XDG_CONFIG_HOME": str(tmp_path)}
    result = CliRunner().invoke(cli, ["status"], env=env)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("mig-01")]
    whole = next(line for line in rows if line.split()[1] == "0" and "MIG" not in line)
    gi3 = next(line for line in rows if "0 · MIG 3" in line)
    gi2 = next(line for line in rows if "0 · MIG 2" in line)
    assert "alice" in whole and "alice" in gi3 and "alice" not in gi2


def _holding(start_h: float, hours: float, *, via: bool, rid: int) -> Holding:
    class R:
        pass

    r = R()
    base = datetime(2026, 1, 5, 9, tzinfo=UTC)
    r.id, r.start_at, r.end_at = rid, base + timedelta(hours=start_h), base + timedelta(hours=start_h + hours)
    return Holding(device_id=1, reservation=r, via=object() if via else None)  # type: ignore[arg-type]


def test_holder_at_prefers_a_reservation_of_the_device_itself_then_the_earliest_start():
    at = datetime(2026, 1, 5, 10, tzinfo=UTC)
    via_early, own_late = _holding(0, 3, via=True, rid=1), _holding(0.5, 3, via=False, rid=2)
    assert holder_at([via_early, own_late], at) is own_late
    a, b = _holding(0, 3, via=True, rid=3), _holding(0.5, 3, via=True, rid=4)
    assert holder_at([b, a], at) is a
    assert holder_at([_holding(2, 1, via=False, rid=5)], at) is None  # starts later: not held now
    assert holder_at([_holding(0, 1, via=False, rid=6)], at) is None  # [start, end): ended at 10:00


@pytest.mark.parametrize("ref", ["GPU 0 · MIG 2", "0/2"])
def test_a_slice_is_booked_by_its_uuid_and_its_name_gets_a_hint_naming_it(client, mig_lab, ref):
    r = book(client, mig_lab["bob"], [ref], "now", host="mig-01")
    assert r.status_code == 422 and r.json()["field"] == "devices"
    assert f"book a MIG slice by its UUID: {GI2}" in r.json()["detail"]
    assert book(client, mig_lab["bob"], [GI2], "now", host="mig-01").status_code == 201


def test_my_reservations_and_the_reservation_page_name_the_slice_like_every_other_page(mig_lab, browser_for):
    alice = browser_for("alice")
    listing = alice.get("/me/reservations").text
    assert "GPU 0 · MIG 3" in listing
    page = alice.get(f"/me/reservations/{mig_lab['reservation']}").text
    assert "GPU 0 · MIG 3" in page and "MIG 3g.40gb" not in page
