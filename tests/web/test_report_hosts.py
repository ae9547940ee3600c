"""The booked-versus-used report counts quarantined time: the reserved GPU-hours that fell in
a quarantine of the device (per reservation, user, group and host) and every host's
quarantined device-hours, clipped to the period and to now; the per-host breakdown with
no-shows and consent releases; on the page, as JSON and as CSV per reservation, user and
host (both databases)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from app.db import run_in_transaction
from app.models import Device, DeviceQuarantine, Host, Reservation, ReservationDevice, User
from tests.conftest import gpu, snapshot_body

NODE2 = ["GPU-5555bbbb-0000-0000-0000-000000000005", "GPU-6666bbbb-0000-0000-0000-000000000006"]


def _reservation(factory, *, user, host, uuid, start, end, status="confirmed", auto_release=None) -> int:
    """Written directly: the API refuses starts in the past, and reports are about the past."""

    def work(s):
        d = s.scalar(select(Device).where(Device.uuid == uuid))
        r = Reservation(user_id=s.scalar(select(User.id).where(User.username == user)),
                        host_id=s.scalar(select(Host.id).where(Host.name == host)), start_at=start, end_at=end,
                        status=status, created_at=start, updated_at=start, auto_release=auto_release)
        r.items = [ReservationDevice(device_id=d.id, physical_id=d.physical_id, slice_kind=0, start_at=start,
                                     end_at=end, active=True)]
        s.add(r)
        s.flush()
        return r.id

    return run_in_transaction(factory, work)


def _quarantine(factory, uuid, start, cleared=None) -> None:
    def work(s):
        d = s.scalar(select(Device).where(Device.uuid == uuid))
        s.add(DeviceQuarantine(device_id=d.id, host_id=d.host_id, reason="XID 79 error", conditions=[],
                               started_at=start, cleared_at=cleared, cleared_by="user:boss" if cleared else None))

    run_in_transaction(factory, work)


@pytest.fixture
def scene(weblab, client, make_host, session_factory):
    """Period [T, T+10h), T twelve hours ago. node-01: alice holds GPU0 T+1h..T+5h, quarantined
    T+3h..T+4h; GPU1 (unbooked) quarantined T-2h..T+2h; GPU2 quarantined before the period
    only. node-02: bob holds GPU5 T+7h..T+9h, quarantined from T+8h and still open; alice's
    no-show on GPU6 T+1h..T+2h. Group ``vision``: alice and bob."""
    t = (datetime.now(UTC) - timedelta(hours=12)).replace(second=0, microsecond=0)
    h = timedelta(hours=1)
    host2 = make_host("node-02")
    r = client.post("/api/v1/agent/snapshots", headers=host2.headers,
                    json=snapshot_body("node-02", 1, [gpu(u, i) for i, u in enumerate(NODE2)]))
    assert r.status_code == 200, r.text
    a0, a1, a2 = weblab.devices[:3]
    ids = {
        "alice": _reservation(session_factory, user="alice", host="node-01", uuid=a0, start=t + h, end=t + 5 * h),
        "bob": _reservation(session_factory, user="bob", host="node-02", uuid=NODE2[0], start=t + 7 * h, end=t + 9 * h),
        "no_show": _reservation(session_factory, user="alice", host="node-02", uuid=NODE2[1], start=t + h,
                                end=t + 2 * h, status="released", auto_release="no_show"),
    }
    _quarantine(session_factory, a0, t + 3 * h, t + 4 * h)
    _quarantine(session_factory, a1, t - 2 * h, t + 2 * h)
    _quarantine(session_factory, a2, t - 5 * h, t - 4 * h)
    _quarantine(session_factory, NODE2[0], t + 8 * h)
    r = weblab.admin.client.post("/api/v1/groups", json={"name": "vision", "members": ["alice", "bob"]},
                                 headers={"X-CSRF-Token": weblab.admin.csrf})
    assert r.status_code == 201, r.text
    return t, ids, {"from": t.isoformat(), "to": (t + 10 * h).isoformat()}


def test_quarantined_hours_per_reservation_user_group_and_host(weblab, scene):
    t, ids, period = scene
    rep = weblab.alice.get("/api/v1/reports/usage", params={"group": "vision", **period}).json()
    assert rep["totals"]["quarantined_gpu_hours"] == 2.0
    assert {u["user"]: u["quarantined_gpu_hours"] for u in rep["users"]} == {"alice": 1.0, "bob": 1.0}
    assert {r["id"]: r["quarantined_gpu_hours"] for r in rep["reservations"]} == {ids["alice"]: 1.0, ids["bob"]: 1.0,
                                                                                 ids["no_show"]: 0.0}
    hosts = {row["host"]: row for row in rep["hosts"]}
    # node-01: GPU0's hour and the two hours of GPU1's quarantine inside the period; GPU2's is before it
    assert (hosts["node-01"]["reservations"], hosts["node-01"]["reserved_gpu_hours"],
            hosts["node-01"]["quarantined_gpu_hours"], hosts["node-01"]["quarantined_device_hours"],
            hosts["node-01"]["quarantines"]) == (1, 4.0, 1.0, 3.0, 2)
    # node-02: the open quarantine runs to the end of the period; the no-show counts on its host
    assert (hosts["node-02"]["reservations"], hosts["node-02"]["reserved_gpu_hours"], hosts["node-02"]["no_shows"],
            hosts["node-02"]["quarantined_gpu_hours"], hosts["node-02"]["quarantined_device_hours"],
            hosts["node-02"]["quarantines"]) == (2, 3.0, 1, 1.0, 2.0, 1)
    assert rep["quarantined_device_hours"] == 5.0 and rep["totals"]["no_shows"] == 1
    # the per-host figures add up to the totals
    for k in ("reserved_gpu_hours", "quarantined_gpu_hours", "no_shows", "consent_releases"):
        assert sum(row[k] for row in rep["hosts"]) == pytest.approx(rep["totals"][k])


def test_a_users_report_lists_every_quarantined_host_and_open_quarantines_stop_at_now(weblab, scene):
    t, ids, period = scene
    rep = weblab.bob.get("/api/v1/reports/usage", params={"user": "alice", **period}).json()
    hosts = {row["host"]: row for row in rep["hosts"]}
    assert (hosts["node-01"]["quarantined_gpu_hours"], hosts["node-02"]["quarantined_gpu_hours"]) == (1.0, 0.0)
    assert hosts["node-02"]["quarantined_device_hours"] == 2.0 and hosts["node-02"]["reservations"] == 1
    # a period reaching past now: the open quarantine counts up to now (about 4 h), never the future
    later = weblab.bob.get("/api/v1/reports/usage", params={"user": "bob", "from": period["from"],
                                                             "to": (t + timedelta(hours=16)).isoformat()}).json()
    node2 = next(row for row in later["hosts"] if row["host"] == "node-02")
    assert node2["quarantined_device_hours"] == pytest.approx(4.0, abs=0.05)
    # a period before every quarantine: no host row, nothing quarantined
    before = weblab.bob.get("/api/v1/reports/usage", params={"user": "bob", "from": (t - timedelta(days=3)).isoformat(),
                                                              "to": (t - timedelta(days=2)).isoformat()}).json()
    assert before["hosts"] == [] and before["quarantined_device_hours"] == 0.0


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_csv_per_reservation_user_and_host(weblab, scene):
    t, ids, period = scene
    base = {"group": "vision", **period}
    by_res = weblab.alice.get("/api/v1/reports/usage.csv", params=base)
    assert by_res.status_code == 200 and "by-reservation" in by_res.headers["content-disposition"]
    assert {int(r["reservation"]): float(r["quarantined_gpu_hours"]) for r in _rows(by_res.text)}[ids["bob"]] == 1.0
    users = _rows(weblab.alice.get("/api/v1/reports/usage.csv", params={**base, "by": "user"}).text)
    assert [(r["row"], r["user"], float(r["quarantined_gpu_hours"]), int(r["no_shows"])) for r in users] == [
        ("member", "alice", 1.0, 1), ("member", "bob", 1.0, 0), ("total", "vision", 2.0, 1)]
    hosts = _rows(weblab.alice.get("/api/v1/reports/usage.csv", params={**base, "by": "host"}).text)
    assert [(r["host"], float(r["quarantined_device_hours"]), int(r["quarantines"])) for r in hosts] == [
        ("node-01", 3.0, 2), ("node-02", 2.0, 1)]
    bad = weblab.alice.get("/api/v1/reports/usage.csv", params={**base, "by": "device"})
    assert bad.status_code == 422 and "by" in bad.text


def test_usage_page_shows_the_per_host_table_and_quarantine_totals(weblab, scene):
    t, ids, period = scene
    page = weblab.alice.get("/reports/usage", params={"group": "vision", **period})
    assert page.status_code == 200
    html = page.text
    node2 = html.split('data-host="node-02"', 1)[1].split("</tr>", 1)[0]
    assert "2.00 h (1 quarantine)" in node2
    assert 'data-k="quarantined_device_hours">5.00 h' in html and 'data-k="quarantined">2.00 h' in html
    assert "by=host" in html and "by=user" in html and "<script" not in html.split('id="per-host"', 1)[1]


def test_overlapping_quarantines_of_a_mig_instance_and_its_gpu_count_once():
    from app.services.report_hosts import overlap_seconds

    t = datetime(2026, 11, 2, 8, tzinfo=UTC)
    h = timedelta(hours=1)
    own, gpus = (t + h, t + 3 * h), (t + 2 * h, t + 5 * h)  # the instance's own quarantine and its GPU's
    assert overlap_seconds([own, gpus], t, t + 4 * h) == 3 * 3600  # 09:00-12:00, clipped at 12:00
    assert overlap_seconds([gpus, own], t + 6 * h, t + 7 * h) == 0
    assert overlap_seconds([], t, t + h) == 0 and overlap_seconds([own], t + 2 * h, t + 2 * h) == 0
