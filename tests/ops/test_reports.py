"""The booked-versus-used report: reserved = used + idle + unmonitored, minute by minute,
from the per-minute rollups ingest writes; bad input is a 4xx naming the field; pruning
keeps the retention window and runs once per hour across processes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from app.db import run_in_transaction
from app.models import AuditLog, Device, Group, GroupMember, Host, Reservation, ReservationDevice, ReservationShare, UsageRollup, User
from tests.conftest import gpu, snapshot_body

H = 3600.0


def add_reservation(factory, *, user: str, host: str, uuids: list[str], start: datetime, end: datetime,
                    status: str = "confirmed", share_with: tuple[str, ...] = ()) -> int:
    """A reservation written directly (the API refuses past starts, reports are about the past)."""

    def work(s):
        u = s.scalar(select(User).where(User.username == user))
        h = s.scalar(select(Host).where(Host.name == host))
        devs = [s.scalar(select(Device).where(Device.uuid == x)) for x in uuids]
        r = Reservation(user_id=u.id, host_id=h.id, start_at=start, end_at=end, status=status, created_at=start,
                        updated_at=start)
        r.items = [ReservationDevice(device_id=d.id, physical_id=d.physical_id, slice_kind=1 if d.parent_id else 0,
                                     start_at=start, end_at=end, active=status != "cancelled") for d in devs]
        r.shares = [ReservationShare(user_id=s.scalar(select(User.id).where(User.username == n))) for n in share_with]
        s.add(r)
        s.flush()
        return r.id

    return run_in_transaction(factory, work)


def proc(uuid: str, user: str, pid: int, uid: int = 1001) -> dict:
    return {"device_uuid": uuid, "pid": pid, "unix_user": user, "uid": uid, "used_memory_mib": 1000.0}


@pytest.fixture
def period(lab, client):
    """T: a minute two hours ago. Returns (T, from, to) for a one-hour period starting at T."""
    t = (datetime.now(UTC) - timedelta(hours=2)).replace(second=0, microsecond=0)
    return t, t.isoformat(), (t + timedelta(hours=1)).isoformat()


def post_minutes(client, lab, t0: datetime, minutes: dict[int, tuple[dict[str, float | None], list[dict]]],
                 first_seq: int = 100, findings: list[dict] | None = None) -> None:
    """One snapshot per listed minute k at ``t0 + k min + 10 s``: per-device utilization and processes."""
    for n, (k, (util, procs)) in enumerate(sorted(minutes.items())):
        devices = [gpu(u, i, utilization_gpu=util.get(u), memory_used_mib=100.0) for i, u in enumerate(lab.devices)]
        body = snapshot_body("node-01", first_seq + n, devices, procs,
                             collected_at=t0 + timedelta(minutes=k, seconds=10), findings=(findings or []) if n == 0 else [])
        r = client.post("/api/v1/agent/snapshots", headers=lab.host.headers, json=body)
        assert r.status_code == 200, r.text


def test_reserved_splits_into_used_idle_and_unmonitored(client, lab, session_factory, period):
    t, lo, hi = period
    d0 = lab.devices[0]
    rid = add_reservation(session_factory, user="alice", host="node-01", uuids=[d0], start=t, end=t + timedelta(minutes=10))
    minutes = {}
    for k in range(6):  # alice computes
        minutes[k] = ({d0: 80.0}, [proc(d0, "alice", 10)])
    for k in (6, 7):  # alice's process holds memory, the GPU idles
        minutes[k] = ({d0: 0.0}, [proc(d0, "alice", 10)])
    minutes[8] = ({d0: 90.0}, [proc(d0, "bob", 20, uid=1002)])  # someone else computes on alice's GPU
    # minute 9: no snapshot at all (agent down)
    post_minutes(client, lab, t, minutes)

    r = client.get("/api/v1/reports/usage", params={"user": "alice", "from": lo, "to": hi}, headers=lab.alice.headers)
    assert r.status_code == 200, r.text
    rep = r.json()
    tot = rep["totals"]
    assert tot["reserved_gpu_hours"] == pytest.approx(10 * 60 / H, abs=1e-4)
    assert tot["used_gpu_hours"] == pytest.approx(6 * 60 / H, abs=1e-4)
    assert tot["idle_gpu_hours"] == pytest.approx(3 * 60 / H, abs=1e-4)
    assert tot["unmonitored_gpu_hours"] == pytest.approx(1 * 60 / H, abs=1e-4)
    assert tot["used_fraction"] == pytest.approx(6 / 9, abs=1e-3)
    assert [x["id"] for x in rep["reservations"]] == [rid]
    assert rep["scope"] == "user" and rep["name"] == "alice" and rep["threshold_pct"] == 5.0

    r0 = client.get("/api/v1/reports/usage", params={"user": "alice", "from": lo, "to": hi, "threshold": 0},
                    headers=lab.alice.headers).json()
    assert r0["totals"]["used_gpu_hours"] == pytest.approx(8 * 60 / H, abs=1e-4), "threshold 0: presence is enough"


def test_partial_minutes_and_shares_and_cancelled(client, lab, session_factory, period):
    t, lo, hi = period
    d0, d1, d2, _ = lab.devices
    # alice: d1 from T+30 s for 2 minutes, computing throughout (3 rollup minutes, weights 30/60/30 s)
    add_reservation(session_factory, user="alice", host="node-01", uuids=[d1],
                    start=t + timedelta(seconds=30), end=t + timedelta(minutes=2, seconds=30))
    # bob: d2 for 5 minutes, shared with alice, who is the one computing there
    add_reservation(session_factory, user="bob", host="node-01", uuids=[d2], start=t, end=t + timedelta(minutes=5),
                    share_with=("alice",))
    # bob: a cancelled reservation counts for nothing
    add_reservation(session_factory, user="bob", host="node-01", uuids=[d0], start=t, end=t + timedelta(minutes=30),
                    status="cancelled")
    minutes = {k: ({d1: 50.0, d2: 60.0}, [proc(d1, "alice", 10), proc(d2, "alice", 11)]) for k in range(5)}
    post_minutes(client, lab, t, minutes)

    alice = client.get("/api/v1/reports/usage", params={"user": "alice", "from": lo, "to": hi}, headers=lab.alice.headers).json()
    assert alice["totals"]["reserved_gpu_hours"] == pytest.approx(120 / H, abs=1e-4)
    assert alice["totals"]["used_gpu_hours"] == pytest.approx(120 / H, abs=1e-4)
    bob = client.get("/api/v1/reports/usage", params={"user": "bob", "from": lo, "to": hi}, headers=lab.alice.headers).json()
    assert bob["totals"]["reservations"] == 1
    assert bob["totals"]["used_gpu_hours"] == pytest.approx(300 / H, abs=1e-4), "a share's user computing counts as used"


def test_period_clips_reservations_and_future_is_not_counted(client, lab, session_factory, period):
    t, _lo, _hi = period
    d3 = lab.devices[3]
    add_reservation(session_factory, user="alice", host="node-01", uuids=[d3], start=t - timedelta(hours=1),
                    end=datetime.now(UTC) + timedelta(hours=5))
    lo = t.isoformat()
    hi = (t + timedelta(days=1)).isoformat()
    rep = client.get("/api/v1/reports/usage", params={"user": "alice", "from": lo, "to": hi}, headers=lab.alice.headers).json()
    until = datetime.fromisoformat(rep["until"])
    assert until <= datetime.now(UTC)
    expected = (until - t).total_seconds() / H
    assert rep["totals"]["reserved_gpu_hours"] == pytest.approx(expected, abs=2e-3)
    assert rep["totals"]["unmonitored_gpu_hours"] == pytest.approx(expected, abs=0.02), "no rollups in the past window"


def test_group_report_sums_members_and_counts_findings(client, lab, session_factory, period):
    t, lo, hi = period
    d0, d1, _, _ = lab.devices

    def group(s):
        g = Group(name="ml")
        s.add(g)
        s.flush()
        for name in ("alice", "bob"):
            s.add(GroupMember(group_id=g.id, user_id=s.scalar(select(User.id).where(User.username == name))))

    run_in_transaction(session_factory, group)
    add_reservation(session_factory, user="alice", host="node-01", uuids=[d0], start=t, end=t + timedelta(minutes=4))
    add_reservation(session_factory, user="bob", host="node-01", uuids=[d1], start=t, end=t + timedelta(minutes=2))
    seen = (t + timedelta(minutes=1)).isoformat()
    finding = {"key": f"{d1}:30:-:unreserved", "kind": "unreserved", "device_uuid": d1, "pid": 30, "unix_user": "alice",
               "uid": 1001, "first_seen": seen, "last_seen": seen}
    minutes = {k: ({d0: 70.0, d1: 70.0}, [proc(d0, "alice", 10), proc(d1, "bob", 20, uid=1002)]) for k in range(4)}
    post_minutes(client, lab, t, minutes, findings=[finding])

    rep = client.get("/api/v1/reports/usage", params={"group": "ml", "from": lo, "to": hi}, headers=lab.bob.headers).json()
    assert rep["scope"] == "group" and [u["user"] for u in rep["users"]] == ["alice", "bob"]
    users = {u["user"]: u for u in rep["users"]}
    assert users["alice"]["used_gpu_hours"] == pytest.approx(240 / H, abs=1e-4)
    assert users["bob"]["used_gpu_hours"] == pytest.approx(120 / H, abs=1e-4)
    assert rep["totals"]["used_gpu_hours"] == pytest.approx(360 / H, abs=1e-4)
    assert users["alice"]["findings"] == {"unreserved": 1} and users["bob"]["findings"] == {}
    assert rep["totals"]["findings"] == {"unreserved": 1} and rep["totals"]["reservations"] == 2


def test_whole_gpu_reservation_counts_processes_on_its_mig_instances(client, lab, make_host, session_factory, period):
    t, lo, hi = period
    host = make_host("mig-01")
    parent = "GPU-5555aaaa-0000-0000-0000-000000000005"
    child = f"MIG-{parent}/1/0"
    devices = [gpu(parent, 0, mig_mode=True, utilization_gpu=None),
               {"uuid": child, "index": 0, "parent_uuid": parent, "mig_profile": "3g.40gb", "gpu_instance_id": 1,
                "compute_instance_id": 0, "mig_mode": True}]
    # register the devices first, then reserve the whole GPU, then report three minutes
    assert client.post("/api/v1/agent/snapshots", headers=host.headers,
                       json=snapshot_body("mig-01", 1, devices)).status_code == 200
    add_reservation(session_factory, user="alice", host="mig-01", uuids=[parent], start=t, end=t + timedelta(minutes=3))
    for k in range(3):
        body = snapshot_body("mig-01", 10 + k, devices, [proc(child, "alice", 10)],
                             collected_at=t + timedelta(minutes=k, seconds=5))
        assert client.post("/api/v1/agent/snapshots", headers=host.headers, json=body).status_code == 200
    rep = client.get("/api/v1/reports/usage", params={"user": "alice", "from": lo, "to": hi}, headers=lab.alice.headers).json()
    assert rep["totals"]["used_gpu_hours"] == pytest.approx(180 / H, abs=1e-4)


def test_default_is_the_caller_and_the_current_month(client, lab):
    rep = client.get("/api/v1/reports/usage", headers=lab.bob.headers).json()
    assert rep["name"] == "bob" and rep["scope"] == "user"
    start = datetime.fromisoformat(rep["start"]).astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert (start.day, start.hour, start.minute) == (1, 0, 0), "the month starts at midnight in the lab zone"
    assert rep["totals"]["reserved_gpu_hours"] == 0 and rep["reservations"] == []


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"user": "alice", "from": "yesterday"}, 422, "from"),
        ({"user": "alice", "from": "2026-13-01"}, 422, "from"),
        ({"user": "alice", "from": "2026-03-01", "to": "2026-02-01"}, 422, "to"),
        ({"user": "alice", "from": "2024-01-01", "to": "2026-01-01"}, 422, "to"),
        ({"user": "alice", "group": "ml"}, 422, "user"),
        ({"user": "nobody"}, 404, "user"),
        ({"group": "nobody"}, 404, "group"),
        ({"user": "alice", "threshold": 150}, 422, "threshold"),
    ],
)
def test_bad_input_is_4xx_naming_the_field(client, lab, params, status, field):
    r = client.get("/api/v1/reports/usage", params=params, headers=lab.alice.headers)
    assert r.status_code == status, r.text
    doc = r.json()
    named = doc.get("field") or ",".join(e["field"] for e in doc.get("errors", []))
    assert field in named, doc


def test_report_needs_sign_in(client, lab):
    assert client.get("/api/v1/reports/usage").status_code == 401


def test_report_page_renders_for_a_signed_in_member(client, lab, session_factory, period, settings, make_user):
    from app.web import sessions as web_sessions

    t, lo, hi = period
    make_user("erin", password="correct horse battery")
    add_reservation(session_factory, user="alice", host="node-01", uuids=[lab.devices[0]], start=t,
                    end=t + timedelta(minutes=10))
    signed = run_in_transaction(session_factory, lambda s: web_sessions.sign_in(
        s, username="erin", password="correct horse battery", address="127.0.0.1", settings=settings,
        now=datetime.now(UTC)))
    client.cookies.set(web_sessions.SESSION_COOKIE, signed.cookie_value)
    try:
        r = client.get("/reports/usage", params={"user": "alice", "from": lo, "to": hi})
        assert r.status_code == 200, r.text
        assert "text/html" in r.headers["content-type"]
        assert "Booked versus used: user alice" in r.text
        assert 'data-k="reserved">0.17 h' in r.text  # 10 minutes
        assert 'data-k="unmonitored">0.17 h' in r.text
        bad = client.get("/reports/usage", params={"user": "alice", "from": "nonsense"})
        assert bad.status_code == 422
    finally:
        client.cookies.clear()


# ---------------------------------------------------------------------------- retention


def test_prune_keeps_the_window_and_runs_once_per_hour(client, lab, session_factory, settings):
    from app.services import reports as report_service

    now = datetime.now(UTC)
    dev_id = run_in_transaction(session_factory, lambda s: s.scalar(select(Device.id).limit(1)))
    old = (now - timedelta(days=settings.rollup_retention_days, minutes=5)).replace(second=0, microsecond=0)
    recent = (now - timedelta(days=1)).replace(second=0, microsecond=0)

    def seed(s, which=(old, recent)):
        for m in which:
            s.add(UsageRollup(device_id=dev_id, minute=m, samples=1, utilization_sum=1.0, utilization_samples=1,
                              memory_used_sum_mib=1.0, memory_samples=1, users=[]))

    run_in_transaction(session_factory, seed)

    def minutes():
        with session_factory() as s:
            return sorted(s.scalars(select(UsageRollup.minute).where(UsageRollup.device_id == dev_id)))

    assert run_in_transaction(session_factory, lambda s: report_service.prune_history(s, settings=settings, now=now))
    assert old not in minutes() and recent in minutes()
    # within the hour, another process (or this one) does nothing
    run_in_transaction(session_factory, lambda s: seed(s, (old,)))
    assert not run_in_transaction(session_factory, lambda s: report_service.prune_history(s, settings=settings, now=now))
    assert old in minutes()
    later = now + report_service.PRUNE_EVERY + timedelta(seconds=1)
    assert run_in_transaction(session_factory, lambda s: report_service.prune_history(s, settings=settings, now=later))
    assert old not in minutes()
    with session_factory() as s:
        assert s.scalar(select(func.count()).select_from(AuditLog).where(AuditLog.action == "history.prune")) == 2


@pytest.mark.commits  # an app of its own whose pruner runs in the background
def test_lifespan_pruner_prunes_after_its_first_delay(settings):
    from fastapi.testclient import TestClient

    from app.api import reports as reports_api
    from app.main import create_app
    from app.periodic import repeat

    app = create_app(settings)
    with TestClient(app):
        loop = repeat(app, what="pruning", work=reports_api.prune_once, period=3600.0)

        async def one_round():
            task = asyncio.create_task(loop)
            for _ in range(200):
                await asyncio.sleep(0.05)
                with app.state.session_factory() as s:
                    if s.scalar(select(AuditLog.id).where(AuditLog.action == "history.prune")) is not None:
                        break
            task.cancel()

        asyncio.run(one_round())
        with app.state.session_factory() as s:
            assert s.scalar(select(func.count()).select_from(AuditLog).where(AuditLog.action == "history.prune")) == 1
