"""Notices on the host: what to tell the offender, and writing it to their terminals.

:func:`compose_message` builds the text of a notice from a finding, the snapshot's devices
and the cached reservation table: which GPU (index, UUID, bus id), which process (pid,
command), whose reservation until when, and how to fix it (the offender's own reserved
device if they hold one, a device free right now, the reserve command and the booking URL).
Devices are always named by UUID and bus id, never by index alone: CUDA may number GPUs
differently from NVML, so an index alone can point at the wrong card.

:class:`TerminalNotifier` writes a notice the way ``write(1)`` does, to every terminal session
of the recipient: ttys from ``psutil.users()`` (utmp) and the controlling terminals of the
recipient's processes (which also finds ``tmux``/``screen`` panes and sessions that never
touched utmp). Each terminal is opened ``O_WRONLY | O_NOCTTY | O_NONBLOCK`` and written once;
a terminal that cannot be opened or would block is skipped, never waited for. Only
character devices under ``/dev/pts/`` and ``/dev/tty<N>`` are written. Text taken from
processes (command lines) is stripped of control characters so a crafted command cannot
inject terminal escapes.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Protocol

import psutil

from agent.policy import as_utc, entitled, exemption, is_active, owner_known
from agent.schema import DeviceReport, HostPolicy, NoticeReport, ProcessReport, ReservationEntry
from agent.textsafe import terminal_text

log = logging.getLogger(__name__)

_TTY_PATH = re.compile(r"^/dev/(pts/\d+|tty\d+)$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_MESSAGE_CHARS = 2048


def sanitize(text: str | None, limit: int = 200) -> str:
    """``text`` without control characters (no escape sequences), cut to ``limit`` chars."""
    if not text:
        return ""
    clean = _CONTROL.sub("?", text).replace("\n", " ")
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def _fmt_time(t: datetime | None) -> str:
    return as_utc(t).strftime("%Y-%m-%d %H:%M UTC") if t else "?"


def describe_device(uuid: str, devices: dict[str, DeviceReport]) -> str:
    """``GPU 1 NVIDIA GeForce RTX 3090 (UUID GPU-2222…, bus 00000000:02:00.0)``; a MIG
    instance names its profile, GI and parent GPU; an unknown device its UUID only."""
    d = devices.get(uuid)
    if d is None:
        return f"device UUID {uuid}"
    if d.parent_uuid:
        parent = devices.get(d.parent_uuid)
        where = f"GPU {parent.index}" if parent is not None and parent.index is not None else f"GPU {d.parent_uuid}"
        prof = f" {d.mig_profile}" if d.mig_profile else ""
        gi = f" GI {d.gpu_instance_id}" if d.gpu_instance_id is not None else ""
        bus = d.pci_bus_id or (parent.pci_bus_id if parent is not None else None)
        return f"MIG{prof}{gi} of {where} (UUID {d.uuid}, bus {bus or 'n/a'})"
    idx = f"GPU {d.index}" if d.index is not None else "GPU"
    name = f" {d.name}" if d.name else ""
    return f"{idx}{name} (UUID {d.uuid}, bus {d.pci_bus_id or 'n/a'})"


def free_devices(
    devices: Sequence[DeviceReport],
    processes: Sequence[ProcessReport],
    reservations: Sequence[ReservationEntry],
    policy: HostPolicy,
    *,
    now: datetime,
    open_devices: Iterable[str] = (),
) -> list[DeviceReport]:
    """Devices nobody holds now and nobody uses now, healthy, in index order.

    A device is busy when it (or its parent GPU, or one of its MIG instances) has an active
    reservation, or shows a process that is not exempt (display servers and other exempt
    processes do not make a GPU busy), or a process of unknown owner. A GPU in MIG mode
    with instances is represented by its instances. Open devices count as free when unused.
    """
    children: dict[str, list[str]] = {}
    for d in devices:
        if d.parent_uuid:
            children.setdefault(d.parent_uuid, []).append(d.uuid)
    used: set[str] = set()
    for p in processes:
        if not owner_known(p) or exemption(p, policy) is None:
            used.add(p.device_uuid)
    reserved: set[str] = set()
    for r in reservations:
        if is_active(r, now):
            reserved.update(r.device_uuids)
    out: list[DeviceReport] = []
    for d in devices:
        if d.health != "ok" or d.processes_status != "ok":
            continue
        if d.uuid in children:
            continue
        span = {d.uuid, *([d.parent_uuid] if d.parent_uuid else []), *children.get(d.uuid, [])}
        if span & reserved:
            continue
        # a MIG sibling's reservation does not block this instance; a used parent would
        if span & used:
            continue
        out.append(d)
    return sorted(out, key=lambda d: (d.index if d.index is not None else 1 << 30, d.uuid))


def compose_message(
    *,
    kind: str,
    host: str,
    device_uuid: str,
    devices: Sequence[DeviceReport],
    reservations: Sequence[ReservationEntry],
    policy: HostPolicy,
    now: datetime,
    unix_user: str | None,
    pid: int | None = None,
    command: str | None = None,
    reservation_id: int | None = None,
    holder: str | None = None,
    free: Sequence[DeviceReport] = (),
    booking_url: str | None = None,
    sigterm_at: datetime | None = None,
) -> str:
    """The notice for the offender (for ``idle``, ``unattributed``, ``unknown_uid``: for the holder), plain text, at most
    :data:`MAX_MESSAGE_CHARS` characters. Lines end in ``\\n``; :class:`TerminalNotifier`
    converts them for raw terminals."""
    by_uuid = {d.uuid: d for d in devices}
    res = {r.id: r for r in reservations}
    dev = describe_device(device_uuid, by_uuid)
    lines = [f"gpuroster on {host}, {_fmt_time(now)}:"]
    proc = f"process {pid}" + (f" ({sanitize(command, 160)})" if command else "") + (f" of {unix_user}" if unix_user else "")
    r = res.get(reservation_id) if reservation_id is not None else None
    if kind == "foreign":
        until = f" until {_fmt_time(r.end)}" if r else ""
        lines.append(f"Your {proc} is running on {dev},")
        lines.append(f"which is reserved by {holder or '?'} (reservation {reservation_id}){until}.")
    elif kind == "overrun":
        ended = f" ended at {_fmt_time(r.end)}" if r else " has ended"
        lines.append(f"Your {proc} is still running on {dev};")
        lines.append(f"your reservation {reservation_id}{ended}.")
    elif kind == "idle":
        until = f" (until {_fmt_time(r.end)})" if r else ""
        lines.append(f"Your reservation {reservation_id}{until} of {dev}")
        lines.append(
            f"has shown no process of yours and under {policy.idle_utilization_pct:g}% utilization "
            f"for {policy.idle_minutes} min. Please release it if you do not need it."
        )
    elif kind in ("unattributed", "unknown_uid"):
        whose = "in a container whose owner gpuroster cannot find" if kind == "unattributed" else (
            "of a uid unknown to gpuroster")
        lines.append(f"A {proc} {whose} is running on {dev}" + (f", which you hold (reservation {reservation_id})." if holder else "."))
        lines.append("The lab's admins have been told; nothing is signalled until its owner is known.")
    else:
        lines.append(f"Your {proc} is running on {dev},")
        lines.append("which you have not reserved.")
    if kind in ("unattributed", "unknown_uid"):
        pass
    elif kind != "idle":
        own = [
            x for x in reservations
            if is_active(x, now) and entitled(x, unix_user) and device_uuid not in x.device_uuids
        ]
        for x in own[:3]:
            names = ", ".join(describe_device(u, by_uuid) for u in x.device_uuids[:4])
            uuids = ",".join(x.device_uuids[:8])
            lines.append(f"You hold reservation {x.id} until {_fmt_time(x.end)} on: {names}.")
            lines.append(f"  Run there with CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={uuids}")
        if not own and free:
            names = "; ".join(describe_device(d.uuid, by_uuid) for d in free[:3])
            lines.append(f"Free right now: {names}.")
        lines.append(f"To fix: stop the process, or reserve a device: gpuroster reserve -n 1 --for 4h --host {host}")
    if booking_url:
        lines.append(f"Book or release: {booking_url}")
    if kind not in ("idle", "unattributed", "unknown_uid"):
        if policy.policy == "terminate" and sigterm_at is not None:
            lines.append(f"Host policy 'terminate': the process will get SIGTERM at {as_utc(sigterm_at).strftime('%H:%M:%S UTC')}.")
        elif policy.policy == "terminate":
            lines.append("Host policy 'terminate': the process will be ended.")
    text = "\n".join(lines)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def compose_holder_message(
    *,
    host: str,
    device_uuid: str,
    devices: Sequence[DeviceReport],
    reservation: ReservationEntry | None,
    now: datetime,
    offender: str | None,
    pid: int | None,
    command: str | None,
) -> str:
    """The note to the rightful holder of a device occupied by a ``foreign`` process (for example
    the previous holder's job still running after their reservation ended)."""
    dev = describe_device(device_uuid, {d.uuid: d for d in devices})
    rid = f" (reservation {reservation.id}, until {_fmt_time(reservation.end)})" if reservation else ""
    cmd = f" ({sanitize(command, 120)})" if command else ""
    return (
        f"gpuroster on {host}, {_fmt_time(now)}:\n"
        f"Your reserved {dev}{rid} is occupied by {offender or '?'}'s process {pid}{cmd}.\n"
        f"{offender or 'The owner'} has been told."
    )


# ------------------------------------------------------------------------------------------
# terminals


def _tty_path(name: str | None) -> str | None:
    if not name:
        return None
    path = name if name.startswith("/dev/") else f"/dev/{name}"
    return path if _TTY_PATH.match(path) else None


def terminal_map() -> dict[int, str]:
    """Device number (``st_rdev``) -> path of every terminal that exists now
    (``/dev/pts/N``, ``/dev/ttyN``), read afresh on each call.

    psutil's ``Process.terminal()`` resolves through a map it builds once per process
    (``get_terminal_map`` in ``psutil._psposix`` is memoised), so in a long-running agent
    every pseudo-terminal opened after the first lookup (a new ssh session, tmux pane or
    container console) would resolve to nothing and its user would never see a notice.
    """
    out: dict[int, str] = {}
    for path in glob.glob("/dev/pts/[0-9]*") + glob.glob("/dev/tty[0-9]*"):
        try:
            out[os.stat(path).st_rdev] = path
        except OSError:
            continue
    return out


def controlling_tty(pid: int) -> int:
    """The device number of ``pid``'s controlling terminal (``tty_nr``, field 7 of
    ``/proc/PID/stat``, counted after the command name's closing parenthesis); 0 for none
    or when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[4])
    except (OSError, IndexError, ValueError):
        return 0


def discover_terminals(unix_user: str, pids: Iterable[int] = ()) -> set[str]:
    """Terminal device paths of ``unix_user``: utmp sessions and the controlling terminals
    of the user's processes and of ``pids`` (resolved against :func:`terminal_map`, read
    now). Never raises for vanished processes."""
    found: set[str] = set()
    try:
        for u in psutil.users():
            if u.name == unix_user and (path := _tty_path(u.terminal)):
                found.add(path)
    except (OSError, psutil.Error) as e:
        log.debug("psutil.users() failed: %s", e)
    wanted = set(pids)
    ttys: dict[int, str] | None = None
    for proc in psutil.process_iter(["username"]):
        try:
            info = proc.info
        except psutil.Error:
            continue
        if info.get("username") == unix_user or proc.pid in wanted:
            tty = controlling_tty(proc.pid)
            if tty:
                ttys = terminal_map() if ttys is None else ttys
                if path := _tty_path(ttys.get(tty)):
                    found.add(path)
    return found


def write_terminal(path: str, text: str) -> tuple[bool, str]:
    """Write ``text`` to the terminal ``path`` without blocking; ``(written, detail)``.

    Only ``/dev/pts/N`` and ``/dev/ttyN`` character devices are written. Never raises.
    """
    if not _TTY_PATH.match(path):
        return False, f"{path}: not a terminal path"
    data = text.replace("\r\n", "\n").replace("\n", "\r\n").encode("utf-8", "replace")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as e:
        return False, f"{path}: {e.strerror}"
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            return False, f"{path}: not a character device"
        written = 0
        while written < len(data):
            try:
                n = os.write(fd, data[written:])
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return written > 0, f"{path}: would block after {written} bytes"
                return written > 0, f"{path}: {e.strerror}"
            if n <= 0:
                break
            written += n
        return True, path
    finally:
        os.close(fd)


class Notifier(Protocol):
    """What the enforcer needs from a notifier (injectable for tests)."""

    def notify(
        self, *, recipient: str, pids: Sequence[int], text: str, at: datetime, dry_run: bool = False
    ) -> NoticeReport: ...


class TerminalNotifier:
    """Writes notices to every terminal of the recipient (see the module docstring).

    ``discover(unix_user, pids) -> paths`` and ``write(path, text) -> (ok, detail)`` are
    injectable; the defaults are :func:`discover_terminals` and :func:`write_terminal`.
    """

    def __init__(
        self,
        *,
        discover: Callable[[str, Sequence[int]], Iterable[str]] = discover_terminals,
        write: Callable[[str, str], tuple[bool, str]] = write_terminal,
    ) -> None:
        self.discover = discover
        self.write = write

    def notify(
        self, *, recipient: str, pids: Sequence[int], text: str, at: datetime, dry_run: bool = False
    ) -> NoticeReport:
        """Write ``text`` to ``recipient``'s terminals; a :class:`NoticeReport` saying how many
        got it (``delivered``) and which failed (``detail``). With ``dry_run`` the terminals are
        found but not written (``delivered`` 0, ``detail`` lists them). Never raises."""
        # the bell is ours; everything from the service or a process is shown, never obeyed
        banner = f"\n\a*** Message from gpuroster to {terminal_text(recipient)} ***\n{terminal_text(text, keep_newlines=True)}\n"
        try:
            paths = sorted(set(self.discover(recipient, pids)))
        except Exception as e:  # noqa: BLE001 - discovery must never stop enforcement
            log.warning("terminal discovery for %s failed: %s", recipient, e)
            paths = []
        if dry_run:
            where = ", ".join(paths) if paths else "no terminal found"
            return NoticeReport(channel="terminal", recipient=recipient[:64], at=at, delivered=0,
                                detail=f"dry run: would write to {where}"[:2048])
        ok: list[str] = []
        failed: list[str] = []
        for path in paths:
            written, detail = self.write(path, banner)
            (ok if written else failed).append(path if written else detail)
        if ok:
            detail = "written to " + ", ".join(ok)
        else:
            detail = "no terminal of " + recipient + " found" if not paths else "no terminal writable"
        if failed:
            detail += "; skipped " + "; ".join(failed)
        return NoticeReport(channel="terminal", recipient=recipient[:64], at=at, delivered=len(ok), detail=detail[:2048])


__all__ = [
    "MAX_MESSAGE_CHARS",
    "Notifier",
    "TerminalNotifier",
    "compose_holder_message",
    "compose_message",
    "describe_device",
    "discover_terminals",
    "free_devices",
    "sanitize",
    "write_terminal",
]
