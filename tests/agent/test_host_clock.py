"""The agent's side of clocks, restarts and bounded snapshots (B40, B46, D3, D6)."""

from __future__ import annotations

import json
import logging
import shutil
from datetime import timedelta

import pytest

from agent.collect import ELLIPSIS, SnapshotBuilder, cut, fit_body
from agent.main import Agent, load_enforcer
from agent.schema import FindingReport, HostPolicy, ReservationEntry, Snapshot
from agent.telemetry import RawProcess, Telemetry
from tests.agent.test_loop import T0, FakeService, SimClock, make_agent

GPU_B = "GPU-b01b80eb-0f18-1df0-cf88-0725bd90f1e1"  # pid 58642 of the capture runs here


def _owners(tmp_path):
    owners = tmp_path / "owners.json"
    owners.write_text(json.dumps({"58813": {"user": "user-a", "uid": 1001}, "58642": {"user": "user-b", "uid": 1002}}))
    return owners


def test_b40_host_clock_10_minutes_behind_judged_in_service_time(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    service.skew = timedelta(minutes=10)  # the service is 10 min ahead of this host
    service_now = T0 + service.skew
    booking = ReservationEntry(id=9, user="user-b", unix_name="user-b", device_uuids=[GPU_B],
                               start=service_now, end=service_now + timedelta(hours=2))
    service.ack_kwargs = {"reservations": [booking], "policy": HostPolicy(policy="terminate", grace_seconds=60)}
    enforcer = load_enforcer(tmp_path / "enforce", dry_run=True)
    agent = make_agent(tmp_path / "s", service, clock, enforcer=enforcer, owners=_owners(tmp_path))
    agent.run(max_ticks=30)  # 150 s: well past the grace period
    snap = agent.last_snapshot
    assert snap.clock_offset_s == pytest.approx(600.0, abs=0.01)
    # collected_at is the service's time, not the host's
    assert abs((snap.collected_at - (clock.utc() + service.skew)).total_seconds()) <= 5.1
    assert not [f for f in snap.findings if f.unix_user == "user-b"]
    assert not [a for f in snap.findings for a in f.actions if f.pid == 58642]


def test_b40_without_the_offset_the_same_host_would_have_flagged_user_b(tmp_path):
    """The control: judged on the host's own clock, user-b's job starts before the booking."""
    clock = SimClock()
    service = FakeService(clock)
    service_now = T0 + timedelta(minutes=10)
    booking = ReservationEntry(id=9, user="user-b", unix_name="user-b", device_uuids=[GPU_B],
                               start=service_now, end=service_now + timedelta(hours=2))
    service.ack_kwargs = {"reservations": [booking], "policy": HostPolicy(policy="observe", grace_seconds=0)}
    enforcer = load_enforcer(tmp_path / "enforce", dry_run=True)
    agent = make_agent(tmp_path / "s", service, clock, enforcer=enforcer, owners=_owners(tmp_path))
    agent.run(max_ticks=3)
    assert [f for f in agent.last_snapshot.findings if f.unix_user == "user-b"]
    assert agent.last_snapshot.clock_offset_s == pytest.approx(0.0, abs=0.01)


def test_offset_over_2_s_is_logged_once(tmp_path, caplog):
    clock = SimClock()
    service = FakeService(clock)
    service.skew = timedelta(seconds=-3)
    agent = make_agent(tmp_path / "s", service, clock)
    with caplog.at_level(logging.WARNING, logger="gpuroster.agent"):
        agent.run(max_ticks=4)
    lines = [r.getMessage() for r in caplog.records if "clock is" in r.getMessage()]
    assert len(lines) == 1 and "3.0 s ahead of the service" in lines[0]
    assert agent.last_snapshot.clock_offset_s == pytest.approx(-3.0, abs=0.01)


def test_b46_wiped_state_dir_new_instance_id_seq_from_zero(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    first = make_agent(tmp_path / "s", service, clock)
    first.run(max_ticks=3)
    sent_first = first.last_snapshot
    shutil.rmtree(tmp_path / "s")
    second = make_agent(tmp_path / "s", service, clock)
    snap = second.take_snapshot()
    assert snap.seq == 0
    assert snap.agent_instance and snap.agent_instance != sent_first.agent_instance


def test_b46_duplicate_ack_for_a_different_snapshot_is_an_error(tmp_path, caplog):
    clock = SimClock()
    service = FakeService(clock)
    service.ack_kwargs = {"conflict": "seq 0 was used by a snapshot collected at 2026-05-04T08:00:00Z"}
    service.behaviour = lambda seq, t: (200, {})
    service.accepted.append(0)  # the service "already has" seq 0
    agent = make_agent(tmp_path / "s", service, clock)
    with caplog.at_level(logging.ERROR, logger="gpuroster.agent"):
        agent.run(max_ticks=1)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("duplicate of a different snapshot" in e and "seq 0" in e for e in errors)


def _long_processes(n: int = 30, length: int = 4096) -> Telemetry:
    procs = [RawProcess(device_uuid=GPU_B, pid=60000 + i, used_memory_mib=100.0 + i,
                        command="python train.py " + "x" * (length - 16)) for i in range(n)]
    return Telemetry(source="replay", processes=procs, replay_owners={})


class _Source:
    def __init__(self, t: Telemetry) -> None:
        self.t = t

    def poll(self) -> Telemetry:
        return self.t

    def close(self) -> None:
        pass


def test_d3_long_command_lines_cut_to_the_configured_length():
    builder = SnapshotBuilder(_Source(_long_processes()), host="node-01", max_command_length=200)
    snap = builder.build(0, T0)
    assert all(len(p.command) == 200 and p.command.endswith(ELLIPSIS) for p in snap.processes)
    assert len(snap.model_dump_json()) < 30 * 800  # uncut, 30 x 4 KiB would be 120 KiB
    hidden = SnapshotBuilder(_Source(_long_processes()), host="node-01", hide_args=True).build(0, T0)
    assert {p.command for p in hidden.processes} == {"python"}  # --hide-args still wins


def test_d3_snapshot_trimmed_under_the_body_limit_with_a_marker():
    snap = SnapshotBuilder(_Source(_long_processes(n=30)), host="node-01", max_command_length=4096).build(0, T0)
    snap.findings = [FindingReport(key="k", kind="unreserved", device_uuid=GPU_B, pid=60003, command="c" * 4000,
                                   first_seen=T0, last_seen=T0)]
    assert len(snap.model_dump_json()) > 100_000
    body = fit_body(snap, 16 * 1024)
    assert len(body) <= 16 * 1024
    sent = Snapshot.model_validate_json(body)
    assert sent.trimmed and "command lines cut" in sent.trimmed
    assert sent.findings[0].pid == 60003  # findings are kept
    small = fit_body(sent.model_copy(deep=True), 4 * 1024)
    kept = Snapshot.model_validate_json(small)
    assert len(small) <= 4 * 1024 and "dropped" in kept.trimmed
    assert 60003 in {p.pid for p in kept.processes}  # the process a finding names stays
    assert cut("abc", 10) == "abc" and cut(None, 3) is None


def test_d6_refused_snapshot_goes_to_dead_letter_and_the_spool_moves_on(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    # seq 1 is refused; seqs 2-4 arrive during an outage and wait in the spool behind it
    service.behaviour = lambda seq, t: (422, {}) if seq == 1 else ((503, {}) if 5 <= t < 25 else (200, {}))
    agent = make_agent(tmp_path / "s", service, clock)
    agent.run(max_ticks=12)
    assert 1 not in service.accepted and service.accepted == sorted(service.accepted)
    assert set(range(2, 12)) <= set(service.accepted)
    lines = (tmp_path / "s" / "dead-letter.jsonl").read_text().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["seq"] == 1 and entry["status"] == 422 and "422" in entry["reason"]
    assert entry["snapshot"]["seq"] == 1 and entry["snapshot"]["host"] == "node-01"
    assert len(agent.spool) == 0


def test_d6_dead_letter_file_is_bounded(tmp_path):
    from agent.state import DeadLetters

    dl = DeadLetters(tmp_path / "dl.jsonl", max_bytes=2000)
    for seq in range(20):
        dl.put(seq, 422, "bad", b'{"seq": %d, "pad": "%s"}' % (seq, b"x" * 200), at=T0)
    assert (tmp_path / "dl.jsonl").stat().st_size <= 2000
    assert (tmp_path / "dl.jsonl.1").exists()
    assert dl.count == 20


def test_agent_encode_uses_the_configured_limit(tmp_path):
    clock = SimClock()
    agent = Agent(SnapshotBuilder(_Source(_long_processes(n=30)), host="node-01", max_command_length=4096), None,
                  state_dir=tmp_path / "s", clock=clock, sleep=clock.sleep, now=clock.utc, max_body_bytes=32 * 1024)
    snap = agent.take_snapshot()
    assert len(agent.encode(snap)) <= 32 * 1024 and snap.trimmed
