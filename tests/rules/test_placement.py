"""Placement: property tests (hypothesis, bounded) through the services on both databases,
the preferences (idle now, B16; link groups; tightest fit), and the API (count, asap,
availability)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
from sqlalchemy import select

from app.config import Settings
from app.db import build_engine, build_session_factory, lock_for_write, transaction
from app.errors import InvalidInput
from app.models import Device, DeviceTelemetry, Host, Reservation, ReservationDevice, User
from app.schemas.reservation import PlacementConstraints, ReservationCreate
from app.services import placement
from app.services import reservations as reservation_service
from app.services.intervals import Interval
from tests.conftest import FRESH_FOR, future, gpu, snapshot_body

pytestmark = pytest.mark.commits  # seeds through a session factory of its own engine

BASE = datetime(2031, 1, 6, 8, 0, tzinfo=UTC)
STEP = timedelta(minutes=30)
MODELS = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB"]
MEMORY = [16384.0, 40960.0, 81920.0]

_FACTORIES: dict[str, object] = {}


def _factory(db_url: str):
    if db_url not in _FACTORIES:
        _FACTORIES[db_url] = build_session_factory(build_engine(Settings(database_url=db_url)))
    return _FACTORIES[db_url]


@dataclass
class Dev:
    host: int
    model: int
    memory: int
    group: str | None
    state: str  # ok | busy | lost | retired | open
    busy: list[tuple[int, int]]  # (start step, length in steps)


def _devices():
    busy = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), max_size=3)
    dev = st.builds(Dev, host=st.integers(0, 1), model=st.integers(0, 2), memory=st.integers(0, 2),
                    group=st.sampled_from([None, "nv0", "nv1"]),
                    state=st.sampled_from(["ok", "ok", "ok", "busy", "lost", "retired", "open"]), busy=busy)
    return st.lists(dev, min_size=1, max_size=7)


def _store(s, devs: list[Dev]) -> tuple[User, list[Device], list[Host]]:
    user = User(username="prop", unix_name="prop")
    hosts = [Host(name=f"prop-{i}", token_hash=f"{i:064d}", exempt_users=[]) for i in range(2)]
    s.add_all([user, *hosts])
    s.flush()
    rows = []
    for i, d in enumerate(devs):
        row = Device(uuid=f"GPU-prop-{i:04d}", host_id=hosts[d.host].id, index=i, name=MODELS[d.model],
                     memory_total_mib=MEMORY[d.memory], link_group=d.group, is_open=d.state == "open",
                     retired_at=BASE if d.state == "retired" else None)
        s.add(row)
        rows.append(row)
    s.flush()
    for d, row in zip(devs, rows):
        s.add(DeviceTelemetry(device_id=row.id, collected_at=BASE, memory_used_mib=30000.0 if d.state == "busy" else 2.0,
                              health="lost" if d.state == "lost" else "ok"))
        taken: list[tuple[int, int]] = []
        for start, length in d.busy:
            if any(start < e and start + length > s_ for s_, e in taken):
                continue  # keep the generated bookings of one device disjoint, as the database would
            taken.append((start, start + length))
            t0, t1 = BASE + start * STEP, BASE + (start + length) * STEP
            r = Reservation(user_id=user.id, host_id=row.host_id, start_at=t0, end_at=t1, status="confirmed")
            r.items = [ReservationDevice(device_id=row.id, physical_id=row.id, slice_kind=0, start_at=t0, end_at=t1)]
            s.add(r)
        d.busy = [(a, b - a) for a, b in taken]
    s.flush()
    return user, rows, hosts


def _matches(d: Dev, model: str | None, min_mem: float | None, host: int | None) -> bool:
    return (d.state in ("ok", "busy") and (model is None or model.lower() in MODELS[d.model].lower())
            and (min_mem is None or MEMORY[d.memory] >= min_mem) and (host is None or d.host == host))


def _free(d: Dev, t: int, length: int) -> bool:
    return all(not (t < s + n and t + length > s) for s, n in d.busy)


@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(devs=_devices(), count=st.integers(1, 3), start=st.integers(0, 30), length=st.integers(1, 10),
       model=st.sampled_from([None, "a100", "H100"]), min_mem=st.sampled_from([None, 40000.0]),
       host=st.sampled_from([None, 0, 1]))
def test_placement_properties(db_url, devs, count, start, length, model, min_mem, host):
    """The chosen devices are free for the whole window, satisfy every constraint, and no
    earlier window (on the 30-minute grid every booking uses) could take the request."""
    factory = _factory(db_url)
    with factory() as s:
        lock_for_write(s)
        try:
            user, rows, hosts = _store(s, devs)
            data = ReservationCreate(count=count, host=hosts[host].name if host is not None else None,
                                     constraints=PlacementConstraints(model=model, min_memory_mib=min_mem),
                                     start=(BASE + start * STEP).isoformat(), duration=length * STEP)
            feasible_hosts = {h for h in (0, 1) if sum(_matches(d, model, min_mem, host) and d.host == h for d in devs) >= count}
            try:
                got_host, got, interval = placement.place(
                    s, data=data, owner=user, interval=Interval(BASE + start * STEP, BASE + (start + length) * STEP), now=BASE)
            except InvalidInput as e:
                assert e.field == "count" and not feasible_hosts
                return
            assert feasible_hosts
            # the request's shape
            assert len(got) == count == len({d.id for d in got})
            assert interval.end - interval.start == length * STEP and interval.start >= BASE + start * STEP
            # every constraint
            idx = {row.id: i for i, row in enumerate(rows)}
            for d in got:
                spec = devs[idx[d.id]]
                assert d.host_id == got_host.id and _matches(spec, model, min_mem, host), spec
            # free for the whole window, by the service's own conflict query too
            assert reservation_service.find_conflicts(s, devices=got, start=interval.start, end=interval.end) == []
            t_got = int((interval.start - BASE) / STEP)
            assert all(_free(devs[idx[d.id]], t_got, length) for d in got)
            # no earlier start on the grid fits anywhere
            for t in range(start, t_got):
                for h in feasible_hosts:
                    fit = [d for d in devs if d.host == h and _matches(d, model, min_mem, host) and _free(d, t, length)]
                    assert len(fit) < count, (t, h)
        finally:
            s.rollback()


# ---------------------------------------------------------------------------- preferences


def _place(session_factory, who="alice", **body):
    with session_factory() as s:
        lock_for_write(s)
        owner = s.scalar(select(User).where(User.username == who))
        data = ReservationCreate(**{"start": "asap", "duration": "PT2H", **body})
        now = datetime.now(UTC)
        interval = reservation_service.parse_interval(data, now=now)
        host, devices, interval = placement.place(s, data=data, owner=owner, interval=interval, now=now)
        s.rollback()
        return host.name, sorted(d.index for d in devices), interval


def _snapshot(client, lab, seq, devices, processes=()):
    r = client.post("/api/v1/agent/snapshots", headers=lab.host.headers,
                    json=snapshot_body("node-01", seq, devices, list(processes)))
    assert r.status_code == 200, r.text


def test_prefers_devices_idle_now_b16_display_process_and_few_mib_are_idle(client, lab, session_factory):
    devs = [gpu(u, i) for i, u in enumerate(lab.devices)]
    devs[0]["memory_used_mib"] = 91.0  # Xorg only
    devs[1]["memory_used_mib"] = 30000.0  # a training job
    devs[2]["memory_used_mib"] = 2.0
    devs[3]["memory_used_mib"] = 500.0
    procs = [
        {"device_uuid": lab.devices[0], "pid": 1357, "type": "G", "used_memory_mib": 4.0, "unix_user": "root", "uid": 0,
         "name": "Xorg", "create_time": 1.0},
        {"device_uuid": lab.devices[3], "pid": 4242, "type": "C", "used_memory_mib": 400.0, "unix_user": "bob", "uid": 1001,
         "name": "python", "create_time": 2.0},
    ]
    _snapshot(client, lab, 2, devs, procs)
    assert _place(session_factory, count=2, host="node-01")[1] == [0, 2]


def test_a_host_whose_agent_went_quiet_counts_as_unknown_after_idle_and_before_busy_devices(
        client, lab, make_host, session_factory):
    quiet = make_host("aaa-quiet")  # its name and UUIDs sort first: neither decides here
    devs = [gpu(f"GPU-{i}{i}{i}{i}0000-0000-0000-0000-00000000000{i}", i) for i in range(4)]
    assert client.post("/api/v1/agent/snapshots", json=snapshot_body("aaa-quiet", 1, devs),
                       headers=quiet.headers).status_code == 200
    with transaction(session_factory, write=True) as s:  # its agent last reported an hour ago
        h = s.scalar(select(Host).where(Host.name == "aaa-quiet"))
        h.last_seen_at = datetime.now(UTC) - timedelta(hours=1)
    assert client.get("/api/v1/hosts/aaa-quiet", headers=lab.alice.headers).json()["status"] == "stale"

    def place(actor, count):
        r = client.post("/api/v1/reservations", headers=actor.headers,
                        json={"count": count, "start": "asap", "duration": "PT1H"})
        assert r.status_code == 201, r.text
        return r.json()["host"]

    assert place(lab.alice, 1) == "node-01"  # idle, reporting GPUs: chosen over the quiet host's
    # every GPU of node-01 now runs someone's job: a GPU known busy is worse than one unknown
    busy = [gpu(u, i, memory_used_mib=30000.0, utilization_gpu=95.0) for i, u in enumerate(lab.devices)]
    assert client.post("/api/v1/agent/snapshots", headers=lab.host.headers, json=snapshot_body(
        "node-01", 2, busy, interval_seconds=FRESH_FOR)).status_code == 200  # fresh however long this runs
    assert place(lab.bob, 1) == "aaa-quiet"


def test_one_device_known_busy_weighs_more_than_any_number_unknown(client, lab, make_host, session_factory):
    """Two GPUs wanted: node-01 has one idle and one running someone else's job free, the quiet
    host two unknown. Known busy comes last, so the quiet host's pair wins, though node-01's
    name sorts first and one of its GPUs is idle (ranks summed, the two pairs tied)."""
    quiet = make_host("zzz-quiet")  # its name and UUIDs sort last: neither decides for it
    devs = [gpu(f"GPU-ffff{i}{i}{i}{i}-0000-0000-0000-00000000000{i}", i) for i in range(2)]
    assert client.post("/api/v1/agent/snapshots", json=snapshot_body("zzz-quiet", 1, devs),
                       headers=quiet.headers).status_code == 200
    with transaction(session_factory, write=True) as s:
        s.scalar(select(Host).where(Host.name == "zzz-quiet")).last_seen_at = datetime.now(UTC) - timedelta(hours=1)
    busy = [gpu(u, i) for i, u in enumerate(lab.devices)]
    procs = [{"device_uuid": lab.devices[0], "pid": 4242, "type": "C", "used_memory_mib": 30000.0, "unix_user": "bob",
              "uid": 1001, "name": "python", "create_time": 2.0}]
    busy[0].update(memory_used_mib=30000.0, utilization_gpu=99.0)
    assert client.post("/api/v1/agent/snapshots", headers=lab.host.headers, json=snapshot_body(
        "node-01", 2, busy, procs, interval_seconds=FRESH_FOR)).status_code == 200
    taken = client.post("/api/v1/reservations", headers=lab.bob.headers,
                        json={"host": "node-01", "devices": [2, 3], "start": "now", "duration": "PT3H"})
    assert taken.status_code == 201, taken.text
    r = client.post("/api/v1/reservations", headers=lab.alice.headers, json={"count": 2, "start": "asap", "duration": "PT1H"})
    assert r.status_code == 201, r.text
    assert r.json()["host"] == "zzz-quiet"


def test_prefers_devices_of_one_link_group(client, lab, session_factory):
    devs = [gpu(u, i, link_group="nvl-a" if i < 2 else "nvl-b") for i, u in enumerate(lab.devices)]
    _snapshot(client, lab, 2, devs)
    start = future(1)
    with transaction(session_factory, write=True) as s:  # GPU 1 is taken now: 0 alone in its group, 2 and 3 together
        bob = s.scalar(select(User).where(User.username == "bob"))
        reservation_service.create_reservation(
            s, actor=bob, data=ReservationCreate(host="node-01", devices=[1], start="now", duration=timedelta(hours=5)),
            settings=client.app.state.settings)
    assert _place(session_factory, count=2, start=start.isoformat())[1] == [2, 3]


def test_prefers_the_tightest_free_stretch(client, lab, session_factory):
    start = future(3)
    for i, hours in ((0, 2), (1, 8), (2, 3)):  # each GPU is taken `hours` after start
        r = client.post("/api/v1/reservations", headers=lab.bob.headers, json={
            "host": "node-01", "devices": [i], "start": (start + timedelta(hours=hours)).isoformat(), "duration": "PT1H"})
        assert r.status_code == 201
    # 2 hours fit before each; GPU 0's stretch is the shortest, GPU 3 stays free for long jobs
    assert _place(session_factory, count=1, start=start.isoformat())[1] == [0]
    assert _place(session_factory, count=2, start=start.isoformat())[1] == [0, 2]
    name, idx, interval = _place(session_factory, count=1, start=start.isoformat(), duration="PT4H")
    assert idx == [1] and interval.start == start


def test_lost_retired_and_mig_devices_are_never_placed(client, lab, session_factory):
    devs = [gpu(u, i) for i, u in enumerate(lab.devices)]
    devs[1].update(health="lost", error="GPU is lost")
    devs[2]["mig_mode"] = True
    _snapshot(client, lab, 2, devs)
    client.patch(f"/api/v1/devices/{lab.devices[3]}", json={"retired": True}, headers=lab.admin.headers)
    assert _place(session_factory, count=1)[1] == [0]
    with pytest.raises(InvalidInput) as e:
        _place(session_factory, count=2)
    assert e.value.field == "count" and "at most 1" in e.value.detail


def test_api_count_with_constraints_asap_and_a_later_start(client, lab, make_host):
    h = make_host("node-02")
    _ = client.post("/api/v1/agent/snapshots", headers=h.headers, json=snapshot_body("node-02", 1, [
        gpu("GPU-a0000000-0000-0000-0000-000000000000", 0, "NVIDIA H100 80GB HBM3"),
        gpu("GPU-a1000000-0000-0000-0000-000000000000", 1, "NVIDIA H100 80GB HBM3"),
    ]))
    r = client.post("/api/v1/reservations", headers=lab.alice.headers, json={
        "count": 2, "constraints": {"model": "h100", "min_memory_mib": 40000}, "start": "asap", "duration": "PT3H"})
    assert r.status_code == 201, r.text
    first = r.json()
    assert first["host"] == "node-02" and first["state"] == "active"
    # the same again: the earliest start is when the first one ends
    r = client.post("/api/v1/reservations", headers=lab.bob.headers, json={
        "count": 2, "constraints": {"model": "H100"}, "start": "asap", "duration": "PT1H"})
    assert r.status_code == 201 and r.json()["start"] == first["end"]
    r = client.post("/api/v1/reservations", headers=lab.bob.headers, json={
        "count": 5, "start": "asap", "duration": "PT1H"})
    assert r.status_code == 422 and r.json()["field"] == "count"
    r = client.post("/api/v1/reservations", headers=lab.bob.headers, json={
        "count": 1, "constraints": {"same_host": False}, "start": "asap", "duration": "PT1H"})
    assert r.status_code == 422 and r.json()["field"] == "constraints.same_host"
    r = client.post("/api/v1/reservations", headers=lab.bob.headers, json={
        "count": 1, "host": "nope", "start": "asap", "duration": "PT1H"})
    assert r.status_code == 404 and r.json()["field"] == "host"


def test_availability_lists_the_next_free_slots(client, lab):
    start = future(2)
    for i in range(4):
        r = client.post("/api/v1/reservations", headers=lab.bob.headers, json={
            "host": "node-01", "devices": [i], "start": "now", "end": (start + timedelta(hours=i)).isoformat()})
        assert r.status_code == 201
    r = client.get("/api/v1/availability", params={"count": 2, "duration": "90m"}, headers=lab.alice.headers)
    assert r.status_code == 200, r.text
    slots = r.json()["slots"]
    assert r.json()["duration_seconds"] == 5400
    # GPUs 0 and 1 are both free from start + 1 h; the slot stays open after that
    assert datetime.fromisoformat(slots[0]["start"]) == start + timedelta(hours=1)
    assert slots[0]["indices"] == [0, 1] and slots[0]["free_until"] is None and len(slots) == 1
    r = client.get("/api/v1/availability", params={"count": 1, "duration": "PT1H", "model": "V100"}, headers=lab.alice.headers)
    assert r.status_code == 422 and r.json()["field"] == "count"
    r = client.get("/api/v1/availability", params={"count": 1, "duration": "soon"}, headers=lab.alice.headers)
    assert r.status_code == 422 and r.json()["field"] == "duration"
    r = client.get("/api/v1/availability", params={"count": 1, "duration": "3600", "min_memory": 100000}, headers=lab.alice.headers)
    assert r.status_code == 422


def test_availability_skips_starts_inside_a_listed_slot(client, lab):
    start = future(2)
    r = client.post("/api/v1/reservations", headers=lab.bob.headers, json={
        "host": "node-01", "devices": [0, 1, 2, 3], "start": (start + timedelta(hours=3)).isoformat(), "duration": "PT2H"})
    assert r.status_code == 201
    r = client.get("/api/v1/availability", params={"count": 4, "duration": "1h", "from": start.isoformat()},
                   headers=lab.alice.headers)
    slots = r.json()["slots"]
    assert [datetime.fromisoformat(x["start"]) for x in slots] == [start, start + timedelta(hours=5)]
    assert datetime.fromisoformat(slots[0]["free_until"]) == start + timedelta(hours=3)
