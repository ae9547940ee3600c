"""Process ownership: the cgroup parser (B06), the owner cache, the start-up checks (B05, B13)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.owners import OwnerResolver, check_environment, container_id_from_cgroup
from testkit.fake_nvml import FakeOwner, FakeProcessTable

C1 = "a" * 64
C2 = "b" * 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"4:cpuacct:/docker/{C1}", C1),
        (f"1:name=systemd:/system.slice/docker-{C1}.scope", C1),
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_0000_1111_2222_333344445555.slice/"
         f"cri-containerd-{C1}.scope", C1),
        (f"5:cpu,cpuacct:/docker/{C2}/docker/{C1}", C1),
        ("0::/", None),
        ("0::/user.slice/user-1000.slice/session-3.scope", None),
        (f"12:memory:/docker/{C1}\n11:cpuset:/\n1:name=systemd:/\n0::/", C1),
    ],
    ids=["1-docker-v1", "2-systemd-docker", "3-k8s-containerd-v2", "4-nested", "5-v2-namespaced", "6-login", "7-moby-memory-line"],
)
def test_b06_container_id_from_cgroup(text, expected):
    assert container_id_from_cgroup(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        f"0::/machine.slice/libpod-{C1}.scope/container",
        f"0::/system.slice/crio-{C1}.scope",
        f"11:devices:/kubepods/burstable/pod0a1b2c3d-0000-1111-2222-333344445555/{C1}",
        f"0::/system.slice/containerd.service/kubepods-besteffort-pod1.slice:cri-containerd:{C1}",
    ],
    ids=["podman", "cri-o", "k8s-cgroupfs-v1", "containerd-systemd-colon"],
)
def test_b06_other_runtimes(text):
    assert container_id_from_cgroup(text) == C1


@pytest.mark.parametrize("text", ["", None, "garbage", "0::", "::::", "0::/kubepods/pod0a1b2c3d-0000-1111-2222-333344445555", "0::/docker/" + "a" * 63])
def test_b06_never_raises_never_empty_never_pod_uid(text):
    assert container_id_from_cgroup(text) is None


def test_podman_conmon_is_not_the_container():
    assert container_id_from_cgroup(f"0::/machine.slice/libpod-conmon-{C1}.scope") is None


def test_owner_cache_keyed_by_pid_and_start_ticks():
    table = FakeProcessTable({41001: FakeOwner(uid=1001, user="user-a", create_time=100.0)})
    resolver = OwnerResolver(**table.resolver_kwargs())
    first = resolver.resolve(41001)
    resolver.end_poll()
    assert resolver.resolve(41001) is first  # cached
    resolver.end_poll()
    # the pid is recycled by another user's process: new start time, new owner
    table.owners[41001] = FakeOwner(uid=1002, user="user-b", create_time=200.0, start_ticks=9999)
    second = resolver.resolve(41001)
    assert (second.user, second.create_time) == ("user-b", 200.0)
    resolver.end_poll()
    resolver.end_poll()  # not seen for a poll: forgotten
    assert resolver._cache == {}


def test_B36_clock_step_keeps_the_cached_owner_and_identity():
    """psutil's create_time moves with a stepped clock; the start ticks do not."""
    table = FakeProcessTable({41001: FakeOwner(uid=1001, user="user-a", create_time=100.0)})
    resolver = OwnerResolver(**table.resolver_kwargs())
    first = resolver.resolve(41001)
    resolver.end_poll()
    table.owners[41001].create_time = 102.0  # boot time moved by +2 s
    again = resolver.resolve(41001)
    assert again is first and again.identity == "4242@fake-boot"


def test_hide_args_reports_the_executable_only():
    table = FakeProcessTable({7: FakeOwner(argv=["/usr/bin/python3", "train.py", "--secret", "x"])})
    shown = OwnerResolver(**table.resolver_kwargs()).resolve(7)
    hidden = OwnerResolver(hide_args=True, **table.resolver_kwargs()).resolve(7)
    assert shown.command == "/usr/bin/python3 train.py --secret x"
    assert hidden.command == "/usr/bin/python3" and hidden.name == "python3"


def test_uid_without_passwd_entry_is_uid_only_with_user_none():
    table = FakeProcessTable({7: FakeOwner(uid=123456, user=None)})
    owner = OwnerResolver(**table.resolver_kwargs()).resolve(7)
    assert owner.status == "uid_only" and owner.uid == 123456 and owner.user is None


def test_real_process_resolves_to_current_user():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--flag"])
    try:
        # between fork and exec the child is still a copy of this process with no command
        # line of its own: wait for the exec, as the agent only ever sees processes that
        # already hold a GPU context
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not Path(f"/proc/{child.pid}/cmdline").read_bytes().endswith(b"--flag\0"):
            time.sleep(0.01)
        owner = OwnerResolver().resolve(child.pid)
        assert owner.status == "ok"
        assert owner.uid == os.getuid()
        assert owner.create_time and owner.create_time > 0
        assert owner.command.endswith("--flag")
    finally:
        child.kill()
        child.wait()
    assert OwnerResolver().resolve(child.pid).status == "exited"


def _fake_proc(tmp_path, *, self_ns: str, init_ns: str | None, mounts: str, comm: str = "systemd"):
    proc = tmp_path / "proc"
    (proc / "self/ns").mkdir(parents=True)
    (proc / "1/ns").mkdir(parents=True)
    os.symlink(self_ns, proc / "self/ns/pid")
    if init_ns is not None:
        os.symlink(init_ns, proc / "1/ns/pid")
    (proc / "1/comm").write_text(comm + "\n")
    (proc / "mounts").write_text(mounts.replace("/proc ", f"{proc} "))
    return proc


def test_b05_detects_foreign_pid_namespace_with_loud_warning(tmp_path, caplog):
    proc = _fake_proc(tmp_path, self_ns="pid:[4026532100]", init_ns="pid:[4026531836]", mounts="proc /proc proc rw,nosuid 0 0\n")
    env = check_environment(proc)
    assert env.host_pid_ns is False
    assert any("run with host PID namespace" in w for w in env.warnings)
    assert any("run with host PID namespace" in r.getMessage() for r in caplog.records)


def test_b05_same_namespace_is_fine(tmp_path):
    proc = _fake_proc(tmp_path, self_ns="pid:[4026531836]", init_ns="pid:[4026531836]", mounts="proc /proc proc rw 0 0\n")
    env = check_environment(proc)
    assert env.host_pid_ns is True and not [w for w in env.warnings if "namespace" in w]


def test_b05_unreadable_init_namespace_falls_back_to_init_name(tmp_path):
    proc = _fake_proc(tmp_path, self_ns="pid:[1]", init_ns=None, mounts="", comm="bash")
    assert check_environment(proc).host_pid_ns is None
    proc2 = _fake_proc(tmp_path / "b", self_ns="pid:[1]", init_ns=None, mounts="", comm="systemd")
    assert check_environment(proc2).host_pid_ns is True


def test_b13_hidepid_start_up_warning_for_an_unprivileged_agent(tmp_path):
    proc = _fake_proc(tmp_path, self_ns="pid:[1]", init_ns="pid:[1]", mounts="proc /proc proc rw,nosuid,hidepid=2 0 0\n")
    env = check_environment(proc, euid=1000)
    assert env.hidepid is True
    assert any("hidepid" in w and "root" in w for w in env.warnings)


def test_b13_hidepid_detected_for_root_without_warning(tmp_path):
    proc = _fake_proc(tmp_path, self_ns="pid:[1]", init_ns="pid:[1]", mounts="proc /proc proc rw,hidepid=invisible 0 0\n")
    env = check_environment(proc)
    assert env.hidepid is True
    assert bool([w for w in env.warnings if "hidepid" in w]) == (not env.is_root)
