"""Process identity that does not move with the wall clock, and verified system executables.

A process is identified by its pid, its start time in clock ticks since boot (field 22 of
``/proc/PID/stat``) and the boot id (``/proc/sys/kernel/random/boot_id``). psutil's
``create_time()`` adds the boot time derived from the wall clock, so it moves when the clock
is stepped; the tick count never does, and the boot id tells a reused pid after a reboot
apart. :func:`identify` is the one function the owner cache, the finding keys and the
re-identification before a signal use.

:func:`verified_exe` decides whether a process runs a system binary of the host: the target
of ``/proc/PID/exe`` (not the name the process chose, which ``exec -a`` or ``prctl`` set to
anything) is a file owned by root and not writable by group or others, in a directory chain
with the same property, seen through the process's own root, and the process shares the
host's mount namespace (so the file is on the host's filesystem, not in a container image).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_BOOT_ID: dict[str, str | None] = {}


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """One process for as long as it lives: ``pid``, ``start_ticks`` (clock ticks after boot,
    ``/proc/PID/stat`` field 22) and ``boot_id`` (a UUID string, ``""`` where unreadable)."""

    pid: int
    start_ticks: int
    boot_id: str

    @property
    def token(self) -> str:
        """``<start_ticks>@<boot_id>``: the pid-free part, used in finding keys and state files."""
        return f"{self.start_ticks}@{self.boot_id}"


def stat_fields(text: str) -> tuple[str, str, int]:
    """``(comm, state, start_ticks)`` from the contents of ``/proc/PID/stat`` (fields 2, 3 and
    22).

    ``comm`` (field 2) is in parentheses and may itself contain spaces and ``)``: the fields
    after it start after the *last* ``)``. Raises ``ValueError`` on malformed input.
    """
    open_at = text.find("(")
    close_at = text.rfind(")")
    if open_at < 0 or close_at < open_at:
        raise ValueError("no (comm) in stat line")
    rest = text[close_at + 1 :].split()
    # rest[0] is field 3 (state); field 22 (starttime) is rest[19]
    if len(rest) < 20:
        raise ValueError(f"stat line has {len(rest) + 2} fields, expected at least 22")
    return text[open_at + 1 : close_at], rest[0], int(rest[19])


def parse_stat(text: str) -> tuple[str, int]:
    """``(comm, start_ticks)`` from the contents of ``/proc/PID/stat`` (see :func:`stat_fields`)."""
    comm, _state, ticks = stat_fields(text)
    return comm, ticks


def boot_id(proc: Path = PROC) -> str:
    """The kernel's boot id (read once per ``proc`` root); ``""`` when it cannot be read."""
    key = str(proc)
    if key not in _BOOT_ID:
        try:
            _BOOT_ID[key] = (proc / "sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            _BOOT_ID[key] = ""
    return _BOOT_ID[key] or ""


def read_stat(pid: int, proc: Path = PROC) -> str:
    """The contents of ``/proc/PID/stat`` (under ``proc``); raises ``OSError`` when unreadable.

    The path is a plain string: ``pathlib`` interns every part of a path it parses
    (``sys.intern``, CPython 3.11), so each new pid's string went into the interpreter's
    table of interned strings and left a deleted slot there when freed. Once the slots ran
    out, the table was rebuilt at twice its size: in ``bench/agent_memory.py`` (a process
    replaced every 25 polls) a 0.9 MiB table became a 1.9 MiB one within 1,000 polls, RSS
    that never came back.
    """
    with open(f"{proc}/{pid}/stat", encoding="utf-8", errors="replace") as fh:
        return fh.read()


def identify(pid: int, proc: Path = PROC) -> ProcessIdentity | None:
    """The identity of ``pid`` now, or ``None`` when it does not exist or cannot be read."""
    try:
        text = read_stat(pid, proc)
        _, ticks = parse_stat(text)
    except (OSError, ValueError):
        return None
    return ProcessIdentity(pid=pid, start_ticks=ticks, boot_id=boot_id(proc))


def _ns(path: Path | str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def host_mount_ns(proc: Path = PROC) -> str | None:
    """The host's mount namespace: pid 1's where readable, else the agent's own (an agent
    installed on the host as the systemd unit runs in it)."""
    return _ns(proc / "1/ns/mnt") or _ns(proc / "self/ns/mnt")


def _root_owned(st: os.stat_result) -> bool:
    return st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def verified_exe(pid: int, proc: Path = PROC, *, host_ns: str | None = None) -> str | None:
    """The executable path of ``pid`` when it is a verified system binary of the host, else ``None``.

    Verified: the process is in the host's mount namespace (``host_ns``, default
    :func:`host_mount_ns`); ``/proc/PID/exe`` is an existing regular file owned by root and
    not writable by group or others; so is every directory above it (checked through
    ``/proc/PID/root``). Never raises.
    """
    base = f"{proc}/{pid}"  # a string, not a Path: see read_stat
    host_ns = host_ns or host_mount_ns(proc)
    mnt = _ns(f"{base}/ns/mnt")
    if host_ns is None or mnt is None or mnt != host_ns:
        return None
    try:
        target = os.readlink(f"{base}/exe")
        st = os.stat(f"{base}/exe")
    except OSError:
        return None
    if target.endswith(" (deleted)") or not target.startswith("/") or not stat.S_ISREG(st.st_mode) or not _root_owned(st):
        return None
    root = f"{base}/root"
    parent = target
    while parent != "/":  # every directory above the file, "/" last, seen through the process's root
        parent = os.path.dirname(parent)
        try:
            pst = os.stat(root + parent if parent != "/" else root)
        except OSError:
            return None
        if not _root_owned(pst):
            return None
    return target


__all__ = ["ProcessIdentity", "boot_id", "host_mount_ns", "identify", "parse_stat", "read_stat", "verified_exe"]
