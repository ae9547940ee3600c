"""NVML that disagrees with itself: unreliable process data, memory held by an unlisted or
defunct process; never judged, never signalled (fake NVML, fake /proc/PID/stat)."""

from __future__ import annotations

from datetime import timedelta

from agent.consistency import UNLISTED_MIB, ProcessDataChecker, ProcStat, judged_view, read_proc_stat
from agent.main import Agent, load_enforcer
from agent.schema import HostPolicy, ReservationEntry, SnapshotAck
from tests.agent.conftest import T0, nvml_builder
from testkit.fake_nvml import GiB, MiB, FakeGPU, FakeNVML, FakeOwner, FakeProc

G0 = "GPU-00000000-0000-0000-0000-0000000000a0"
G1 = "GPU-00000000-0000-0000-0000-0000000000a1"
OWNERS = {41001: FakeOwner(uid=1001, user="user-a"), 41002: FakeOwner(uid=1001, user="user-a")}


class FakeStat:
    """``/proc/PID/stat`` as a dict: pid -> (state, start ticks)."""

    def __init__(self, table: dict[int, tuple[str, int]]) -> None:
        self.table = table

    def __call__(self, pid: int) -> ProcStat | None:
        row = self.table.get(pid)
        return ProcStat(*row) if row else None


def builder(fake: FakeNVML, stat: FakeStat):
    b = nvml_builder(fake, OWNERS)
    b.consistency = ProcessDataChecker(stat)
    return b


def test_process_memory_beyond_used_memory_is_unreliable_and_never_judged(tmp_path):
    gpus = [FakeGPU(uuid=G0, mem_used=1 * GiB, compute=[FakeProc(41001, 2 * GiB), FakeProc(41002, 2 * GiB)]),
            FakeGPU(uuid=G1, bus_id="00000000:02:00.0", mem_used=4 * GiB, compute=[FakeProc(41001, 2 * GiB)])]
    stat = FakeStat({41001: ("S", 100), 41002: ("R", 200)})
    agent = Agent(builder(FakeNVML(gpus), stat), None, state_dir=tmp_path / "s", now=lambda: T0,
                  enforcer=load_enforcer(tmp_path / "e", dry_run=True))
    booking = ReservationEntry(id=1, user="user-b", unix_name="user-b", device_uuids=[G0, G1],
                               start=T0 - timedelta(hours=1), end=T0 + timedelta(hours=1))
    agent.acks.update(SnapshotAck(accepted=True, seq=0, server_time=T0, reservations=[booking],
                                  policy=HostPolicy(policy="terminate", grace_seconds=0)))
    snap = agent.take_snapshot()
    dev = {d.uuid: d for d in snap.devices}
    assert dev[G0].process_data == "unreliable" and "4096 MiB" in dev[G0].process_data_detail
    assert dev[G1].process_data == "ok"
    assert {p.device_uuid for p in snap.processes} == {G0, G1}  # still shown, marked unreliable
    # the control device raises the finding; the unreliable one raises none and nothing is signalled there
    assert {f.device_uuid for f in snap.findings} == {G1}
    assert all(f.device_uuid != G0 for f in snap.findings for _ in f.actions)


def test_memory_in_use_with_no_listed_process_is_occupied_naming_the_last_owner():
    gpu = FakeGPU(uuid=G0, mem_used=8 * GiB, compute=[FakeProc(41001, 8 * GiB)])
    stat = FakeStat({41001: ("S", 100)})
    b = builder(FakeNVML([gpu]), stat)
    first = b.build(1, T0)
    assert first.devices[0].process_data == "ok"
    gpu.compute = []  # NVML stops listing it; the process (same start time) still exists
    second = b.build(2, T0)
    d = second.devices[0]
    assert d.process_data == "unlisted" and d.last_owner == "user-a"
    assert "8192 MiB in use but no process listed" == d.process_data_detail
    stat.table[41001] = ("S", 999)  # the pid was recycled: never name the wrong person
    third = b.build(3, T0)
    assert third.devices[0].process_data == "unlisted" and third.devices[0].last_owner is None


def test_idle_baseline_memory_is_free_not_occupied():
    gpu = FakeGPU(uuid=G0, mem_used=int(UNLISTED_MIB * MiB) - MiB, compute=[])
    snap = builder(FakeNVML([gpu]), FakeStat({})).build(1, T0)
    assert snap.devices[0].process_data == "ok" and snap.devices[0].last_owner is None


def test_memory_held_by_a_zombie_is_defunct_and_not_judged():
    gpu = FakeGPU(uuid=G0, mem_used=6 * GiB, compute=[FakeProc(41002, 6 * GiB)])
    snap = builder(FakeNVML([gpu]), FakeStat({41002: ("Z", 300)})).build(1, T0)
    d = snap.devices[0]
    assert d.process_data == "defunct" and d.last_owner == "user-a" and "41002" in d.process_data_detail
    judged, flagged = judged_view(snap)
    assert flagged == {G0} and judged.processes == [] and judged.devices[0].processes_status == "unavailable"
    assert snap.processes and snap.devices[0].processes_status == "ok"  # the report itself is untouched


def test_unavailable_process_list_is_not_called_unlisted():
    from testkit.fake_nvml import nvml_error

    gpu = FakeGPU(uuid=G0, mem_used=8 * GiB, errors={"nvmlDeviceGetComputeRunningProcesses": nvml_error("NotSupported")})
    snap = builder(FakeNVML([gpu]), FakeStat({})).build(1, T0)
    assert snap.devices[0].processes_status == "unavailable" and snap.devices[0].process_data == "ok"


def test_read_proc_stat_parses_state_and_start_ticks(tmp_path):
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text("77 (a (weird) name) Z 1 77 77 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0\n")
    assert read_proc_stat(77, tmp_path) == ProcStat("Z", 123456)
    assert read_proc_stat(78, tmp_path) is None
