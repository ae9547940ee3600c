"""Check-in by evidence and idle holders over simulated time (``now=`` passed to ingest and
the sweep): no check-in -> warned -> released (slot listeners told); keep -> left alone;
evidence by the holder's process or container; a stale agent or unreliable process data
never releases; an idle holder is asked and keep leaves it alone; silence -> the rule's
policy (nothing / release / release only the idle devices); both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from agent.schema import Snapshot
from app.db import run_in_transaction, transaction
from app.models import AuditLog, Finding, Host, Reservation, ReservationDevice, UsageRollup
from app.services import checkin, checkin_sweep, ingest, ingest_ack, slot_freed
from app.services import reservations as reservation_service
from app.timeutil import fmt_local
from tests.conftest import book, future, gpu, snapshot_body

ALICE_GPU = "GPU-0000aaaa-0000-0000-0000-000000000000"


def _rule(client, lab, **values):
    r = client.post("/api/v1/rules", json={"scope": "default", **values}, headers=lab.admin.headers)
    assert r.status_code == 201, r.text
    return r.json()


def _booked(client, lab, session_factory, devices=(0,), *, started_ago: int = 1, hours: float = 4) -> tuple[int, datetime]:
    """A booking of alice's, moved to have started ``started_ago`` minutes before now (real
    time), so the API and pages see it active; returns (id, start)."""
    r = book(client, lab.alice, list(devices), future(1), duration=f"PT{int(hours * 60)}M")
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=started_ago)
    end = start + timedelta(hours=hours)

    def move(s):
        s.execute(update(Reservation).where(Reservation.id == rid).values(start_at=start, end_at=end))
        s.execute(update(ReservationDevice).where(ReservationDevice.reservation_id == rid).values(start_at=start, end_at=end))
    run_in_transaction(session_factory, move)
    return rid, start


class Agent:
    """Posts node-01's snapshots through ingest at simulated times."""

    def __init__(self, session_factory, settings, lab):
        self.sf, self.settings, self.lab, self.seq = session_factory, settings, lab, 100

    def post(self, at: datetime, *, processes=(), util: float | None = 1.0, mem: float | None = 20_000.0, stale: bool = False,
             **extra) -> None:
        self.seq += 1
        devices = [gpu(u, i, memory_used_mib=mem, utilization_gpu=util, **extra) for i, u in enumerate(self.lab.devices)]
        snap = Snapshot.model_validate(snapshot_body("node-01", self.seq, devices, list(processes), collected_at=at,
                                                     stale=stale))

        def work(s):
            host = s.scalar(select(Host).where(Host.name == "node-01"))
            ingest.ingest_snapshot(s, host=host, snap=snap, settings=self.settings, now=at)
        run_in_transaction(self.sf, work)

    def sweep(self, at: datetime, *, post: bool = True, **kw) -> checkin_sweep.SweepResult:
        if post:
            self.post(at, **kw)
        return run_in_transaction(self.sf, lambda s: checkin_sweep.sweep(s, now=at, settings=self.settings))


@pytest.fixture
def agent(session_factory, settings, lab):
    return Agent(session_factory, settings, lab)


def _proc(user: str, device: str = ALICE_GPU, **kw) -> dict:
    return {"device_uuid": device, "pid": 4242, "unix_user": user, "used_memory_mib": 1000.0, **kw}


def _res(session_factory, rid: int) -> Reservation:
    with session_factory() as s:
        return s.get(Reservation, rid)


def _finding(session_factory, rid: int, kind: str) -> Finding | None:
    with session_factory() as s:
        return s.scalar(select(Finding).where(Finding.key == f"reservation:{rid}:{kind}"))


def _told(session_factory, username: str) -> list[str]:
    with session_factory() as s:
        return [a.detail["text"] for a in s.scalars(select(AuditLog).where(
            AuditLog.action == "notice.reservation", AuditLog.target == f"user:{username}").order_by(AuditLog.id))]


def test_no_check_in_is_warned_then_released_and_the_slot_offered(client, lab, session_factory, agent):
    _rule(client, lab, checkin_minutes=30, checkin_grace_minutes=15)
    rid, t0 = _booked(client, lab, session_factory)
    freed: list[int] = []

    def listener(_s, r):
        freed.append(r.id)
    slot_freed.subscribe(listener)
    try:
        assert agent.sweep(t0 + timedelta(minutes=29)).warned == []  # not yet due
        out = agent.sweep(t0 + timedelta(minutes=31))
        assert out.warned == [rid] and out.released == []
        r = _res(session_factory, rid)
        assert r.checkin_warned_at == t0 + timedelta(minutes=31) and r.status == "confirmed"
        assert _finding(session_factory, rid, "no_show").state == "notified"
        text = _told(session_factory, "alice")[-1]
        assert "No check-in yet: keep it?" in text and "http://testserver/answer/" in text
        assert f"gpuroster keep {rid}" in text
        assert fmt_local(t0, agent.settings.tz) in text and t0.isoformat() not in text  # lab time, never raw ISO UTC
        assert client.get(f"/api/v1/reservations/{rid}", headers=lab.alice.headers).json()["question"] == "checkin"
        # a second sweep before the grace ends changes nothing
        assert agent.sweep(t0 + timedelta(minutes=40)).released == []
        released_at = t0 + timedelta(minutes=46)
        out = agent.sweep(released_at)
        assert out.released == [rid]
    finally:
        slot_freed.unsubscribe(listener)
    r = _res(session_factory, rid)
    assert (r.status, r.auto_release, r.end_at) == ("released", "no_show", released_at)
    assert freed == [rid]
    # the rest of the slot is free for others
    later = book(client, lab.bob, [0], (released_at + timedelta(minutes=5)).replace(second=0), duration="PT1H")
    assert later.status_code == 201, later.text
    assert _finding(session_factory, rid, "no_show").state == "terminated"
    assert "was released" in _told(session_factory, "alice")[-1]
    # the admin sees the finding
    kinds = [f["kind"] for f in client.get("/api/v1/findings", headers=lab.admin.headers).json()["items"]]
    assert "no_show" in kinds


def test_keep_leaves_a_warned_reservation_alone(client, lab, session_factory, agent):
    _rule(client, lab, checkin_minutes=30, checkin_grace_minutes=15)
    rid, t0 = _booked(client, lab, session_factory, started_ago=35)
    now = datetime.now(UTC)
    assert agent.sweep(now).warned == [rid]
    assert client.post(f"/api/v1/reservations/{rid}/keep", headers=lab.bob.headers).status_code == 403
    kept = client.post(f"/api/v1/reservations/{rid}/keep", headers=lab.alice.headers)
    assert kept.status_code == 200, kept.text
    assert kept.json()["question"] is None
    assert client.post(f"/api/v1/reservations/{rid}/keep", headers=lab.alice.headers).status_code == 409
    assert agent.sweep(now + timedelta(minutes=60)).released == []
    assert _res(session_factory, rid).status == "confirmed"
    assert _finding(session_factory, rid, "no_show").state == "resolved"


def test_check_in_by_the_holders_process_or_container_only(client, lab, session_factory, agent):
    _rule(client, lab, checkin_minutes=30)
    rid, t0 = _booked(client, lab, session_factory)
    agent.post(t0 + timedelta(minutes=5), processes=[_proc("bob")])  # someone else's process is no evidence
    assert _res(session_factory, rid).checked_in_at is None
    at = t0 + timedelta(minutes=6)
    agent.post(at, processes=[_proc("alice", container_id="c0ffee", owner_status="ok")])
    assert _res(session_factory, rid).checked_in_at == at
    agent.post(at + timedelta(minutes=1), processes=[_proc("alice", pid=5)])  # marked once, never moved
    assert _res(session_factory, rid).checked_in_at == at
    assert agent.sweep(t0 + timedelta(minutes=50)).warned == []


def test_check_in_by_uid_when_the_agent_could_not_name_it(client, lab, session_factory, agent):
    from app.models import User

    run_in_transaction(session_factory, lambda s: s.execute(update(User).where(User.username == "alice").values(unix_uid=4321)))
    rid, t0 = _booked(client, lab, session_factory)
    agent.post(t0 + timedelta(minutes=3), processes=[_proc(None, uid=4322, owner_status="uid_only")])
    assert _res(session_factory, rid).checked_in_at is None
    agent.post(t0 + timedelta(minutes=4), processes=[_proc(None, uid=4321, owner_status="uid_only")])
    assert _res(session_factory, rid).checked_in_at == t0 + timedelta(minutes=4)


def test_short_bookings_need_no_check_in(client, lab, session_factory, agent):
    _rule(client, lab, checkin_minutes=10, checkin_min_booking_minutes=120)
    rid, t0 = _booked(client, lab, session_factory, hours=1)
    assert agent.sweep(t0 + timedelta(minutes=30)).warned == []


def test_a_stale_agent_or_unreliable_process_data_never_releases(client, lab, session_factory, agent):
    _rule(client, lab, checkin_minutes=30, checkin_grace_minutes=15)
    rid, t0 = _booked(client, lab, session_factory)
    assert agent.sweep(t0 + timedelta(minutes=31)).warned == [rid]
    # the agent stops reporting: no release however long it is silent
    out = agent.sweep(t0 + timedelta(minutes=90), post=False)
    assert out.released == [] and "stale" in out.skipped[rid]
    # it comes back with process data it marks unreliable: still no release
    out = agent.sweep(t0 + timedelta(minutes=91), mem=5000.0, process_data="unreliable")
    assert out.released == [] and "unreliable" in out.skipped[rid]
    # ... nor on a snapshot the agent marks stale (NVML did not answer in time)
    out = agent.sweep(t0 + timedelta(minutes=92), stale=True)
    assert out.released == [] and "stale" in out.skipped[rid]
    assert _res(session_factory, rid).status == "confirmed"
    # trusted again: released
    assert agent.sweep(t0 + timedelta(minutes=93)).released == [rid]


def _idle_minutes(session_factory, lab, start: datetime, minutes: int, *, devices=(0,), util: float = 1.0,
                  mem: float = 20_000.0) -> None:
    """Per-minute rollups as ingest writes them: ``util`` % compute, ``mem`` MiB held."""
    def work(s):
        from app.models import Device
        ids = [s.scalar(select(Device.id).where(Device.uuid == lab.devices[i])) for i in devices]
        for m in range(minutes):
            minute = (start + timedelta(minutes=m)).replace(second=0, microsecond=0)
            for dev in ids:
                s.merge(UsageRollup(device_id=dev, minute=minute, samples=1, utilization_sum=util, utilization_samples=1,
                                    memory_used_sum_mib=mem, memory_samples=1, users=["alice"]))
    run_in_transaction(session_factory, work)


def _checked_in_idle(client, lab, session_factory, agent, *, devices=(0,), silence="nothing", idle_devices=(0,)):
    _rule(client, lab, idle_below_percent=5, idle_after_minutes=30, idle_grace_minutes=10, idle_silence=silence)
    rid, t0 = _booked(client, lab, session_factory, devices=devices)
    agent.post(t0 + timedelta(minutes=2), processes=[_proc("alice")])  # after the lab fixture's snapshot
    assert _res(session_factory, rid).checked_in_at is not None
    _idle_minutes(session_factory, lab, t0 + timedelta(minutes=3), 50, devices=idle_devices)
    busy = [d for d in devices if d not in idle_devices]
    if busy:
        _idle_minutes(session_factory, lab, t0 + timedelta(minutes=3), 50, devices=busy, util=80.0)
    return rid, t0


def test_idle_holder_is_asked_and_keep_leaves_it_alone(client, lab, session_factory, agent):
    rid, t0 = _checked_in_idle(client, lab, session_factory, agent, silence="release")
    asked_at = t0 + timedelta(minutes=36)
    assert agent.sweep(asked_at).asked == [rid]
    assert "Still using it?" in _told(session_factory, "alice")[-1]
    assert _finding(session_factory, rid, "idle_holder").state == "notified"
    with transaction(session_factory, write=True) as s:  # the holder answers keep (as the signed link or the CLI would)
        r = checkin.keep(s, actor="user:alice", actor_user=None, reservation_id=rid, now=asked_at + timedelta(minutes=2),
                         tz=agent.settings.tz, load=reservation_service.load_locked)
        assert r.idle_kept_at is not None
    out = agent.sweep(asked_at + timedelta(minutes=12))  # past the grace, devices still idle
    assert out.idle_released == [] and out.asked == []
    assert _res(session_factory, rid).status == "confirmed"
    assert _finding(session_factory, rid, "idle_holder").state == "resolved"


def test_a_busy_or_uncovered_device_is_not_idle(client, lab, session_factory, agent):
    _rule(client, lab, idle_below_percent=5, idle_after_minutes=30)
    rid, t0 = _booked(client, lab, session_factory)
    agent.post(t0 + timedelta(minutes=2), processes=[_proc("alice")])
    _idle_minutes(session_factory, lab, t0 + timedelta(minutes=2), 10)  # only 10 of 30 minutes reported
    assert agent.sweep(t0 + timedelta(minutes=36)).asked == []
    _idle_minutes(session_factory, lab, t0 + timedelta(minutes=12), 25, util=60.0)
    assert agent.sweep(t0 + timedelta(minutes=37)).asked == []


@pytest.mark.parametrize("silence", ["nothing", "release"])
def test_silence_applies_the_rules_policy(client, lab, session_factory, agent, silence):
    rid, t0 = _checked_in_idle(client, lab, session_factory, agent, silence=silence)
    assert agent.sweep(t0 + timedelta(minutes=36)).asked == [rid]
    assert agent.sweep(t0 + timedelta(minutes=40)).idle_released == []  # within the grace
    out = agent.sweep(t0 + timedelta(minutes=47))
    r = _res(session_factory, rid)
    if silence == "nothing":
        assert out.idle_released == [] and r.status == "confirmed"
        assert _finding(session_factory, rid, "idle_holder").state == "notified"
    else:
        assert out.idle_released == [rid] and (r.status, r.auto_release) == ("released", "idle")
        assert _finding(session_factory, rid, "idle_holder").state == "terminated"


def test_silence_releases_only_the_idle_devices_of_a_multi_device_booking(client, lab, session_factory, agent, settings):
    rid, t0 = _checked_in_idle(client, lab, session_factory, agent, devices=(0, 1), silence="release_idle_devices",
                               idle_devices=(1,))
    assert agent.sweep(t0 + timedelta(minutes=36)).asked == [rid]
    at = t0 + timedelta(minutes=47)
    assert agent.sweep(at).idle_released == [rid]
    with session_factory() as s:
        r = s.get(Reservation, rid)
        assert (r.status, r.auto_release, r.idle_asked_at) == ("confirmed", "idle_devices", None)
        ends = {i.device_id: i.end_at for i in s.scalars(select(ReservationDevice).where(ReservationDevice.reservation_id == rid))}
        assert sorted(ends.values()) == [at, r.end_at]
        host = s.scalar(select(Host).where(Host.name == "node-01"))
        table = ingest_ack.reservation_table(s, host=host, now=at + timedelta(minutes=1))
        assert [e.device_uuids for e in table if e.id == rid] == [[lab.devices[0]]]
        end = r.end_at
    # the freed GPU is bookable by others; extending the reservation leaves it freed
    assert book(client, lab.bob, [1], (at + timedelta(minutes=5)).replace(second=0), duration="PT1H").status_code == 201
    longer = client.patch(f"/api/v1/reservations/{rid}", json={"end": (end + timedelta(hours=1)).isoformat()},
                          headers=lab.alice.headers)
    assert longer.status_code == 200, longer.text
    with session_factory() as s:
        ends = sorted(i.end_at for i in s.scalars(select(ReservationDevice).where(ReservationDevice.reservation_id == rid)))
        assert ends == [at, end + timedelta(hours=1)]


def test_holder_releasing_after_the_question_is_a_consent_release(client, lab, session_factory, agent):
    rid, t0 = _checked_in_idle(client, lab, session_factory, agent)
    assert agent.sweep(t0 + timedelta(minutes=36)).asked == [rid]
    r = client.post(f"/api/v1/reservations/{rid}/release", headers=lab.alice.headers)
    assert r.status_code == 200, r.text
    assert r.json()["auto_release"] == "idle_consent"
    assert _finding(session_factory, rid, "idle_holder").state == "resolved"


def test_rule_settings_are_validated_and_resolved(client, lab):
    bad = client.post("/api/v1/rules", json={"scope": "default", "idle_silence": "sometimes"}, headers=lab.admin.headers)
    assert bad.status_code == 422 and "idle_silence" in bad.text
    rule = _rule(client, lab, checkin_minutes=30, idle_below_percent=5, idle_silence="release_idle_devices")
    assert (rule["checkin_minutes"], rule["idle_silence"]) == (30, "release_idle_devices")


def test_report_counts_no_shows_consent_releases_and_idle_hours_after_check_in(client, lab, session_factory, agent,
                                                                                settings):
    _rule(client, lab, checkin_minutes=30, checkin_grace_minutes=15)
    no_show, t0 = _booked(client, lab, session_factory, devices=(0,), started_ago=180)
    assert agent.sweep(t0 + timedelta(minutes=31)).warned == [no_show]
    assert agent.sweep(t0 + timedelta(minutes=46)).released == [no_show]
    idle, t1 = _booked(client, lab, session_factory, devices=(1,), started_ago=120)
    from app.models import Reservation as R  # the holder checked in, then left the GPU idle for an hour
    run_in_transaction(session_factory, lambda s: s.execute(update(R).where(R.id == idle).values(
        checked_in_at=t1 + timedelta(minutes=2), idle_asked_at=t1 + timedelta(minutes=70))))
    _idle_minutes(session_factory, lab, t1 + timedelta(minutes=3), 60, devices=(1,))
    assert client.post(f"/api/v1/reservations/{idle}/release", headers=lab.alice.headers).status_code == 200
    params = {"user": "alice", "from": (t0 - timedelta(hours=1)).isoformat(), "to": datetime.now(UTC).isoformat()}
    rep = client.get("/api/v1/reports/usage", params=params, headers=lab.alice.headers).json()
    totals = rep["totals"]
    # an hour of idle rollups after the check-in, plus at most the minute of the lab fixture's snapshot
    hour = pytest.approx(1.0 + 0.5 / 60, abs=0.5 / 60 + 1e-3)
    assert (totals["no_shows"], totals["consent_releases"], totals["checked_in_idle_gpu_hours"]) == (1, 1, hour)
    assert totals["findings"].get("no_show") == 1  # the admin-visible finding of the no-show
    by_id = {r["id"]: r for r in rep["reservations"]}
    assert by_id[no_show]["auto_release"] == "no_show" and by_id[no_show]["checked_in_idle_gpu_hours"] == 0
    assert by_id[idle]["auto_release"] == "idle_consent" and by_id[idle]["checked_in_idle_gpu_hours"] == hour
    csv_text = client.get("/api/v1/reports/usage.csv", params=params, headers=lab.alice.headers).text
    header, *lines = csv_text.splitlines()
    assert header.endswith("checked_in_utc,checked_in_idle_gpu_hours,auto_release")
    row = next(line.split(",") for line in lines if line.endswith(",idle_consent"))
    assert float(row[-2]) == hour and any(line.endswith(",no_show") for line in lines)
