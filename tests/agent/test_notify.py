"""Notices: message composition, free devices, and writing to real pseudo-terminals."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import termios
import time
from datetime import UTC, datetime, timedelta

import psutil
import pytest

from agent.notify import (
    TerminalNotifier,
    compose_holder_message,
    compose_message,
    describe_device,
    discover_terminals,
    free_devices,
    sanitize,
    write_terminal,
)
from agent.schema import DeviceReport, HostPolicy, ProcessReport, ReservationEntry

NOW = datetime(2025, 3, 10, 11, 0, tzinfo=UTC)
H100 = "GPU-H1000000-0000-0000-0000-000000000000"
MIG2 = "MIG-22222222-2222-2222-2222-222222222222"
MIG3 = "MIG-33333333-3333-3333-3333-333333333333"
G0 = "GPU-00000000-0000-0000-0000-000000000000"
G1 = "GPU-11111111-1111-1111-1111-111111111111"
DEVICES = [
    DeviceReport(uuid=G0, index=0, name="Tesla T4", pci_bus_id="00000000:3B:00.0"),
    DeviceReport(uuid=G1, index=1, name="Tesla T4", pci_bus_id="00000000:5E:00.0"),
    DeviceReport(uuid=H100, index=2, name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:86:00.0", mig_mode=True),
    DeviceReport(uuid=MIG2, index=0, parent_uuid=H100, gpu_instance_id=2, mig_profile="3g.40gb"),
    DeviceReport(uuid=MIG3, index=1, parent_uuid=H100, gpu_instance_id=3, mig_profile="2g.20gb"),
]


def res(rid, user, devs, hours=(-1, 3)):
    return ReservationEntry(id=rid, user=user, unix_name=user, device_uuids=devs,
                            start=NOW + timedelta(hours=hours[0]), end=NOW + timedelta(hours=hours[1]))


def read_all(master: int, timeout: float = 1.0) -> bytes:
    data = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r, _, _ = select.select([master], [], [], 0.05)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        elif data:
            break
    return data


# ----------------------------------------------------------------------------------------
# composition


def test_describe_device_whole_gpu_mig_and_unknown() -> None:
    by = {d.uuid: d for d in DEVICES}
    assert describe_device(G0, by) == f"GPU 0 Tesla T4 (UUID {G0}, bus 00000000:3B:00.0)"
    assert describe_device(MIG2, by) == f"MIG 3g.40gb GI 2 of GPU 2 (UUID {MIG2}, bus 00000000:86:00.0)"
    assert describe_device("GPU-x", by) == "device UUID GPU-x"


def test_free_devices_b16_display_process_does_not_make_busy() -> None:
    policy = HostPolicy()
    procs = [
        ProcessReport(device_uuid=G0, pid=1357, type="G", unix_user="root", uid=0, name="Xorg", create_time=1.0,
                      exe="/usr/lib/xorg/Xorg"),
        ProcessReport(device_uuid=MIG2, pid=5, unix_user="user-a", uid=1001, create_time=1.0),
    ]
    free = free_devices(DEVICES, procs, [], policy, now=NOW)
    assert [d.uuid for d in free] == [G0, G1, MIG3]  # MIG parent listed through its instances
    free = free_devices(DEVICES, procs, [res(1, "user-b", [G1]), res(2, "user-c", [MIG3])], policy, now=NOW)
    assert [d.uuid for d in free] == [G0]
    unknown = [ProcessReport(device_uuid=G0, pid=9, owner_status="access_denied")]
    assert G0 not in [d.uuid for d in free_devices(DEVICES, unknown, [], policy, now=NOW)]
    lost = [DEVICES[0].model_copy(update={"health": "lost"})]
    assert free_devices(lost, [], [], policy, now=NOW) == []
    parent_reserved = free_devices(DEVICES, [], [res(3, "user-d", [H100])], policy, now=NOW)
    assert [d.uuid for d in parent_reserved] == [G0, G1]


@pytest.mark.parametrize(
    "kind,extra,needles",
    [
        ("unreserved", {}, ["which you have not reserved", "Free right now: GPU 1 Tesla T4"]),
        ("foreign", {"holder": "user-b", "reservation_id": 2},
         ["reserved by user-b (reservation 2) until 2025-03-10 14:00 UTC"]),
        ("overrun", {"reservation_id": 3}, ["your reservation 3 ended at 2025-03-10 10:00 UTC"]),
    ],
)
def test_process_messages_name_gpu_process_reservation_and_fix(kind, extra, needles) -> None:
    table = [res(2, "user-b", [G0]), res(3, "user-a", [G0], hours=(-3, -1))]
    text = compose_message(
        kind=kind, host="node-07", device_uuid=G0, devices=DEVICES, reservations=table, policy=HostPolicy(),
        now=NOW, unix_user="user-a", pid=31337, command="python train.py --lr 3e-4",
        free=[DEVICES[1]], booking_url="https://roster.lab/book", **extra,
    )
    for needle in ["process 31337 (python train.py --lr 3e-4) of user-a", f"GPU 0 Tesla T4 (UUID {G0}, bus 00000000:3B:00.0)",
                   "gpuroster reserve -n 1 --for 4h --host node-07", "https://roster.lab/book", *needles]:
        assert needle in text, (needle, text)
    assert "SIGTERM" not in text  # policy notify


def test_terminate_policy_announces_the_sigterm_time() -> None:
    text = compose_message(kind="unreserved", host="h", device_uuid=G0, devices=DEVICES, reservations=[],
                           policy=HostPolicy(policy="terminate"), now=NOW, unix_user="u", pid=1,
                           sigterm_at=NOW + timedelta(seconds=60))
    assert "the process will get SIGTERM at 11:01:00 UTC" in text


def test_own_reservation_elsewhere_is_offered_with_uuid_env() -> None:
    text = compose_message(kind="unreserved", host="h", device_uuid=G0, devices=DEVICES,
                           reservations=[res(9, "user-a", [G1, MIG3])], policy=HostPolicy(), now=NOW,
                           unix_user="user-a", pid=1, free=[DEVICES[1]])
    assert f"You hold reservation 9 until 2025-03-10 14:00 UTC on: GPU 1 Tesla T4 (UUID {G1}" in text
    assert f"CUDA_VISIBLE_DEVICES={G1},{MIG3}" in text
    assert "Free right now" not in text  # the user's own device is the fix


def test_idle_message_and_holder_message() -> None:
    text = compose_message(kind="idle", host="h", device_uuid=MIG2, devices=DEVICES, reservations=[res(4, "user-b", [MIG2])],
                           policy=HostPolicy(idle_minutes=45), now=NOW, unix_user="user-b", reservation_id=4,
                           holder="user-b", booking_url="https://x/b")
    assert "Your reservation 4 (until 2025-03-10 14:00 UTC) of MIG 3g.40gb GI 2 of GPU 2" in text
    assert "for 45 min" in text and "https://x/b" in text and "gpuroster reserve" not in text
    note = compose_holder_message(host="h", device_uuid=G0, devices=DEVICES, reservation=res(2, "user-b", [G0]),
                                  now=NOW, offender="user-a", pid=5101, command="python\x1b[31m x")
    assert "Your reserved GPU 0 Tesla T4" in note and "occupied by user-a's process 5101" in note
    assert "\x1b" not in note


def test_sanitize_and_length_limit() -> None:
    assert sanitize("a\x1b[2Jb\x07c\nd") == "a?[2Jb?c d"
    assert len(sanitize("x" * 500, 100)) == 100
    text = compose_message(kind="unreserved", host="h", device_uuid=G0, devices=DEVICES, reservations=[],
                           policy=HostPolicy(), now=NOW, unix_user="u", pid=1, command="y" * 5000,
                           booking_url="https://" + "z" * 3000)
    assert len(text) <= 2048


# ----------------------------------------------------------------------------------------
# terminals


@pytest.fixture
def pty():
    master, slave = os.openpty()
    yield master, slave, os.ttyname(slave)
    for fd in (master, slave):
        try:
            os.close(fd)
        except OSError:
            pass


def test_write_terminal_reaches_pty_with_crlf(pty) -> None:
    master, _, path = pty
    ok, detail = write_terminal(path, "line one\nline two\n")
    assert (ok, detail) == (True, path)
    assert b"line one\r\nline two\r\n" in read_all(master).replace(b"\r\r\n", b"\r\n")


def test_write_terminal_refuses_non_terminal_paths(tmp_path) -> None:
    f = tmp_path / "x"
    f.write_text("")
    for path in ("/etc/passwd", "/dev/null", str(f), "/dev/pts/../../etc/passwd"):
        ok, _ = write_terminal(path, "hi")
        assert not ok
    assert write_terminal("/dev/pts/99999", "hi") == (False, "/dev/pts/99999: No such file or directory")


def test_write_terminal_never_blocks_on_a_full_terminal(pty) -> None:
    _, _, path = pty  # nobody reads the master: the buffer fills
    t = time.monotonic()
    ok, detail = write_terminal(path, "x" * 2_000_000)
    assert time.monotonic() - t < 2.0
    assert "would block" in detail


def _nobody_with_terminal(slave: int) -> subprocess.Popen:
    """``sleep 60`` as nobody in a session of its own, the pty ``slave`` its controlling terminal."""
    return subprocess.Popen(["sleep", "60"], stdin=slave, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd="/", start_new_session=True, user=65534, group=65534, extra_groups=[],
                            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a child as nobody")
def test_discovery_finds_controlling_terminal_of_user_processes(pty) -> None:
    master, slave, path = pty
    child = _nobody_with_terminal(slave)
    try:
        deadline = time.monotonic() + 5
        while path not in discover_terminals("nobody") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert path in discover_terminals("nobody")
        assert path in discover_terminals("someone-else", pids=[child.pid])  # through the offending pid
        assert path not in discover_terminals("someone-else")
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a child as nobody")
def test_discovery_finds_a_terminal_opened_after_the_first_lookup() -> None:
    # psutil memoises its terminal map on the first Process.terminal() of the process: a
    # long-running agent must still find the pty of a session that started after that
    psutil.Process(os.getpid()).terminal()
    master, slave = os.openpty()
    path = os.ttyname(slave)
    child = _nobody_with_terminal(slave)
    try:
        deadline = time.monotonic() + 5
        while path not in discover_terminals("nobody") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert path in discover_terminals("someone-else", pids=[child.pid])
    finally:
        child.kill()
        child.wait()
        os.close(master)
        os.close(slave)


def test_terminal_notifier_counts_delivered_and_reports_skips(pty) -> None:
    master, _, path = pty
    n = TerminalNotifier(discover=lambda user, pids: [path, "/dev/pts/99999"])
    rep = n.notify(recipient="user-a", pids=[1], text="hello", at=NOW)
    assert (rep.channel, rep.recipient, rep.delivered, rep.at) == ("terminal", "user-a", 1, NOW)
    assert rep.detail.startswith(f"written to {path}") and "skipped /dev/pts/99999" in rep.detail
    assert b"Message from gpuroster to user-a" in read_all(master)


def test_terminal_notifier_dry_run_names_terminals_but_writes_nothing(pty) -> None:
    master, _, path = pty
    rep = TerminalNotifier(discover=lambda u, p: [path]).notify(recipient="user-a", pids=[], text="x", at=NOW, dry_run=True)
    assert (rep.delivered, rep.detail) == (0, f"dry run: would write to {path}")
    assert read_all(master, timeout=0.3) == b""


def test_terminal_notifier_without_terminals_or_with_failing_discovery() -> None:
    rep = TerminalNotifier(discover=lambda u, p: []).notify(recipient="user-a", pids=[], text="x", at=NOW)
    assert (rep.delivered, rep.detail) == (0, "no terminal of user-a found")

    def boom(u, p):
        raise OSError("proc unreadable")

    rep = TerminalNotifier(discover=boom).notify(recipient="user-a", pids=[], text="x", at=NOW)
    assert rep.delivered == 0
