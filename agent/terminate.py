"""Signalling a process safely: re-identify, refuse the untouchable, close the pid-reuse race.

Before every signal the process is re-identified by its identity (pid, start ticks since boot,
boot id: :func:`agent.procid.identify`), which a clock step does not move; a finding without
one (replay, an older state file) falls back to psutil's ``create_time``. Where the kernel
offers pidfds (Linux 5.3+, Python 3.9+) the order is: open a pidfd for the
pid, *then* verify the identity and ownership, then send the signal through the pidfd. A
pidfd keeps referring to the process it was opened for, so if the pid is reused after the
check the signal fails with ``ESRCH`` instead of hitting a stranger. Without pidfds the agent
falls back to ``os.kill`` right after the check (a window of microseconds, logged once).

Never signalled, whatever the finding says (the live process is checked, not the report):
pid 1 and below, the agent itself (and its parent), a process whose identity is unknown or
differs (pid reused), root and system accounts of the host (real or effective uid below
``policy.min_uid``, outside containers: root inside a container is the container owner's),
users in ``policy.exempt_users``, and verified system executables
(:func:`agent.procid.verified_exe`) whose base name is in ``policy.exempt_process_names``.
The name a process gave itself protects nothing. Zombies count as gone.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import Literal, Protocol

import psutil

from agent.owners import container_id_from_cgroup
from agent.procid import identify, verified_exe
from agent.schema import HostPolicy

log = logging.getLogger(__name__)

#: Two create_time readings of the same process agree to psutil's 10 ms resolution; this
#: tolerance (seconds) absorbs float rounding in the state file and on the wire.
CREATE_TIME_TOLERANCE_S = 0.05

OutcomeStatus = Literal["ok", "sent", "gone", "reused", "refused", "failed"]


@dataclass(frozen=True, slots=True)
class SignalOutcome:
    """Result of :meth:`ProcessSignaller.verify` (``ok``) or :meth:`ProcessSignaller.send`.

    ``sent``: delivered; ``gone``: no such process (or a zombie); ``reused``: the pid now
    belongs to another process; ``refused``: a protected process or one that cannot be
    re-identified; ``failed``: the kernel refused (``detail`` says why).
    """

    status: OutcomeStatus
    detail: str


#: How a finding names its process: the identity token ``<start ticks>@<boot id>`` (a
#: ``str``), or psutil's ``create_time`` (a ``float``) where no identity was taken.
ProcessRef = str | float | None


class Signaller(Protocol):
    """What the enforcer needs from a signaller (injectable for tests)."""

    def verify(self, pid: int, ref: ProcessRef, policy: HostPolicy) -> SignalOutcome: ...

    def send(self, pid: int, ref: ProcessRef, sig: int, policy: HostPolicy) -> SignalOutcome: ...

    def alive(self, pid: int, ref: ProcessRef) -> bool: ...


def _in_container(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            return container_id_from_cgroup(fh.read()) is not None
    except OSError:
        return False


def _same(pid: int, proc: psutil.Process, ref: ProcessRef) -> str | None:
    """``None`` when ``proc`` is the process ``ref`` names, else why not."""
    if isinstance(ref, str):
        now = identify(pid)
        if now is None:
            raise psutil.NoSuchProcess(pid)
        if now.token != ref:
            return f"pid {pid} is now {now.token}, expected {ref}: pid reused"
        return None
    assert ref is not None
    actual = proc.create_time()
    if abs(actual - ref) > CREATE_TIME_TOLERANCE_S:
        return f"pid {pid} now has create_time {actual:.2f}, expected {ref:.2f}: pid reused"
    return None


class ProcessSignaller:
    """Signals processes on this host after re-identifying them (see the module docstring).

    ``protected_pids``: extra pids never to signal (the agent's own pid and its parent's are
    always protected). ``use_pidfd``: ``None`` detects support; ``False`` forces ``os.kill``.
    """

    def __init__(self, *, protected_pids: set[int] | None = None, use_pidfd: bool | None = None) -> None:
        self.protected = {os.getpid(), os.getppid(), *(protected_pids or set())}
        if use_pidfd is None:
            use_pidfd = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
        self.use_pidfd = use_pidfd
        self._warned_fallback = False

    def _check(self, pid: int, ref: ProcessRef, policy: HostPolicy) -> SignalOutcome:
        if pid <= 1:
            return SignalOutcome("refused", f"pid {pid} is never signalled")
        if pid in self.protected:
            return SignalOutcome("refused", f"pid {pid} is the agent or its parent")
        if ref is None or ref == "":
            return SignalOutcome("refused", f"pid {pid}: no identity, cannot re-identify")
        try:
            proc = psutil.Process(pid)
            other = _same(pid, proc, ref)
            if other is not None:
                return SignalOutcome("reused", other)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return SignalOutcome("gone", f"pid {pid} is a zombie (already exited)")
            uids = proc.uids()
            username = proc.username()
        except psutil.NoSuchProcess:
            return SignalOutcome("gone", f"pid {pid} no longer exists")
        except psutil.AccessDenied as e:
            return SignalOutcome("refused", f"pid {pid}: cannot read its identity ({e})")
        uid = min(uids.real, uids.effective)
        contained = _in_container(pid)
        if not contained:
            if uid == 0 or username == "root":
                return SignalOutcome("refused", f"pid {pid} is owned by root")
            if uid < policy.min_uid:
                return SignalOutcome("refused", f"pid {pid} is owned by system account uid {uid} (< {policy.min_uid})")
            if username in policy.exempt_users:
                return SignalOutcome("refused", f"pid {pid} is owned by exempt user {username}")
            exe = verified_exe(pid)
            if exe is not None and os.path.basename(exe) in policy.exempt_process_names:
                return SignalOutcome("refused", f"pid {pid} is exempt system executable {exe}")
        where = ", in a container" if contained else ""
        return SignalOutcome("ok", f"pid {pid} verified (identity {ref}, user {username}, uid {uid}{where})")

    def verify(self, pid: int, ref: ProcessRef, policy: HostPolicy) -> SignalOutcome:
        """Re-identify ``pid`` and apply the protections, without signalling (dry run)."""
        return self._check(pid, ref, policy)

    def send(self, pid: int, ref: ProcessRef, sig: int, policy: HostPolicy) -> SignalOutcome:
        """Send ``sig`` (e.g. ``signal.SIGTERM``) to the process ``ref`` names on ``pid``.

        Never raises for a missing or protected process; returns the outcome instead.
        """
        pidfd: int | None = None
        if self.use_pidfd and pid > 1 and pid not in self.protected:
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                return SignalOutcome("gone", f"pid {pid} no longer exists")
            except OSError as e:  # ENOSYS in old kernels / seccomp: fall back
                if not self._warned_fallback:
                    log.warning("pidfd_open unavailable (%s); falling back to kill(2) after re-identification", e)
                    self._warned_fallback = True
        try:
            check = self._check(pid, ref, policy)
            if check.status != "ok":
                return check
            try:
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                return SignalOutcome("gone", f"pid {pid} exited before the signal")
            except OSError as e:
                return SignalOutcome("failed", f"signal {signal.Signals(sig).name} to pid {pid} failed: {e}")
            via = "pidfd" if pidfd is not None else "kill(2)"
            return SignalOutcome("sent", f"{signal.Signals(sig).name} sent to pid {pid} via {via}; {check.detail}")
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def alive(self, pid: int, ref: ProcessRef) -> bool:
        """True while the very process ``ref`` names on ``pid`` exists and is not a zombie."""
        try:
            proc = psutil.Process(pid)
            if ref is not None and ref != "" and _same(pid, proc, ref) is not None:
                return False
            return proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True


__all__ = ["CREATE_TIME_TOLERANCE_S", "ProcessRef", "ProcessSignaller", "SignalOutcome", "Signaller"]
