"""The reporting loop: spool through an outage, retries, rejections, seq and ack persistence,
SIGKILL during an outage, and the enforcement hook. A simulated clock keeps it to seconds."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from agent.client import ServiceClient, backoff_delay, parse_retry_after
from agent.collect import SnapshotBuilder
from agent.main import Agent, load_enforcer
from agent.replay import ReplaySource
from agent.schema import HostPolicy, ReservationEntry, Snapshot, SnapshotAck
from agent.state import SEQ_BLOCK, AckCache, SeqCounter, Spool, atomic_write
from testkit.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "agent" / "captures"
CAPTURE = CAPTURES / "pai__nvidia_smi_out_of_order.xml"
T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
GPU_A = "GPU-c3b26f7a-8dcb-619c-fa1b-8029265a4db0"  # pid 58813 of the capture runs here


class SimClock:
    """Monotonic seconds that only move when the agent sleeps."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)

    def utc(self) -> datetime:
        return T0 + timedelta(seconds=self.t)


def make_ack(seq: int, *, duplicate: bool = False, reservations: list[ReservationEntry] | None = None,
             policy: HostPolicy | None = None, server_time: datetime = T0, conflict: str | None = None) -> SnapshotAck:
    return SnapshotAck(accepted=True, duplicate=duplicate, seq=seq, server_time=server_time, policy=policy or HostPolicy(),
                       reservations=reservations or [], conflict=conflict)


class FakeService:
    """The ingest endpoint behind ``httpx.MockTransport``; ``behaviour(seq, t)`` picks the answer."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self.accepted: list[int] = []
        self.accepted_real: list[float] = []
        self.collected: list[datetime] = []
        self.attempts: list[tuple[float, int, int]] = []
        self.behaviour = lambda seq, t: (200, {})
        self.ack_kwargs: dict = {}
        self.skew = timedelta(0)  # the service's clock minus the agent host's

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/agent/snapshots"
        assert request.headers["authorization"] == "Bearer host-token"
        snap = Snapshot.model_validate_json(request.content)  # the body is a valid Snapshot
        status, headers = self.behaviour(snap.seq, self.clock())
        self.attempts.append((self.clock(), snap.seq, status))
        if status != 200:
            return httpx.Response(status, headers=headers, text=f"status {status}")
        duplicate = snap.seq in self.accepted
        if not duplicate:
            self.accepted.append(snap.seq)
            self.accepted_real.append(time.perf_counter())
            self.collected.append(snap.collected_at)
        ack = make_ack(snap.seq, duplicate=duplicate, server_time=self.clock.utc() + self.skew, **self.ack_kwargs)
        return httpx.Response(200, json=ack.model_dump(mode="json"))


def make_agent(state: Path, service: FakeService, clock: SimClock, *, interval: float = 5.0, enforcer=None,  # noqa: ANN001
               owners: Path | None = None) -> Agent:
    builder = SnapshotBuilder(ReplaySource([CAPTURE], owners), host="node-01", interval=interval)
    client = ServiceClient("http://gpuroster.test", "host-token", transport=httpx.MockTransport(service.handler))
    return Agent(builder, client, state_dir=state, interval=interval, enforcer=enforcer, clock=clock, sleep=clock.sleep,
                 now=clock.utc, rng=random.Random(7))


def test_outage_of_60_minutes_every_snapshot_arrives_once_in_order_fast_drain(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    outage_s = 3600.0
    service.behaviour = lambda seq, t: (503, {}) if t < outage_s else (200, {})
    agent = make_agent(tmp_path / "state", service, clock)
    ticks = int(outage_s / 5) + 12  # the outage, then a minute of normal service
    agent.run(max_ticks=ticks)
    assert service.accepted == list(range(ticks))  # all of them, once each, in order
    assert len(agent.spool) == 0 and agent.rejected == 0
    during = [a for a in service.attempts if a[0] < outage_s]
    assert len(during) < 100  # backed off, not hammering
    gaps = [b[0] - a[0] for a, b in zip(during, during[1:])]
    assert max(gaps) <= 60 + 5  # capped at 60 s (attempts happen on 5 s ticks)
    backlog = int(outage_s / 5)
    drain_real = service.accepted_real[backlog] - service.accepted_real[0]
    ratio = outage_s / max(drain_real, 1e-6)
    assert ratio > 10, f"drained {backlog} snapshots in {drain_real:.2f} s: {ratio:.0f}x real time"
    # no drift: the polls were taken exactly 5 s apart
    assert service.collected == [T0 + timedelta(seconds=5 * k) for k in range(ticks)]


def test_429_retry_after_is_honoured(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    service.behaviour = lambda seq, t: (429, {"Retry-After": "7"}) if t < 1 else (200, {})
    agent = make_agent(tmp_path / "s", service, clock, interval=1.0)
    agent.run(max_ticks=12)
    assert service.accepted == list(range(12))
    first_fail, retry = service.attempts[0], service.attempts[1]
    assert first_fail[2] == 429 and retry[2] == 200
    assert 7 <= retry[0] - first_fail[0] < 9


def test_retry_after_longer_than_a_minute_is_capped_at_60_s(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    service.behaviour = lambda seq, t: (503, {"Retry-After": "600"}) if t < 1 else (200, {})
    agent = make_agent(tmp_path / "s", service, clock, interval=1.0)
    agent.run(max_ticks=70)
    assert 60 <= service.attempts[1][0] - service.attempts[0][0] < 62
    assert service.accepted == list(range(70))


def test_5xx_backoff_grows_with_jitter_and_is_capped(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    service.behaviour = lambda seq, t: (500, {})
    agent = make_agent(tmp_path / "s", service, clock, interval=1.0)
    agent.run(max_ticks=400)
    times = [a[0] for a in service.attempts]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[0] < 3 and max(gaps) <= 61 and max(gaps) >= 30
    assert len(service.accepted) == 0 and len(agent.spool) == 400


def test_backoff_delay_bounds():
    rng = random.Random(3)
    for attempt in range(1, 30):
        d = backoff_delay(attempt, rng=rng)
        assert 0 < d <= 60
        assert d >= min(60, 2 ** (attempt - 1)) / 2
    assert backoff_delay(1, 7, rng=rng) >= 7
    assert backoff_delay(1, 3600, rng=rng) == 60
    assert parse_retry_after("12") == 12
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=datetime(2015, 10, 21, 7, 27, 50, tzinfo=UTC)) == 10
    assert parse_retry_after("soon") is None


@pytest.mark.parametrize("status", [400, 401, 403, 413, 422])
def test_permanent_errors_are_dropped_never_retried(tmp_path, status, caplog):
    clock = SimClock()
    service = FakeService(clock)
    service.behaviour = lambda seq, t: (status, {}) if seq in (0, 1) else (200, {})
    agent = make_agent(tmp_path / "s", service, clock)
    agent.run(max_ticks=5)
    assert [a[1] for a in service.attempts] == [0, 1, 2, 3, 4]  # each posted once
    assert service.accepted == [2, 3, 4]
    assert agent.rejected == 2 and len(agent.spool) == 0
    loud = [r for r in caplog.records if r.levelname == "ERROR" and str(status) in r.getMessage()]
    assert len(loud) == 1  # loud, but once per state change


def test_network_errors_are_retried(tmp_path):
    clock = SimClock()
    calls = {"n": 0}
    service = FakeService(clock)

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise httpx.ConnectError("connection refused", request=request)
        return service.handler(request)

    builder = SnapshotBuilder(ReplaySource([CAPTURE]), host="node-01")
    client = ServiceClient("http://gpuroster.test", "host-token", transport=httpx.MockTransport(handler))
    agent = Agent(builder, client, state_dir=tmp_path / "s", clock=clock, sleep=clock.sleep, now=clock.utc)
    agent.run(max_ticks=6)
    assert service.accepted == list(range(6))


def test_seq_is_monotonic_across_restarts(tmp_path):
    counter = SeqCounter(tmp_path / "seq")
    first = [counter.next() for _ in range(5)]
    again = SeqCounter(tmp_path / "seq")  # a restart (or a crash) skips the rest of the block
    second = [again.next() for _ in range(3)]
    assert first == [0, 1, 2, 3, 4]
    assert second == [SEQ_BLOCK, SEQ_BLOCK + 1, SEQ_BLOCK + 2]
    many = SeqCounter(tmp_path / "seq2", block=4)
    seqs = [many.next() for _ in range(10)]
    assert seqs == list(range(10)) and int((tmp_path / "seq2").read_text()) == 12


def test_spool_bounds_by_size_and_age(tmp_path, caplog):
    now = {"t": 1_000_000.0}
    spool = Spool(tmp_path / "spool", max_bytes=1000, max_age_s=3600, wall=lambda: now["t"])
    for seq in range(20):
        spool.put(seq, b"x" * 100)
    assert len(spool) == 10 and spool.total_bytes == 1000 and spool.oldest()[0] == 10
    assert spool.dropped == 10
    for seq in range(10, 20):
        os.utime(spool._path(seq), (now["t"] - 7200, now["t"] - 7200))
    spool.put(20, b"y")
    assert len(spool) == 1 and spool.oldest() == (20, b"y")
    reopened = Spool(tmp_path / "spool", max_bytes=1000, max_age_s=3600, wall=lambda: now["t"])
    assert len(reopened) == 1 and reopened.total_bytes == 1


def test_default_spool_bound_holds_a_day_at_5_s():
    snapshots_per_day = 24 * 3600 / 5
    agent_defaults = Agent.__init__.__kwdefaults__
    assert agent_defaults["spool_max_age_s"] >= 24 * 3600
    assert agent_defaults["spool_max_bytes"] / snapshots_per_day >= 20 * 1024  # >= 20 KiB per snapshot


def test_atomic_write_leaves_no_torn_or_temporary_files(tmp_path):
    target = tmp_path / "d" / "ack.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["ack.json"]


def test_ack_is_cached_in_memory_and_on_disk_and_survives_restart(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    reservation = ReservationEntry(id=7, user="user-b", unix_name="user-b", device_uuids=[GPU_A],
                                   start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=2))
    service.ack_kwargs = {"reservations": [reservation], "policy": HostPolicy(policy="observe", grace_seconds=0)}
    agent = make_agent(tmp_path / "s", service, clock)
    assert agent.ack is None
    agent.run(max_ticks=2)
    assert agent.ack.reservations == [reservation]
    mtime = (tmp_path / "s" / "ack.json").stat().st_mtime_ns
    agent.run(max_ticks=2)
    assert (tmp_path / "s" / "ack.json").stat().st_mtime_ns == mtime  # unchanged table: not rewritten
    restarted = AckCache(tmp_path / "s" / "ack.json")
    assert restarted.ack.reservations == [reservation] and restarted.ack.policy.policy == "observe"
    # a service outage after the restart: the cached table is still there for enforcement
    service.behaviour = lambda seq, t: (503, {})
    again = make_agent(tmp_path / "s", service, clock)
    again.run(max_ticks=3)
    assert again.ack.reservations == [reservation]


def test_enforcer_judges_with_cached_table_and_findings_are_posted(tmp_path):
    enforcer = load_enforcer(tmp_path / "enforce", dry_run=True)
    assert enforcer is not None, "agent.enforce.Enforcer is part of the package"
    owners = tmp_path / "owners.json"
    owners.write_text(json.dumps({"58813": {"user": "user-a", "uid": 1001}, "58642": {"user": "user-b", "uid": 1002}}))
    clock = SimClock()
    service = FakeService(clock)
    reservation = ReservationEntry(id=7, user="user-b", unix_name="user-b", device_uuids=[GPU_A],
                                   start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=2))
    service.ack_kwargs = {"reservations": [reservation], "policy": HostPolicy(policy="observe", grace_seconds=0)}
    agent = make_agent(tmp_path / "s", service, clock, enforcer=enforcer, owners=owners)
    first = agent.take_snapshot()
    assert first.findings == []  # no reservation table yet: nothing to judge against
    agent.run(max_ticks=4)
    snap = agent.last_snapshot
    foreign = [f for f in snap.findings if f.pid == 58813]
    assert foreign and foreign[0].kind == "foreign" and foreign[0].device_uuid == GPU_A
    assert foreign[0].unix_user == "user-a"


def test_enforcer_failure_does_not_stop_reporting(tmp_path):
    class Broken:
        def evaluate(self, snapshot, ack, now):  # noqa: ANN001, ANN201
            raise RuntimeError("bug")

    clock = SimClock()
    service = FakeService(clock)
    agent = make_agent(tmp_path / "s", service, clock, enforcer=Broken())
    agent.run(max_ticks=3)
    assert service.accepted == [0, 1, 2]


def test_loop_does_not_drift_and_skips_missed_ticks(tmp_path):
    clock = SimClock()
    service = FakeService(clock)
    agent = make_agent(tmp_path / "s", service, clock)
    taken: list[float] = []
    real_take = agent.take_snapshot

    def slow_take():  # noqa: ANN202
        taken.append(clock.t)
        if len(taken) == 3:
            clock.t += 12.0  # one poll overruns by two intervals
        else:
            clock.t += 0.3  # the poll itself takes time
        return real_take()

    agent.take_snapshot = slow_take
    agent.run(max_ticks=6)
    assert taken == pytest.approx([0, 5, 10, 25, 30, 35])


def test_sigkill_during_outage_loses_at_most_one_interval_and_spool_stays_readable(tmp_path):
    state = tmp_path / "state"
    token = tmp_path / "host.token"
    token.write_text("host-token\n")
    token.chmod(0o600)
    cmd = [sys.executable, "-m", "agent", "--replay", str(CAPTURE), "--server", f"http://127.0.0.1:{free_port()}",
           "--token-file", str(token), "--state-dir", str(state), "--interval", "0.05", "--host", "node-01",
           "--config", str(tmp_path / "none.toml")]
    (tmp_path / "none.toml").write_text("")
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if len(list((state / "spool").glob("*.json"))) >= 20:
                break
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(10)
    files = sorted((state / "spool").glob("*.json"))
    assert len(files) >= 20, child.stderr.read().decode()[-2000:]
    seqs = [int(f.stem) for f in files]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # contiguous: nothing lost but the last in flight
    for f in files:
        Snapshot.model_validate_json(f.read_bytes())  # every spooled file is whole
    # the service comes back: a restarted agent replays the backlog in order, then carries on
    clock = SimClock()
    service = FakeService(clock)
    agent = make_agent(state, service, clock)
    agent.run(max_ticks=3)
    assert service.accepted[: len(seqs)] == seqs
    assert len(service.accepted) == len(seqs) + 3
    assert min(service.accepted[len(seqs):]) > max(seqs)  # seq stays monotonic across the kill
    assert not list((state / "spool").iterdir())
