"""ProcessSignaller against real child processes: re-identification by (pid, create_time),
the pidfd ordering that closes the pid-reuse race, and the processes never signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from agent.schema import HostPolicy
from agent.terminate import ProcessSignaller

NOBODY = 65534
POLICY = HostPolicy()

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start children as other users")


def spawn(user: int | None = NOBODY, *, ignore_term: bool = False, argv: list[str] | None = None) -> subprocess.Popen:
    def pre() -> None:
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited across exec

    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    p = subprocess.Popen(argv or ["sleep", "120"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, cwd="/", start_new_session=True, preexec_fn=pre, **kw)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # wait for the exec, so name and create_time are final
        try:
            if psutil.Process(p.pid).name() == os.path.basename((argv or ["sleep"])[0]):
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.01)
    return p


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)


def ct(p: subprocess.Popen) -> float:
    return psutil.Process(p.pid).create_time()


def test_verify_and_sigterm_through_pidfd(children) -> None:
    p = spawn()
    children.append(p)
    s = ProcessSignaller()
    assert s.use_pidfd  # this kernel offers pidfds; the fallback has its own test
    assert s.verify(p.pid, ct(p), POLICY).status == "ok"
    out = s.send(p.pid, ct(p), signal.SIGTERM, POLICY)
    assert out.status == "sent" and "via pidfd" in out.detail
    assert p.wait(timeout=5) == -signal.SIGTERM


def test_kill_fallback_without_pidfd(children) -> None:
    p = spawn()
    children.append(p)
    out = ProcessSignaller(use_pidfd=False).send(p.pid, ct(p), signal.SIGKILL, POLICY)
    assert out.status == "sent" and "via kill(2)" in out.detail
    assert p.wait(timeout=5) == -signal.SIGKILL


def test_reused_pid_is_not_signalled(children) -> None:
    p = spawn()
    children.append(p)
    s = ProcessSignaller()
    out = s.send(p.pid, ct(p) - 42.0, signal.SIGKILL, POLICY)  # the finding's process started earlier
    assert out.status == "reused"
    time.sleep(0.1)
    assert p.poll() is None
    assert s.alive(p.pid, ct(p)) and not s.alive(p.pid, ct(p) - 42.0)


def test_pidfd_opened_before_check_closes_the_reuse_race(children, monkeypatch) -> None:
    """The process dies (and is reaped, so its pid could be reused) between verification and
    the signal: the pidfd still refers to the dead process, so nothing else is hit."""
    p = spawn()
    children.append(p)
    s = ProcessSignaller()
    real_check = s._check

    def check_then_die(pid, create_time, policy):
        out = real_check(pid, create_time, policy)
        p.kill()
        p.wait(timeout=5)
        return out

    monkeypatch.setattr(s, "_check", check_then_die)
    out = s.send(p.pid, ct(p), signal.SIGTERM, POLICY)
    assert out.status == "gone"


@pytest.mark.parametrize("pid", [1, os.getpid(), os.getppid()], ids=["init", "agent", "parent"])
def test_init_agent_and_parent_are_never_signalled(pid: int) -> None:
    out = ProcessSignaller().send(pid, psutil.Process(pid).create_time(), signal.SIGTERM, POLICY)
    assert out.status == "refused"


def test_root_process_is_never_signalled(children) -> None:
    p = spawn(user=None)
    children.append(p)
    out = ProcessSignaller().send(p.pid, ct(p), signal.SIGKILL, POLICY)
    assert (out.status, "root" in out.detail) == ("refused", True)
    assert p.poll() is None


def test_system_account_is_never_signalled(children) -> None:
    p = spawn(user=1)  # daemon
    children.append(p)
    out = ProcessSignaller().send(p.pid, ct(p), signal.SIGKILL, POLICY)
    assert out.status == "refused" and "system account uid 1" in out.detail
    assert p.poll() is None


def test_exempt_user_and_exempt_name_are_never_signalled(children) -> None:
    p = spawn()
    children.append(p)
    s = ProcessSignaller()
    assert s.send(p.pid, ct(p), signal.SIGKILL, HostPolicy(exempt_users=["nobody"])).status == "refused"
    assert s.send(p.pid, ct(p), signal.SIGKILL, HostPolicy(exempt_process_names=["sleep"])).status == "refused"
    time.sleep(0.1)
    assert p.poll() is None


def test_missing_create_time_cannot_be_reidentified(children) -> None:
    p = spawn()
    children.append(p)
    out = ProcessSignaller().send(p.pid, None, signal.SIGKILL, POLICY)
    assert out.status == "refused" and "cannot re-identify" in out.detail


def test_zombie_and_reaped_processes_are_gone(children) -> None:
    p = spawn()
    children.append(p)
    created = ct(p)
    os.kill(p.pid, signal.SIGKILL)  # dies, but is not reaped yet: a zombie
    deadline = time.monotonic() + 5
    while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    s = ProcessSignaller()
    assert s.verify(p.pid, created, POLICY).status == "gone"
    assert not s.alive(p.pid, created)
    p.wait(timeout=5)
    assert s.send(p.pid, created, signal.SIGTERM, POLICY).status == "gone"
    assert not s.alive(p.pid, created)
