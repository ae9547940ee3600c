"""The enforcer with injected notifier and signaller on a simulated clock: debounce,
lifecycle, rate limits, policies, dry run, persistence, robustness."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import agent.enforce as enforce_mod
from agent.enforce import Enforcer
from agent.schema import (
    DeviceReport,
    HostPolicy,
    NoticeReport,
    ProcessReport,
    ReservationEntry,
    Snapshot,
    SnapshotAck,
)
from agent.terminate import SignalOutcome

T0 = datetime(2025, 3, 10, 11, 0, tzinfo=UTC)
GPU0 = "GPU-1111aaaa-0000-0000-0000-000000000000"
GPU1 = "GPU-2222bbbb-0000-0000-0000-000000000000"
GPU2 = "GPU-3333cccc-0000-0000-0000-000000000000"
DEVICES = [
    DeviceReport(uuid=GPU0, index=0, name="NVIDIA GeForce GTX 1660 SUPER", pci_bus_id="00000000:01:00.0", utilization_gpu=90),
    DeviceReport(uuid=GPU1, index=1, name="NVIDIA GeForce RTX 3090", pci_bus_id="00000000:02:00.0", utilization_gpu=90),
    DeviceReport(uuid=GPU2, index=2, name="NVIDIA GeForce RTX 3090", pci_bus_id="00000000:03:00.0", utilization_gpu=0),
]


@dataclass
class FakeNotifier:
    calls: list[tuple[str, list[int], str]] = field(default_factory=list)
    dry: list[str] = field(default_factory=list)
    fail_for: set[str] = field(default_factory=set)

    def notify(self, *, recipient, pids, text, at, dry_run=False):
        if recipient in self.fail_for:
            raise RuntimeError("terminal exploded")
        if dry_run:
            self.dry.append(recipient)
            return NoticeReport(recipient=recipient, at=at, delivered=0, detail="dry run")
        self.calls.append((recipient, list(pids), text))
        return NoticeReport(recipient=recipient, at=at, delivered=1, detail="fake")

    def to(self, who: str) -> list[str]:
        return [t for r, _, t in self.calls if r == who]


@dataclass
class FakeSignaller:
    """Processes in ``alive`` (pid -> create_time) live until SIGKILL (or SIGTERM if soft)."""

    alive_map: dict[int, float] = field(default_factory=dict)
    soft: set[int] = field(default_factory=set)
    refuse: dict[int, str] = field(default_factory=dict)
    sent: list[tuple[int, int]] = field(default_factory=list)

    def _status(self, pid, ct):
        if pid in self.refuse:
            return SignalOutcome("refused", self.refuse[pid])
        if pid not in self.alive_map:
            return SignalOutcome("gone", "no such process")
        if ct is None or abs(self.alive_map[pid] - ct) > 0.05:
            return SignalOutcome("reused", "pid reused")
        return SignalOutcome("ok", "verified")

    def verify(self, pid, ct, policy):
        return self._status(pid, ct)

    def send(self, pid, ct, sig, policy):
        out = self._status(pid, ct)
        if out.status != "ok":
            return out
        self.sent.append((pid, sig))
        if sig == signal.SIGKILL or pid in self.soft:
            self.alive_map.pop(pid, None)
        return SignalOutcome("sent", f"{signal.Signals(sig).name} sent")

    def alive(self, pid, ct):
        return pid in self.alive_map and (ct is None or abs(self.alive_map[pid] - ct) <= 0.05)


def res(rid, user, devs, start, end, shared=()):
    return ReservationEntry(id=rid, user=user, unix_name=user, device_uuids=devs, start=start, end=end, shared_with=list(shared))


def ack(policy: HostPolicy | None = None, reservations=None, booking_url="https://roster.lab/book") -> SnapshotAck:
    return SnapshotAck(
        accepted=True, seq=1, server_time=T0, policy=policy or HostPolicy(),
        reservations=reservations if reservations is not None else [res(1, "user-a", [GPU1], T0 - timedelta(hours=1), T0 + timedelta(hours=3))],
        booking_url=booking_url,
    )


def proc(pid=4242, dev=GPU0, user="user-a", ct=1741600000.5, command="python train.py"):
    return ProcessReport(device_uuid=dev, pid=pid, unix_user=user, uid=1001, name="python", command=command, create_time=ct)


def snap(*procs, devices=DEVICES, t=T0, **kw) -> Snapshot:
    return Snapshot(host="node-02", seq=1, collected_at=t, devices=devices, processes=list(procs), **kw)


@pytest.fixture
def rig(tmp_path: Path):
    notifier, signaller = FakeNotifier(), FakeSignaller()
    e = Enforcer(tmp_path, notifier=notifier, signaller=signaller)
    return e, notifier, signaller


def run(e: Enforcer, a: SnapshotAck | None, s_at, seconds, step=5, procs=None):
    """Poll every ``step`` s from ``s_at`` for ``seconds``; return {t: reports}."""
    out = {}
    t = s_at
    while t <= s_at + timedelta(seconds=seconds):
        out[t] = e.evaluate(snap(*(procs if procs is not None else [proc()]), t=t), a, t)
        t += timedelta(seconds=step)
    return out


# ----------------------------------------------------------------------------------------
# debounce and lifecycle


def test_finding_appears_after_grace_not_before(rig) -> None:
    e, notifier, _ = rig
    a = ack(HostPolicy(grace_seconds=60))
    assert e.evaluate(snap(proc()), a, T0) == []
    assert e.evaluate(snap(proc()), a, T0 + timedelta(seconds=59)) == []
    assert notifier.calls == []
    [f] = e.evaluate(snap(proc()), a, T0 + timedelta(seconds=60))
    assert (f.kind, f.state, f.first_seen, f.last_seen) == ("unreserved", "notified", T0, T0 + timedelta(seconds=60))
    assert f.key == f"{GPU0}:4242:1741600000.50:unreserved"
    assert len(f.notices) == 1 and f.notices[0].recipient == "user-a"


def test_pending_judgement_that_disappears_starts_over(rig) -> None:
    e, notifier, _ = rig
    a = ack(HostPolicy(grace_seconds=60))
    e.evaluate(snap(proc()), a, T0)
    e.evaluate(snap(), a, T0 + timedelta(seconds=30))  # gone for one poll
    assert e.evaluate(snap(proc()), a, T0 + timedelta(seconds=70)) == []
    assert len(e.evaluate(snap(proc()), a, T0 + timedelta(seconds=130))) == 1


def test_one_finding_per_key_never_one_per_poll_and_resolved_reported_once(rig) -> None:
    e, notifier, _ = rig
    a = ack(HostPolicy(grace_seconds=10))
    polls = run(e, a, T0, 120)
    keys = {f.key for reps in polls.values() for f in reps}
    assert len(keys) == 1
    assert len(notifier.calls) == 1
    last = T0 + timedelta(seconds=125)
    [gone] = e.evaluate(snap(), a, last)
    assert (gone.state, gone.last_seen, gone.notices) == ("resolved", T0 + timedelta(seconds=120), [])
    assert e.evaluate(snap(), a, last + timedelta(seconds=5)) == []


def test_ack_none_judges_nothing_and_returns_open_findings_unchanged(rig) -> None:
    e, notifier, _ = rig
    a = ack(HostPolicy(grace_seconds=0))
    [f] = e.evaluate(snap(proc()), a, T0)
    [g] = e.evaluate(snap(), None, T0 + timedelta(seconds=5))  # process gone, but no table known
    assert (g.key, g.state, g.last_seen, g.notices) == (f.key, "notified", T0, [])
    assert e.evaluate(snap(proc(pid=999)), None, T0 + timedelta(seconds=10))[0].key == f.key
    assert len(notifier.calls) == 1


def test_stale_snapshot_or_unlisted_device_keeps_findings(rig) -> None:
    e, _, _ = rig
    a = ack(HostPolicy(grace_seconds=0))
    e.evaluate(snap(proc()), a, T0)
    [f] = e.evaluate(snap(stale=True), a, T0 + timedelta(seconds=5))
    assert f.state == "notified"
    broken = [d.model_copy(update={"processes_status": "unavailable"}) if d.uuid == GPU0 else d for d in DEVICES]
    [f] = e.evaluate(snap(devices=broken), a, T0 + timedelta(seconds=10))
    assert f.state == "notified"
    [f] = e.evaluate(snap(), a, T0 + timedelta(seconds=15))
    assert f.state == "resolved"


def test_kind_change_is_a_new_finding_and_the_old_resolves(rig) -> None:
    e, _, _ = rig
    t = T0.replace(hour=11, minute=59)
    table = [res(1, "user-a", [GPU0], t.replace(hour=10, minute=0), t.replace(hour=12, minute=0)),
             res(2, "user-b", [GPU0], t.replace(hour=12, minute=0), t.replace(hour=13, minute=0))]
    a = ack(HostPolicy(grace_seconds=0), table)
    assert e.evaluate(snap(proc(), t=t), a, t) == []
    t1 = t.replace(hour=12, minute=30)
    [f] = e.evaluate(snap(proc(), t=t1), a, t1)
    assert (f.kind, f.holder, f.reservation_id) == ("foreign", "user-b", 2)
    t2 = t.replace(hour=13, minute=0)
    reps = {r.kind: r for r in e.evaluate(snap(proc(), t=t2), a, t2)}
    assert reps["foreign"].state == "resolved"
    assert (reps["overrun"].state, reps["overrun"].reservation_id) == ("notified", 1)


# ----------------------------------------------------------------------------------------
# notices


def test_B30_notified_once_not_every_poll_both_users(rig) -> None:
    """R1 user-a 10-12, R2 user-b 12-14; user-a's pid 5101 seen at 11:58, 12:00:30, 12:05 and
    polled every 5 s: one finding foreign against R2, one notice each to user-a and user-b."""
    e, notifier, _ = rig
    noon = T0.replace(hour=12)
    table = [res(1, "user-a", [GPU0], noon - timedelta(hours=2), noon), res(2, "user-b", [GPU0], noon, noon + timedelta(hours=2))]
    a = ack(HostPolicy(grace_seconds=0), table)
    p = proc(pid=5101)
    assert e.evaluate(snap(p, t=noon - timedelta(minutes=2)), a, noon - timedelta(minutes=2)) == []
    polls = run(e, a, noon + timedelta(seconds=30), 270, procs=[p])
    first = polls[noon + timedelta(seconds=30)]
    assert [(f.kind, f.reservation_id, f.holder, f.state) for f in first] == [("foreign", 2, "user-b", "notified")]
    assert all(len(reps) == 1 and reps[0].key == first[0].key for reps in polls.values())
    assert sum(len(f.notices) for reps in polls.values() for f in reps) == 2
    assert len(notifier.to("user-a")) == 1 and len(notifier.to("user-b")) == 1
    assert "reserved by user-b (reservation 2)" in notifier.to("user-a")[0]
    assert "occupied by user-a's process 5101" in notifier.to("user-b")[0]


def test_B30_with_default_grace_the_finding_starts_a_grace_after_noon(rig) -> None:
    e, _, _ = rig
    noon = T0.replace(hour=12)
    table = [res(1, "user-a", [GPU0], noon - timedelta(hours=2), noon), res(2, "user-b", [GPU0], noon, noon + timedelta(hours=2))]
    a = ack(HostPolicy(), table)  # grace 60 s
    p = proc(pid=5101)
    assert e.evaluate(snap(p), a, noon - timedelta(minutes=2)) == []
    assert e.evaluate(snap(p), a, noon + timedelta(seconds=30)) == []
    [f] = e.evaluate(snap(p), a, noon + timedelta(minutes=5))
    assert (f.kind, f.first_seen, f.holder) == ("foreign", noon + timedelta(seconds=30), "user-b")


def test_notices_rate_limited_per_interval(rig) -> None:
    e, notifier, _ = rig
    a = ack(HostPolicy(grace_seconds=0, notice_interval_seconds=60))
    run(e, a, T0, 175)
    assert len(notifier.calls) == 3  # at 0, 60, 120 s


def test_observe_records_without_notices(rig) -> None:
    e, notifier, signaller = rig
    a = ack(HostPolicy(policy="observe", grace_seconds=0))
    polls = run(e, a, T0, 60)
    assert {f.state for reps in polls.values() for f in reps} == {"open"}
    assert notifier.calls == [] and signaller.sent == []


def test_B17_message_names_uuid_and_bus_of_used_and_reserved_gpu(rig) -> None:
    e, notifier, _ = rig
    a = ack(HostPolicy(grace_seconds=0))  # user-a holds the 3090 GPU1; runs on the 1660 GPU0
    [f] = e.evaluate(snap(proc()), a, T0)
    text = notifier.to("user-a")[0]
    assert f.message == text
    for needle in (GPU0, "00000000:01:00.0", GPU1, "00000000:02:00.0", "process 4242 (python train.py)",
                   f"CUDA_VISIBLE_DEVICES={GPU1}", "CUDA_DEVICE_ORDER=PCI_BUS_ID",
                   "gpuroster reserve -n 1 --for 4h --host node-02", "https://roster.lab/book"):
        assert needle in text, needle


def test_message_offers_a_free_device_when_the_user_holds_none(rig) -> None:
    e, notifier, _ = rig
    a = ack(HostPolicy(grace_seconds=0))
    e.evaluate(snap(proc(dev=GPU1, user="user-x"), proc(pid=77, dev=GPU1, user="user-a"), proc(pid=78, user="user-z")), a, T0)
    text = notifier.to("user-x")[0]
    assert "reserved by user-a (reservation 1) until 2025-03-10 14:00 UTC" in text
    assert f"Free right now: GPU 2 NVIDIA GeForce RTX 3090 (UUID {GPU2}, bus 00000000:03:00.0)" in text
    assert "GPU 0" not in text.split("Free right now:")[1]  # GPU0 is in use


def test_command_control_characters_are_not_written_to_terminals(rig) -> None:
    e, notifier, _ = rig
    a = ack(HostPolicy(grace_seconds=0))
    e.evaluate(snap(proc(command="python \x1b]0;pwned\x07\x1b[2J x.py")), a, T0)
    text = notifier.to("user-a")[0]
    assert "\x1b" not in text and "\x07" not in text


def test_idle_reservation_notifies_holder_after_idle_minutes(rig) -> None:
    e, notifier, _ = rig
    devices = [DEVICES[0], DEVICES[1].model_copy(update={"utilization_gpu": 0.0})]
    a = ack(HostPolicy(grace_seconds=0, idle_minutes=30))
    for minutes in (0, 10, 29):
        t = T0 + timedelta(minutes=minutes)
        assert e.evaluate(snap(devices=devices, t=t), a, t) == []
    t = T0 + timedelta(minutes=30)
    [f] = e.evaluate(snap(devices=devices, t=t), a, t)
    assert (f.kind, f.device_uuid, f.reservation_id, f.holder, f.pid) == ("idle", GPU1, 1, "user-a", None)
    assert f.key == f"{GPU1}:-:r1:idle"
    assert "has shown no process of yours" in notifier.to("user-a")[0]
    # the holder starts a job: resolved
    t = T0 + timedelta(minutes=31)
    [f] = e.evaluate(snap(proc(dev=GPU1), devices=devices, t=t), a, t)
    assert (f.kind, f.state) == ("idle", "resolved")


def test_idle_is_never_terminated(rig) -> None:
    e, _, signaller = rig
    devices = [DEVICES[1].model_copy(update={"utilization_gpu": 0.0})]
    a = ack(HostPolicy(policy="terminate", grace_seconds=0, idle_minutes=1))
    for minutes in range(0, 10):
        t = T0 + timedelta(minutes=minutes)
        e.evaluate(snap(devices=devices, t=t), a, t)
    assert signaller.sent == []


# ----------------------------------------------------------------------------------------
# termination


def test_terminate_timeline_sigterm_after_grace_then_sigkill_then_terminated(rig) -> None:
    e, notifier, signaller = rig
    p = proc()
    signaller.alive_map[p.pid] = p.create_time
    a = ack(HostPolicy(policy="terminate", grace_seconds=30, kill_timeout_seconds=10))
    polls = run(e, a, T0, 90)
    actions = [(t - T0).seconds for t, reps in polls.items() for f in reps for x in f.actions]
    kinds = [x.action for reps in polls.values() for f in reps for x in f.actions]
    assert kinds == ["sigterm", "sigkill"]
    assert actions == [60, 70]  # confirmed+warned at 30 s, SIGTERM at 30+30, SIGKILL 10 s later
    assert "SIGTERM at 11:01:00 UTC" in notifier.to("user-a")[0]
    assert [f.state for f in polls[T0 + timedelta(seconds=65)]] == ["notified"]
    assert [f.state for f in polls[T0 + timedelta(seconds=75)]] == ["terminated"]
    assert signaller.sent == [(4242, signal.SIGTERM), (4242, signal.SIGKILL)]
    assert e.evaluate(snap(), a, T0 + timedelta(seconds=100)) == []


def test_process_that_obeys_sigterm_is_not_killed(rig) -> None:
    e, _, signaller = rig
    p = proc()
    signaller.alive_map[p.pid] = p.create_time
    signaller.soft.add(p.pid)
    a = ack(HostPolicy(policy="terminate", grace_seconds=0, kill_timeout_seconds=10))
    [f] = e.evaluate(snap(p), a, T0)  # grace 0: confirmed, warned and due at once
    assert [x.action for x in f.actions] == ["sigterm"]
    [f] = e.evaluate(snap(p), a, T0 + timedelta(seconds=5))  # still listed by a lagging NVML
    assert f.state == "terminated"
    assert signaller.sent == [(4242, signal.SIGTERM)]


def test_signalled_process_that_left_the_gpu_but_lives_gets_sigkill(rig) -> None:
    e, _, signaller = rig
    p = proc()
    signaller.alive_map[p.pid] = p.create_time
    a = ack(HostPolicy(policy="terminate", grace_seconds=0, kill_timeout_seconds=10))
    e.evaluate(snap(p), a, T0)
    e.evaluate(snap(p), a, T0 + timedelta(seconds=1))
    [f] = e.evaluate(snap(), a, T0 + timedelta(seconds=5))  # off the GPU, still alive
    assert f.state == "notified"
    [f] = e.evaluate(snap(), a, T0 + timedelta(seconds=11))
    assert [x.action for x in f.actions] == ["sigkill"]
    [f] = e.evaluate(snap(), a, T0 + timedelta(seconds=15))
    assert f.state == "terminated"


def test_reused_pid_is_not_signalled(rig) -> None:
    e, _, signaller = rig
    p = proc()
    signaller.alive_map[p.pid] = p.create_time + 3600  # same pid, another process
    a = ack(HostPolicy(policy="terminate", grace_seconds=0))
    [f] = e.evaluate(snap(p), a, T0)  # grace 0: confirmed, warned and due at once
    assert [(x.action, "reused" in x.reason) for x in f.actions] == [("skipped", True)]
    [f] = e.evaluate(snap(p), a, T0 + timedelta(seconds=5))  # listed again: not retried
    assert (f.state, f.actions) == ("notified", [])
    [f] = e.evaluate(snap(), a, T0 + timedelta(seconds=10))
    assert f.state == "resolved"
    assert signaller.sent == []


def test_refused_process_skipped_once_not_every_poll(rig) -> None:
    e, _, signaller = rig
    p = proc()
    signaller.alive_map[p.pid] = p.create_time
    signaller.refuse[p.pid] = "pid 4242 is owned by root"
    a = ack(HostPolicy(policy="terminate", grace_seconds=0, notice_interval_seconds=3600))
    polls = run(e, a, T0, 60)
    actions = [x for reps in polls.values() for f in reps for x in f.actions]
    assert [(x.action, x.reason) for x in actions] == [("skipped", "SIGTERM not sent: refused: pid 4242 is owned by root")]
    assert signaller.sent == []
    assert [f.state for f in polls[T0 + timedelta(seconds=60)]] == ["notified"]


def test_dry_run_reports_what_it_would_do(tmp_path) -> None:
    notifier, signaller = FakeNotifier(), FakeSignaller()
    e = Enforcer(tmp_path, dry_run=True, notifier=notifier, signaller=signaller)
    p = proc()
    signaller.alive_map[p.pid] = p.create_time
    a = ack(HostPolicy(policy="terminate", grace_seconds=10, kill_timeout_seconds=10))
    polls = run(e, a, T0, 60, procs=[p])
    actions = [x for reps in polls.values() for f in reps for x in f.actions]
    assert [x.action for x in actions] == ["dry_run", "dry_run"]
    assert actions[0].reason.startswith("would send SIGTERM") and actions[1].reason.startswith("would send SIGKILL")
    assert signaller.sent == [] and notifier.calls == [] and notifier.dry == ["user-a"]
    [f] = polls[T0 + timedelta(seconds=10)]
    assert (f.state, [(n.delivered, n.detail) for n in f.notices]) == ("open", [(0, "dry run")])
    assert polls[T0 + timedelta(seconds=60)][0].state == "open"


def test_switch_from_notify_to_terminate_announces_before_signalling(rig) -> None:
    e, notifier, signaller = rig
    p = proc()
    signaller.alive_map[p.pid] = p.create_time
    run(e, ack(HostPolicy(grace_seconds=0)), T0, 30)
    assert len(notifier.calls) == 1
    a = ack(HostPolicy(policy="terminate", grace_seconds=60))
    t = T0 + timedelta(seconds=40)
    e.evaluate(snap(p), a, t)
    assert len(notifier.calls) == 2 and "will get SIGTERM at 11:01:40 UTC" in notifier.calls[1][2]
    e.evaluate(snap(p), a, t + timedelta(seconds=59))
    assert signaller.sent == []
    e.evaluate(snap(p), a, t + timedelta(seconds=60))
    assert signaller.sent == [(4242, signal.SIGTERM)]


def test_process_on_two_devices_gets_one_sigterm(rig) -> None:
    e, _, signaller = rig
    p0, p2 = proc(dev=GPU0), proc(dev=GPU2)
    signaller.alive_map[p0.pid] = p0.create_time
    a = ack(HostPolicy(policy="terminate", grace_seconds=0))
    e.evaluate(snap(p0, p2), a, T0)
    e.evaluate(snap(p0, p2), a, T0 + timedelta(seconds=1))
    assert signaller.sent == [(4242, signal.SIGTERM)]


# ----------------------------------------------------------------------------------------
# persistence and robustness


def test_findings_survive_restart_without_duplicate_notices(tmp_path) -> None:
    notifier = FakeNotifier()
    a = ack(HostPolicy(grace_seconds=60))
    e1 = Enforcer(tmp_path, notifier=notifier, signaller=FakeSignaller())
    e1.evaluate(snap(proc()), a, T0)
    [f1] = e1.evaluate(snap(proc()), a, T0 + timedelta(seconds=60))
    e2 = Enforcer(tmp_path, notifier=notifier, signaller=FakeSignaller())  # agent restarted
    [f2] = e2.evaluate(snap(proc()), a, T0 + timedelta(seconds=90))
    assert (f2.key, f2.first_seen, f2.state, f2.notices) == (f1.key, T0, "notified", [])
    assert len(notifier.calls) == 1
    data = json.loads((tmp_path / "findings.json").read_text())
    assert data["version"] == 1 and [x["key"] for x in data["findings"]] == [f1.key]


def test_pending_grace_survives_restart(tmp_path) -> None:
    a = ack(HostPolicy(grace_seconds=60))
    Enforcer(tmp_path, notifier=FakeNotifier(), signaller=FakeSignaller()).evaluate(snap(proc()), a, T0)
    e2 = Enforcer(tmp_path, notifier=FakeNotifier(), signaller=FakeSignaller())
    assert len(e2.evaluate(snap(proc()), a, T0 + timedelta(seconds=60))) == 1


def test_corrupt_state_file_is_moved_aside(tmp_path) -> None:
    (tmp_path / "findings.json").write_text("{not json")
    e = Enforcer(tmp_path, notifier=FakeNotifier(), signaller=FakeSignaller())
    assert e.evaluate(snap(proc()), ack(HostPolicy(grace_seconds=0)), T0)[0].state == "notified"
    assert (tmp_path / "findings.json.corrupt").read_text() == "{not json"
    assert json.loads((tmp_path / "findings.json").read_text())["version"] == 1


def test_unwritable_state_dir_is_logged_not_raised(tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    e = Enforcer(blocker / "state", notifier=FakeNotifier(), signaller=FakeSignaller())
    assert len(e.evaluate(snap(proc()), ack(HostPolicy(grace_seconds=0)), T0)) == 1
    assert "cannot save finding state" in caplog.text


def test_one_bad_process_does_not_stop_the_others(rig, monkeypatch, caplog) -> None:
    e, _, _ = rig
    real = enforce_mod.judge_process

    def flaky(p, *args, **kw):
        if p.pid == 13:
            raise ValueError("bad process")
        return real(p, *args, **kw)

    monkeypatch.setattr(enforce_mod, "judge", lambda *a, **k: (_ for _ in ()).throw(ValueError("whole snapshot")))
    monkeypatch.setattr(enforce_mod, "judge_process", flaky)
    reps = e.evaluate(snap(proc(pid=13), proc(pid=14)), ack(HostPolicy(grace_seconds=0)), T0)
    assert [f.pid for f in reps] == [14]
    assert "cannot judge pid 13" in caplog.text


def test_failing_notifier_for_one_finding_does_not_stop_the_others(rig, caplog) -> None:
    e, notifier, _ = rig
    notifier.fail_for.add("user-x")
    reps = e.evaluate(snap(proc(pid=13, user="user-x"), proc(pid=14)), ack(HostPolicy(grace_seconds=0)), T0)
    assert sorted((f.pid, f.state) for f in reps) == [(13, "open"), (14, "notified")]
    assert "enforcement of finding" in caplog.text


def test_unexpected_error_in_tracker_is_logged_not_raised(rig, monkeypatch, caplog) -> None:
    e, _, _ = rig
    a = ack(HostPolicy(grace_seconds=0))
    [f] = e.evaluate(snap(proc()), a, T0)
    monkeypatch.setattr(e.tracker, "observe", lambda *a, **k: (_ for _ in ()).throw(KeyError("boom")))
    [g] = e.evaluate(snap(proc()), a, T0 + timedelta(seconds=5))
    assert g.key == f.key and "evaluating snapshot 1 of node-02 failed" in caplog.text


def test_agent_own_pid_is_never_judged(rig) -> None:
    import os

    e, _, _ = rig
    assert e.evaluate(snap(proc(pid=os.getpid())), ack(HostPolicy(grace_seconds=0)), T0) == []
