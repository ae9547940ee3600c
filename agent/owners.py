"""Who owns a GPU process: uid, Unix user, command line, start time and container id.

Lookups go through psutil and ``/proc/<pid>/cgroup``. A process that exits mid-lookup is
"exited", one that cannot be read is "access_denied" (AccessDenied, ``hidepid``), one the
agent cannot see because it runs outside the host PID namespace is "not_visible"; none of
them is ever attributed to anybody (``unix_user`` stays ``None``). Results are cached by
process identity (pid, start ticks since boot, boot id: :func:`agent.procid.identify`), so a
recycled pid is never mistaken for its predecessor and a clock step changes nothing.

Who a process is judged as: on the host, its passwd name (``owner_source`` ``passwd``); a uid
without a passwd entry (directory users the agent cannot resolve) keeps ``unix_user`` ``None``
with status ``uid_only``, for the service's uid table to name. In a container (a container id
in its cgroup), never its uid: the container's owner from the runtime
(:class:`agent.containers.ContainerDirectory`), or status ``unattributed`` when no rule names
one. ``exe`` is set only for a verified system executable of the host
(:func:`agent.procid.verified_exe`), the only ground for exempting a process as "system".
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil

from agent.containers import ContainerDirectory
from agent.procid import ProcessIdentity, identify, verified_exe
from agent.schema import OwnerStatus
from agent.telemetry import log, to_str

# A container id is 64 hex characters, as a whole path component or after a runtime prefix
# (docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope).
_CONTAINER_ID = re.compile(r"(?:^|[/\-:])([0-9a-f]{64})(?:\.scope)?(?=/|$)")


def container_id_from_cgroup(text: str | None) -> str | None:
    """The innermost container id in the contents of a ``/proc/<pid>/cgroup`` file, or ``None``.

    Handles cgroup v1 (``N:controllers:/path``) and v2 (``0::/path``), cgroupfs and systemd
    drivers, Docker, containerd, CRI-O, Podman and Kubernetes paths, and nested containers
    (the last id on the path is the innermost). Pod UIDs (``pod<uuid>``) are never returned;
    a ``/`` or a plain login session gives ``None``. Never raises, never returns ``""``.
    """
    if not text:
        return None
    best: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].strip()
        if "conmon" in path:  # podman's monitor process, not the container
            continue
        ids = _CONTAINER_ID.findall(path)
        if len(ids) > len(best):
            best = ids
    return best[-1] if best else None


@dataclass(slots=True)
class Owner:
    """Who runs a pid. ``create_time`` in seconds since the epoch (psutil ``create_time()``);
    ``identity`` the :attr:`ProcessIdentity.token`; ``user`` who it is judged as (see the module
    docstring); ``exe`` a verified system executable or ``None``."""

    status: OwnerStatus
    uid: int | None = None
    user: str | None = None
    name: str | None = None
    command: str | None = None
    create_time: float | None = None
    container_id: str | None = None
    identity: str | None = None
    container_name: str | None = None
    container_image: str | None = None
    owner_source: str | None = None
    exe: str | None = None


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _read_cgroup(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


@dataclass(slots=True)
class NamespaceCheck:
    """Start-up view of the agent's place on the host: PID namespace and ``/proc`` options."""

    host_pid_ns: bool | None
    hidepid: bool
    is_root: bool
    warnings: list[str]


def check_environment(proc: Path = Path("/proc"), *, euid: int | None = None) -> NamespaceCheck:
    """Compare ``/proc/self/ns/pid`` with ``/proc/1/ns/pid`` and look for ``hidepid``: in a
    foreign PID namespace or behind ``hidepid`` the agent cannot attribute processes.

    ``host_pid_ns`` is ``None`` when it cannot be told (``/proc/1/ns/pid`` unreadable without
    root); it is then ``False`` only if pid 1 looks like a container init. ``euid``: the
    agent's effective uid (default ``os.geteuid()``).
    """
    warnings: list[str] = []
    is_root = (os.geteuid() if euid is None else euid) == 0
    host: bool | None
    try:
        host = os.readlink(proc / "self/ns/pid") == os.readlink(proc / "1/ns/pid")
    except OSError:
        host = None
    if host is None:
        # Without root, /proc/1/ns is unreadable: in a private namespace pid 1 is our own
        # entry point (a shell, tini, python), on the host it is an init system.
        try:
            comm = (proc / "1/comm").read_text().strip()
            host = comm in ("systemd", "init", "launchd", "openrc-init", "runit", "s6-svscan") or None
        except OSError:
            host = None
    if host is False:
        warnings.append(
            "cannot attribute processes: run with host PID namespace (docker --pid=host, hostPID: true); "
            "GPU processes are reported as owner unknown (not visible)"
        )
    hidepid = False
    try:
        for line in (proc / "mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 4 and fields[1] == str(proc) and re.search(r"hidepid=(2|invisible|1|noaccess)", fields[3]):
                hidepid = True
    except OSError:
        pass
    if hidepid and not is_root:
        warnings.append(
            "/proc is mounted with hidepid: run the agent as root or in the hidepid gid group, "
            "otherwise other users' GPU processes are reported as owner unknown (access denied)"
        )
    for w in warnings:
        log.warning("%s", w)
    return NamespaceCheck(host_pid_ns=host, hidepid=hidepid, is_root=is_root, warnings=warnings)


class OwnerResolver:
    """Resolve pids to owners with psutil, caching by process identity.

    :param hide_args: report the executable only, never its arguments.
    :param host_pid_ns: ``False`` when the agent is known to run outside the host PID
        namespace: unresolvable pids are then "not_visible" rather than "exited".
    :param hidepid: ``/proc`` hides other users' processes: unresolvable pids are "access_denied".
    :param containers: the container runtimes' directory; ``None``: no runtime is asked and
        every container process is "unattributed".
    :param identify_process: pid -> :class:`ProcessIdentity` or ``None`` (tests inject it).
    :param exe_check: pid -> verified system executable path or ``None``.
    """

    def __init__(
        self,
        *,
        hide_args: bool = False,
        host_pid_ns: bool | None = True,
        hidepid: bool = False,
        process_factory: Callable[[int], Any] = psutil.Process,
        user_lookup: Callable[[int], str | None] = _user_name,
        cgroup_reader: Callable[[int], str | None] = _read_cgroup,
        containers: ContainerDirectory | None = None,
        identify_process: Callable[[int], ProcessIdentity | None] = identify,
        exe_check: Callable[[int], str | None] = verified_exe,
    ) -> None:
        self.hide_args = hide_args
        self.host_pid_ns = host_pid_ns
        self.hidepid = hidepid
        self._process = process_factory
        self._user_lookup = user_lookup
        self._cgroup = cgroup_reader
        self.containers = containers
        self._identify = identify_process
        self._exe = exe_check
        self._cache: dict[tuple[int, str], Owner] = {}
        self._users: dict[int, str | None] = {}
        self._seen: set[tuple[int, str]] = set()

    def _gone(self) -> OwnerStatus:
        if self.host_pid_ns is False:
            return "not_visible"
        if self.hidepid:
            return "access_denied"
        return "exited"

    def resolve(self, pid: int) -> Owner:
        """The owner of ``pid`` now; never raises for vanished or unreadable processes."""
        ident = self._identify(pid)
        token = ident.token if ident is not None else None
        if token is not None:
            cached = self._cache.get((pid, token))
            if cached is not None:
                self._seen.add((pid, token))
                if cached.status == "unattributed" and self.containers is not None:
                    # ask again (the directory's own cache bounds how often): the runtime may
                    # have been down, or the container too new, when the process was first seen
                    cached.status = "ok"
                    self._container_owner(cached)
                return cached
        try:
            proc = self._process(pid)
            create_time = float(proc.create_time())
        except psutil.NoSuchProcess:
            return Owner(status=self._gone())
        except psutil.AccessDenied:
            return Owner(status="access_denied")
        except (OSError, ValueError):
            return Owner(status=self._gone())
        # without /proc/PID/stat (another /proc view) psutil's start time is the only handle
        key = (pid, token or f"ct{create_time:.2f}")
        self._seen.add(key)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        try:
            uid = int(proc.uids().real)
            name = to_str(proc.name(), "process name") or "(unnamed)"
            try:
                argv = proc.cmdline()
            except psutil.AccessDenied:
                argv = []
            argv = [to_str(a, "command line") or "" for a in argv]
            if self.hide_args:
                command = argv[0] if argv else None
            else:
                command = " ".join(argv) if argv else None
        except psutil.NoSuchProcess:
            return Owner(status="exited", create_time=create_time)
        except psutil.AccessDenied:
            return Owner(status="access_denied", create_time=create_time)
        except (OSError, ValueError):
            return Owner(status="exited", create_time=create_time)
        if uid not in self._users:
            self._users[uid] = self._user_lookup(uid)
        owner = Owner(
            status="ok",
            uid=uid,
            user=self._users[uid],
            name=name[:256],
            command=command[:4096] if command else None,
            create_time=create_time,
            container_id=container_id_from_cgroup(self._cgroup(pid)),
            identity=token,
        )
        if owner.container_id:
            self._container_owner(owner)
        else:
            owner.exe = self._exe(pid)
            if owner.user is None:
                owner.status = "uid_only"
            else:
                owner.owner_source = "passwd"
        self._cache[key] = owner
        return owner

    def _container_owner(self, owner: Owner) -> None:
        """Judge a container process by its container's owner, never by its uid."""
        assert owner.container_id is not None
        owner.user = None
        if self.containers is None:
            owner.status = "unattributed"
            return
        info = self.containers.lookup(owner.container_id)
        owner.container_name = info.name
        owner.container_image = info.image
        if info.owner:
            owner.user, owner.owner_source = info.owner, info.owner_source
        else:
            owner.status = "unattributed"

    def end_poll(self) -> None:
        """Forget owners of processes not seen since the previous call (keeps the cache small)."""
        self._cache = {k: v for k, v in self._cache.items() if k in self._seen}
        self._seen = set()
