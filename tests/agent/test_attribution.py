"""Attribution of GPU processes to people: containers, directory uids, process identity, system
executables (B36, B37, B38, D2), with real processes where the kernel allows it and a stand-in
Docker Engine API over a Unix socket for the container runtime."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.collect import SnapshotBuilder
from agent.containers import ContainerDirectory
from agent.enforce import Enforcer
from agent.owners import OwnerResolver
from agent.policy import judge
from agent.procid import identify, parse_stat, verified_exe
from agent.schema import DeviceReport, HostPolicy, NoticeReport, ReservationEntry, SnapshotAck
from agent.telemetry import RawProcess, Telemetry
from agent.terminate import ProcessSignaller
from testkit.docker_standin import DockerStandIn, inspect_body
from testkit.fake_nvml import FakeOwner, FakeProcessTable

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start children under other uids")
NOBODY = 65534
NO_PASSWD_UID = 20001
GPU0 = "GPU-a77a0000-0000-0000-0000-000000000000"
DEVICES = [DeviceReport(uuid=GPU0, index=0, name="NVIDIA A100-SXM4-80GB", memory_used_mib=30720, utilization_gpu=97)]
T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
CID_A = "a" * 60 + "0001"
CID_B = "b" * 60 + "0002"
CID_GONE = "c" * 64


def holder_b(uid: int | None = None) -> ReservationEntry:
    return ReservationEntry(id=11, user="user-b", unix_name="user-b", unix_uid=uid, device_uuids=[GPU0],
                            start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=3))


def make_ack(policy: HostPolicy, *, unix_uids: dict[int, str] | None = None) -> SnapshotAck:
    return SnapshotAck(accepted=True, seq=1, server_time=T0, policy=policy, reservations=[holder_b(2002)],
                       unix_uids=unix_uids or {}, booking_url="https://roster.lab/book")


@dataclass
class RecordingNotifier:
    sent: list[tuple[str, str]] = field(default_factory=list)

    def notify(self, *, recipient, pids, text, at, dry_run=False) -> NoticeReport:  # noqa: ANN001
        self.sent.append((recipient, text))
        return NoticeReport(recipient=recipient, at=at, delivered=1, detail="recorded")


@dataclass
class OneGpu:
    """A telemetry source listing the given pids on GPU0, 30 GiB each."""

    pids: list[int]

    def poll(self) -> Telemetry:
        return Telemetry(source="nvml", devices=list(DEVICES),
                         processes=[RawProcess(device_uuid=GPU0, pid=p, used_memory_mib=30720.0) for p in self.pids])

    def close(self) -> None:
        pass


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gr-", dir="/tmp"))  # Unix socket paths are limited to 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def runtime(sock_dir: Path) -> Iterator[DockerStandIn]:
    server = DockerStandIn(sock_dir / "docker.sock", {
        CID_A: inspect_body(CID_A, name="train-a", image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                            labels={"org.gpuroster.user": "user-a"}),
        CID_B: inspect_body(CID_B, name="jupyter", image="jupyter/base-notebook:latest",
                            labels={"com.docker.compose.project": "carol-exp"}),
    })
    yield server
    server.close()


def spawn(argv: list[str], *, uid: int, ignore_term: bool = False) -> subprocess.Popen:
    def pre() -> None:
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited across exec

    return subprocess.Popen(argv, user=uid, group=uid if uid != NO_PASSWD_UID else NOBODY, extra_groups=[], cwd="/",
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=pre)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    made: list[subprocess.Popen] = []
    yield made
    for p in made:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)


def wait_exec(p: subprocess.Popen, exe_name: str) -> None:
    for _ in range(200):
        try:
            # the new image and its argv (read back as the command) both in place
            if (os.path.basename(os.readlink(f"/proc/{p.pid}/exe")) == exe_name
                    and Path(f"/proc/{p.pid}/cmdline").read_bytes()):
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"pid {p.pid} never ran {exe_name}")


# -- process identity ------------------------------------------------------------------------


def test_stat_parse_survives_spaces_and_parentheses_in_comm() -> None:
    fields = " ".join(["S"] + [str(i) for i in range(4, 22)] + ["987654", "0", "0"])
    assert parse_stat(f"4242 (my (evil) ) job) {fields}") == ("my (evil) ) job", 987654)
    with pytest.raises(ValueError):
        parse_stat("4242 (short) S 1 2")


def test_identity_of_a_real_process_is_its_start_ticks_and_boot_id() -> None:
    ident = identify(os.getpid())
    assert ident is not None and ident.pid == os.getpid()
    assert ident.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    fields = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    assert ident.start_ticks == int(fields[19])
    assert identify(2**22 + 7) is None


# -- containers ------------------------------------------------------------------------------


def test_runtime_lookup_reads_label_compose_rule_and_caches(runtime: DockerStandIn) -> None:
    clock = [0.0]
    d = ContainerDirectory([runtime.path], compose_pattern=r"^(?P<user>[a-z]+)-", ttl=600, negative_ttl=30,
                           clock=lambda: clock[0], state_dirs=[])
    a = d.lookup(CID_A)
    assert (a.owner, a.owner_source, a.name, a.image) == ("user-a", "label", "train-a",
                                                           "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime")
    b = d.lookup(CID_B)
    assert (b.owner, b.owner_source) == ("carol", "compose")
    gone = d.lookup(CID_GONE)
    assert not gone.found and gone.owner is None and "no such container" in (gone.error or "")
    assert len(runtime.requests) == 3
    for _ in range(50):  # the poll loop asks again every few seconds: answered from the cache
        d.lookup(CID_A), d.lookup(CID_GONE)
    assert len(runtime.requests) == 3
    clock[0] = 31.0  # an unknown container is asked again soon (it may just have been created)
    d.lookup(CID_A), d.lookup(CID_GONE)
    assert runtime.requests[3:] == [f"/containers/{CID_GONE}/json"]
    d.close()


def test_name_rule_and_configurable_label(runtime: DockerStandIn) -> None:
    runtime.containers[CID_GONE] = inspect_body(CID_GONE, name="dave-llm", image="vllm/vllm-openai",
                                                labels={"lab.owner": "erin"})
    by_label = ContainerDirectory([runtime.path], owner_label="lab.owner", state_dirs=[])
    assert by_label.lookup(CID_GONE).owner == "erin"
    by_name = ContainerDirectory([runtime.path], name_pattern=r"^(?P<user>[a-z]+)-", state_dirs=[])
    assert (by_name.lookup(CID_GONE).owner, by_name.lookup(CID_GONE).owner_source) == ("dave", "name")
    with pytest.raises(ValueError, match="user"):
        ContainerDirectory([runtime.path], name_pattern=r"^([a-z]+)-")


def test_no_runtime_socket_means_no_request_and_no_owner(sock_dir: Path) -> None:
    d = ContainerDirectory([sock_dir / "absent.sock"], state_dirs=[sock_dir / "no-containerd"])
    info = d.lookup(CID_A)
    assert not info.found and d.requests == 0 and "no container runtime socket" in (info.error or "")


def test_kubernetes_containers_from_containerd_and_cri_o_state(sock_dir: Path) -> None:
    """Pods on containerd or CRI-O: no Docker API, the OCI config.json annotations instead."""
    import json

    containerd, crio = sock_dir / "containerd", sock_dir / "crio"
    (containerd / "k8s.io" / CID_A).mkdir(parents=True)
    (containerd / "k8s.io" / CID_A / "config.json").write_text(json.dumps({"ociVersion": "1.1.0", "annotations": {
        "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "lab-alice",
        "io.kubernetes.cri.sandbox-name": "train-7f9c", "io.kubernetes.cri.container-name": "train",
        "io.kubernetes.cri.image-name": "nvcr.io/nvidia/pytorch:24.05-py3"}}))
    (crio / CID_B / "userdata").mkdir(parents=True)
    (crio / CID_B / "userdata" / "config.json").write_text(json.dumps({"annotations": {
        "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.name": "notebook",
        "io.kubernetes.cri-o.ImageName": "jupyter/base-notebook:latest",
        "io.kubernetes.cri-o.Labels": json.dumps({"org.gpuroster.user": "bob", "app": "nb"})}}))
    d = ContainerDirectory([sock_dir / "absent.sock"], compose_pattern=r"^lab-(?P<user>[a-z]+)$",
                           state_dirs=[containerd, crio])
    a, b = d.lookup(CID_A), d.lookup(CID_B)
    assert (a.owner, a.owner_source, a.name, a.image) == ("alice", "compose", "train-7f9c", "nvcr.io/nvidia/pytorch:24.05-py3")
    assert (b.owner, b.owner_source, b.name, b.image) == ("bob", "label", "notebook", "jupyter/base-notebook:latest")
    assert not d.lookup(CID_GONE).found


def _b38_snapshot(runtime: DockerStandIn, cid: str):  # noqa: ANN202
    table = FakeProcessTable({41001: FakeOwner(uid=0, user="root", argv=["python", "train.py"],
                                               cgroup=f"0::/system.slice/docker-{cid}.scope", exe=None)})
    resolver = OwnerResolver(containers=ContainerDirectory([runtime.path], state_dirs=[]), **table.resolver_kwargs())
    return SnapshotBuilder(OneGpu([41001]), host="node-b38", resolver=resolver).build(1, T0)


@pytest.mark.parametrize("policy", ["notify", "terminate"])
def test_B38_labelled_root_container_is_judged_as_its_owner(runtime: DockerStandIn, tmp_path: Path, policy: str) -> None:
    snap = _b38_snapshot(runtime, CID_A)
    [p] = snap.processes
    assert (p.uid, p.unix_user, p.owner_source, p.container_name) == (0, "user-a", "label", "train-a")
    [j] = judge(snap.processes, [holder_b()], HostPolicy(), now=T0, devices=DEVICES, include_idle=False)
    assert (j.kind, j.unix_user, j.holder, j.container_id) == ("foreign", "user-a", "user-b", CID_A)
    notifier = RecordingNotifier()
    e = Enforcer(tmp_path, notifier=notifier, signaller=ProcessSignaller())
    [f] = e.evaluate(snap, make_ack(HostPolicy(policy=policy, grace_seconds=0)), T0)
    assert (f.kind, f.unix_user, f.holder) == ("foreign", "user-a", "user-b")
    assert [r for r, _ in notifier.sent] == ["user-a", "user-b"]


@pytest.mark.parametrize("policy", ["notify", "terminate"])
def test_B38_unlabelled_root_container_is_unattributed_never_exempt_never_signalled(
    runtime: DockerStandIn, tmp_path: Path, policy: str
) -> None:
    runtime.containers[CID_A]["Config"]["Labels"] = {}
    snap = _b38_snapshot(runtime, CID_A)
    [p] = snap.processes
    assert (p.uid, p.unix_user, p.owner_status) == (0, None, "unattributed")
    notifier = RecordingNotifier()
    sent: list[int] = []

    class Refuse(ProcessSignaller):
        def send(self, pid, ref, sig, policy):  # noqa: ANN001
            sent.append(sig)
            raise AssertionError("an unattributed process must never be signalled")

    e = Enforcer(tmp_path, notifier=notifier, signaller=Refuse())
    ack = make_ack(HostPolicy(policy=policy, grace_seconds=0, kill_timeout_seconds=1))
    for k in range(5):
        [f] = e.evaluate(snap, ack, T0 + timedelta(seconds=30 * k))
    assert f.kind == "unattributed" and f.unix_user is None and f.holder == "user-b"
    assert (f.container_id, f.container_name, f.container_image) == (
        CID_A, "train-a", "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime")
    assert f.actions == [] and sent == []
    assert [r for r, _ in notifier.sent] == ["user-b"]  # the holder; admins are told by the service
    assert "owner" in notifier.sent[0][1] and "admins" in notifier.sent[0][1]


def test_B38_without_any_runtime_the_container_is_unattributed() -> None:
    table = FakeProcessTable({41001: FakeOwner(uid=0, user="root", cgroup=f"0::/system.slice/docker-{CID_A}.scope")})
    owner = OwnerResolver(**table.resolver_kwargs()).resolve(41001)
    assert (owner.status, owner.user, owner.container_id) == ("unattributed", None, CID_A)


# -- real processes under real uids ----------------------------------------------------------


@ROOT_ONLY
def test_D2_a_process_named_Xorg_is_judged_by_its_executable(procs: list[subprocess.Popen]) -> None:
    p = spawn(["bash", "-c", "exec -a Xorg sleep 600"], uid=NOBODY)
    procs.append(p)
    wait_exec(p, "sleep")
    snap = SnapshotBuilder(OneGpu([p.pid]), host="node-d2").build(1, T0)
    [rep] = snap.processes
    assert rep.command.startswith("Xorg") and rep.unix_user == "nobody"
    assert rep.exe == verified_exe(p.pid) == os.path.realpath(shutil.which("sleep"))  # the real sleep
    [j] = judge(snap.processes, [holder_b()], HostPolicy(), now=T0, devices=DEVICES, include_idle=False)
    assert (j.kind, j.unix_user, j.holder) == ("foreign", "nobody", "user-b")
    # the signaller's live check does not fall for the name either
    out = ProcessSignaller().verify(p.pid, rep.identity, HostPolicy(exempt_process_names=["Xorg"]))
    assert out.status == "ok", out.detail


@ROOT_ONLY
def test_D2_verified_system_executable_of_root_is_exempt(procs: list[subprocess.Popen]) -> None:
    p = subprocess.Popen(["sleep", "600"], cwd="/")
    procs.append(p)
    wait_exec(p, "sleep")
    snap = SnapshotBuilder(OneGpu([p.pid]), host="node-d2").build(1, T0)
    [rep] = snap.processes
    assert rep.uid == 0 and rep.exe is not None
    assert judge(snap.processes, [holder_b()], HostPolicy(), now=T0, devices=DEVICES, include_idle=False) == []


@ROOT_ONLY
def test_D2_root_running_an_executable_it_does_not_own_is_judged(procs: list[subprocess.Popen], sock_dir: Path) -> None:
    exe = sock_dir / "sleep-copy"
    shutil.copy(shutil.which("sleep"), exe)
    os.chown(exe, NOBODY, NOBODY)
    p = subprocess.Popen([str(exe), "600"], cwd="/")
    procs.append(p)
    wait_exec(p, "sleep-copy")
    snap = SnapshotBuilder(OneGpu([p.pid]), host="node-d2").build(1, T0)
    [rep] = snap.processes
    assert rep.uid == 0 and rep.exe is None
    [j] = judge(snap.processes, [holder_b()], HostPolicy(), now=T0, devices=DEVICES, include_idle=False)
    assert (j.kind, j.unix_user) == ("foreign", "root")


@ROOT_ONLY
@pytest.mark.parametrize("mapped", [True, False])
def test_B37_uid_without_passwd_entry_is_judged_by_uid(procs: list[subprocess.Popen], tmp_path: Path, mapped: bool) -> None:
    p = spawn(["sleep", "600"], uid=NO_PASSWD_UID)
    procs.append(p)
    wait_exec(p, "sleep")
    snap = SnapshotBuilder(OneGpu([p.pid]), host="node-b37").build(1, T0)
    [rep] = snap.processes
    assert (rep.uid, rep.unix_user, rep.owner_status, rep.used_memory_mib) == (NO_PASSWD_UID, None, "uid_only", 30720.0)
    notifier = RecordingNotifier()
    e = Enforcer(tmp_path, notifier=notifier)
    ack = make_ack(HostPolicy(policy="terminate", grace_seconds=0, kill_timeout_seconds=1),
                   unix_uids={NO_PASSWD_UID: "user-c"} if mapped else {})
    actions = []
    for k in range(4):
        [f] = e.evaluate(snap, ack, T0 + timedelta(seconds=5 * k))
        actions += [a.action for a in f.actions]
    assert f.uid == NO_PASSWD_UID and f.holder == "user-b"
    if mapped:  # user-c has that uid in gpuroster: an ordinary foreign finding, enforced as usual
        assert (f.kind, f.unix_user) == ("foreign", "user-c")
        assert [r for r, _ in notifier.sent][:2] == ["user-c", "user-b"]
        assert actions[0] == "sigterm"
    else:
        assert (f.kind, f.unix_user) == ("unknown_uid", None)
        assert e.tracker.findings[f.key].reason == "uid 20001, unknown to gpuroster on a device reserved by user-b"
        assert [r for r, _ in notifier.sent] == ["user-b"]
        assert actions == [] and p.poll() is None


@ROOT_ONLY
def test_B37_holder_with_that_uid_is_covered(procs: list[subprocess.Popen]) -> None:
    p = spawn(["sleep", "600"], uid=NO_PASSWD_UID)
    procs.append(p)
    wait_exec(p, "sleep")
    snap = SnapshotBuilder(OneGpu([p.pid]), host="node-b37").build(1, T0)
    assert judge(snap.processes, [holder_b(uid=NO_PASSWD_UID)], HostPolicy(), now=T0, devices=DEVICES,
                 include_idle=False) == []


@ROOT_ONLY
def test_B36_clock_step_leaves_one_identity_one_finding_and_kills_on_schedule(
    procs: list[subprocess.Popen], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """user-a (nobody here) ignores SIGTERM on user-b's GPU0; policy terminate, grace 60 s, kill
    timeout 10 s, 5 s polls; after the SIGTERM psutil's boot time moves by +2 s."""
    p = spawn(["sleep", "600"], uid=NOBODY, ignore_term=True)
    procs.append(p)
    wait_exec(p, "sleep")
    builder = SnapshotBuilder(OneGpu([p.pid]), host="node-b36", interval=5.0)
    notifier = RecordingNotifier()
    e = Enforcer(tmp_path, notifier=notifier, signaller=ProcessSignaller())
    ack = make_ack(HostPolicy(policy="terminate", grace_seconds=60, kill_timeout_seconds=10, notice_interval_seconds=900))
    import psutil._pslinux as pslinux

    real_boot = pslinux.boot_time
    create_times: set[float] = set()
    reports = []
    for k in range(40):
        now = T0 + timedelta(seconds=5 * k)
        snap = builder.build(k, now)
        create_times.update(x.create_time for x in snap.processes)
        out = e.evaluate(snap, ack, now)
        reports += out
        actions = [a for f in reports for a in f.actions]
        if actions and actions[0].action == "sigterm" and pslinux.boot_time is real_boot:
            monkeypatch.setattr(pslinux, "boot_time", lambda: real_boot() + 2.0)
        if any(f.state == "terminated" for f in out):
            break
        if any(a.action == "sigkill" for a in actions):
            p.wait(timeout=5)
    assert len(create_times) == 2  # the clock step did move psutil's create_time
    assert len({f.key for f in reports}) == 1
    actions = [a for f in reports for a in f.actions]
    assert [a.action for a in actions] == ["sigterm", "sigkill"]
    assert actions[1].at - actions[0].at == timedelta(seconds=10)
    assert actions[0].at - T0 == timedelta(seconds=120)  # grace to the finding, grace to the signal
    states = [f.state for f in reports]
    assert "terminated" not in states[:-1] and states[-1] == "terminated"
    assert [r for r, _ in notifier.sent] == ["nobody", "user-b"]  # one notice, one note to the holder
    assert p.returncode == -signal.SIGKILL


def test_container_settings_from_toml_and_a_rule_without_user_group_is_refused(tmp_path: Path) -> None:
    from agent.config import load_settings

    cfg = tmp_path / "agent.toml"
    cfg.write_text('container_owner_label = "lab.owner"\ncontainer_name_pattern = "^(?P<user>[a-z]+)-"\n'
                   'container_sockets = ["/run/user/1000/podman/podman.sock"]\n')
    s = load_settings({}, cfg, env=False)
    assert (s.container_owner_label, s.container_name_pattern) == ("lab.owner", "^(?P<user>[a-z]+)-")
    assert s.container_sockets == [Path("/run/user/1000/podman/podman.sock")]
    cfg.write_text('container_compose_pattern = "^([a-z]+)-"\n')
    with pytest.raises(ValueError, match="user"):
        load_settings({}, cfg, env=False)


def test_unattributed_container_is_asked_again_once_the_runtime_knows_it(runtime: DockerStandIn) -> None:
    clock = [0.0]
    table = FakeProcessTable({41001: FakeOwner(uid=0, user="root", cgroup=f"0::/system.slice/docker-{CID_GONE}.scope")})
    d = ContainerDirectory([runtime.path], negative_ttl=30, state_dirs=[], clock=lambda: clock[0])
    resolver = OwnerResolver(containers=d, **table.resolver_kwargs())
    assert resolver.resolve(41001).status == "unattributed"
    runtime.containers[CID_GONE] = inspect_body(CID_GONE, name="late", image="img", labels={"org.gpuroster.user": "user-a"})
    resolver.end_poll()
    assert resolver.resolve(41001).status == "unattributed"  # the negative answer is cached for 30 s
    clock[0] = 31.0
    owner = resolver.resolve(41001)
    assert (owner.status, owner.user, owner.container_name) == ("ok", "user-a", "late")
    assert len(runtime.requests) == 2
