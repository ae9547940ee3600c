"""The pure coverage function (agent/policy.py) over a table of cases, and the named cases
B05, B07, B13, B15, B16, B17, B30 of CASES.md."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.policy import finding_key, holders, judge, judge_idle, judge_process
from agent.schema import DeviceReport, HostPolicy, ProcessReport, ReservationEntry

DAY = datetime(2025, 3, 10, tzinfo=UTC)
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
OPEN = "GPU-0PEN0000-0000-0000-0000-000000000000"
H100 = "GPU-H1000000-0000-0000-0000-000000000000"
MIG2 = "MIG-22222222-2222-2222-2222-222222222222"  # GI 2, 3g.40gb
MIG3 = "MIG-33333333-3333-3333-3333-333333333333"  # GI 3, 2g.20gb
POLICY = HostPolicy()


def at(hh: int, mm: int = 0, ss: int = 0, us: int = 0) -> datetime:
    return DAY.replace(hour=hh, minute=mm, second=ss, microsecond=us)


def proc(pid: int, dev: str, user: str | None, uid: int | None = 1001, *, name: str = "python",
         command: str | None = None, status: str = "ok", ct: float = 1741600000.25,
         exe: str | None = None) -> ProcessReport:
    return ProcessReport(device_uuid=dev, pid=pid, unix_user=user, uid=uid, name=name,
                         command=command or f"{name} train.py", create_time=ct, owner_status=status, exe=exe)


def res(rid: int, user: str, devs: list[str], start: datetime, end: datetime, shared: list[str] | None = None) -> ReservationEntry:
    return ReservationEntry(id=rid, user=user, unix_name=user, device_uuids=devs, start=start, end=end,
                            shared_with=shared or [])


DEVICES = [
    DeviceReport(uuid=GPU0, index=0, pci_bus_id="00000000:01:00.0", utilization_gpu=0.0),
    DeviceReport(uuid=GPU1, index=1, pci_bus_id="00000000:02:00.0", utilization_gpu=0.0),
    DeviceReport(uuid=OPEN, index=2, pci_bus_id="00000000:03:00.0", utilization_gpu=0.0),
    DeviceReport(uuid=H100, index=3, pci_bus_id="00000000:04:00.0", mig_mode=True),
    DeviceReport(uuid=MIG2, index=0, parent_uuid=H100, gpu_instance_id=2, mig_profile="3g.40gb"),
    DeviceReport(uuid=MIG3, index=1, parent_uuid=H100, gpu_instance_id=3, mig_profile="2g.20gb"),
]
TABLE = [
    res(1, "user-a", [GPU0], at(10), at(12)),
    res(2, "user-b", [GPU1], at(10), at(12), shared=["user-c"]),
    res(3, "user-a", [MIG3], at(8), at(20)),
    res(4, "user-b", [MIG2], at(8), at(20)),
    res(5, "user-d", [H100], at(20), at(23)),
]


def one(p: ProcessReport, now: datetime, *, table=TABLE, policy=POLICY, open_devices=(OPEN,), **kw):
    """(kind, reservation_id, holder) of the single verdict, or None."""
    out = judge([p], table, policy, now=now, devices=DEVICES, open_devices=open_devices, include_idle=False, **kw)
    assert len(out) <= 1
    return (out[0].kind, out[0].reservation_id, out[0].holder) if out else None


CASES = [
    # id, process, now, expected
    ("start_is_covered", proc(1, GPU0, "user-a"), at(10), None),
    ("just_before_start_is_not", proc(1, GPU0, "user-a"), at(9, 59, 59, 999999), ("unreserved", None, None)),
    ("just_before_end_is_covered", proc(1, GPU0, "user-a"), at(11, 59, 59, 999999), None),
    ("end_is_not_covered_overrun", proc(1, GPU0, "user-a"), at(12), ("overrun", 1, None)),
    ("overrun_within_window", proc(1, GPU0, "user-a"), at(17, 59), ("overrun", 1, None)),
    ("unreserved_after_window", proc(1, GPU0, "user-a"), at(18), ("unreserved", None, None)),
    ("other_user_is_foreign", proc(1, GPU0, "user-x"), at(11), ("foreign", 1, "user-a")),
    ("other_user_after_end_is_unreserved", proc(1, GPU0, "user-x"), at(12), ("unreserved", None, None)),
    ("holder_of_other_gpu_is_foreign", proc(1, GPU0, "user-b"), at(11), ("foreign", 1, "user-a")),
    ("shared_with_user_is_covered", proc(1, GPU1, "user-c"), at(11), None),
    ("shared_with_user_overruns_too", proc(1, GPU1, "user-c"), at(12, 1), ("overrun", 2, None)),
    ("open_device_needs_no_reservation", proc(1, OPEN, "user-x"), at(11), None),
    ("open_device_only_when_listed", proc(1, OPEN, "user-x"), at(11), ("unreserved", None, None), ()),
    ("mig_instance_covered_by_its_reservation", proc(1, MIG3, "user-a"), at(11), None),
    ("mig_sibling_reservation_does_not_cover", proc(1, MIG2, "user-a"), at(11), ("foreign", 4, "user-b")),
    ("mig_instance_covered_by_parent_reservation", proc(1, MIG2, "user-d"), at(21), None),
    ("mig_instance_foreign_against_parent_holder", proc(1, MIG3, "user-a"), at(21), ("foreign", 5, "user-d")),
    ("parent_gpu_not_covered_by_instance_reservation", proc(1, H100, "user-a"), at(11), ("unreserved", None, None)),
    ("unknown_device_is_unreserved", proc(1, "GPU-unknown", "user-a"), at(11), ("unreserved", None, None)),
    ("root_uid_verified_exe_exempt", proc(1, GPU0, "user-x", uid=0, exe="/usr/bin/python3"), at(11), None),
    ("root_uid_unverified_exe_is_judged", proc(1, GPU0, "root", uid=0), at(11), ("foreign", 1, "user-a")),
    ("root_name_without_uid_exempt", proc(1, GPU0, "root", uid=None, status="replay"), at(11), None),
    ("system_account_exempt", proc(1, GPU0, "nvidia-persist", uid=999, exe="/usr/bin/nvidia-persistenced"), at(11), None),
    ("min_uid_boundary_is_judged", proc(1, GPU0, "user-x", uid=1000), at(11), ("foreign", 1, "user-a")),
    ("exempt_name_by_verified_exe", proc(1, GPU0, "user-x", name="dcgm-exporter", exe="/usr/bin/dcgm-exporter"), at(11), None),
    ("D2_exempt_name_chosen_by_the_process_is_judged", proc(1, GPU0, "user-x", name="dcgm-exporter",
                                                             command="Xorg 600"), at(11), ("foreign", 1, "user-a")),
    ("exempt_name_by_replayed_command_path", proc(1, GPU0, "user-x", name="X", command="/usr/lib/xorg/Xorg -core :0",
                                                  status="replay"), at(11), None),
    ("replay_owner_is_judged", proc(1, GPU0, "user-x", uid=None, status="replay"), at(11), ("foreign", 1, "user-a")),
    ("uid_without_name_is_unknown_uid", proc(1, GPU0, None, uid=20001, status="uid_only"), at(11), ("unknown_uid", 1, "user-a")),
    ("unknown_uid_on_free_device_has_no_holder", proc(1, GPU1, None, uid=20001, status="uid_only"), at(13),
     ("unknown_uid", None, None)),
    ("unknown_uid_on_open_device_is_fine", proc(1, OPEN, None, uid=20001, status="uid_only"), at(11), None),
    ("replay_without_owner_never_judged", proc(1, GPU0, None, uid=None, status="replay"), at(11), None),
]


@pytest.mark.parametrize(
    "process,now,expected,open_devices",
    [(c[1], c[2], c[3], c[4] if len(c) > 4 else (OPEN,)) for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_table(process: ProcessReport, now: datetime, expected, open_devices) -> None:
    assert one(process, now, open_devices=open_devices) == expected


def test_exempt_users_from_policy() -> None:
    p = proc(1, GPU0, "svc-ci")
    assert one(p, at(11)) == ("foreign", 1, "user-a")
    assert one(p, at(11), policy=HostPolicy(exempt_users=["svc-ci"])) is None


def test_min_uid_is_configurable() -> None:
    p = proc(1, GPU0, "user-x", uid=600, exe="/usr/sbin/daemon")
    assert one(p, at(11)) is None
    assert one(p, at(11), policy=HostPolicy(min_uid=500)) == ("foreign", 1, "user-a")


def test_overrun_window_is_configurable() -> None:
    p = proc(1, GPU0, "user-a")
    assert one(p, at(13), overrun_window=timedelta(hours=2)) == ("overrun", 1, None)
    assert one(p, at(14), overrun_window=timedelta(hours=2)) == ("unreserved", None, None)


def test_naive_datetimes_are_read_as_utc() -> None:
    naive = [res(1, "user-a", [GPU0], at(10).replace(tzinfo=None), at(12).replace(tzinfo=None))]
    assert one(proc(1, GPU0, "user-a"), at(11), table=naive) is None
    assert one(proc(1, GPU0, "user-a"), at(12).replace(tzinfo=None), table=naive) == ("overrun", 1, None)


def test_key_is_uuid_pid_create_time_kind_and_duplicates_collapse() -> None:
    p = proc(4242, GPU0, "user-x", ct=1741600000.256)
    twice = [p, p.model_copy(update={"type": "G"})]
    out = judge(twice, TABLE, POLICY, now=at(11), devices=DEVICES, include_idle=False)
    assert [j.key for j in out] == [f"{GPU0}:4242:1741600000.26:foreign"]
    assert finding_key(GPU0, 4242, None, "unreserved") == f"{GPU0}:4242:-:unreserved"


def test_one_process_on_two_devices_gives_two_findings() -> None:
    out = judge([proc(7, GPU0, "user-x"), proc(7, GPU1, "user-x")], TABLE, POLICY, now=at(11), include_idle=False)
    assert {(j.device_uuid, j.kind, j.holder) for j in out} == {(GPU0, "foreign", "user-a"), (GPU1, "foreign", "user-b")}


def test_inputs_are_not_mutated_and_result_is_deterministic() -> None:
    procs = [proc(1, GPU0, "user-x"), proc(2, MIG2, "user-a")]
    before = [p.model_dump() for p in procs], [r.model_dump() for r in TABLE]
    a = judge(procs, TABLE, POLICY, now=at(11), devices=DEVICES)
    b = judge(procs, TABLE, POLICY, now=at(11), devices=DEVICES)
    assert a == b
    assert ([p.model_dump() for p in procs], [r.model_dump() for r in TABLE]) == before


def test_holders_for_display() -> None:
    assert [r.id for r in holders(MIG2, TABLE, now=at(21), devices=DEVICES)] == [5]
    assert [r.id for r in holders(MIG2, TABLE, now=at(11), devices=DEVICES)] == [4]
    assert holders(GPU0, TABLE, now=at(12)) == []


def test_policy_module_imports_without_agent_runtime_deps() -> None:
    code = (
        "import sys, agent.policy; "
        "bad = [m for m in ('psutil', 'httpx', 'pynvml', 'sqlalchemy', 'app') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=200, deadline=None)
@given(offset=st.integers(min_value=-3 * 3600, max_value=3 * 3600))
def test_half_open_property(offset: int) -> None:
    """The holder is covered exactly on [start, end); other users are foreign exactly then."""
    now = at(11) + timedelta(seconds=offset)
    inside = at(10) <= now < at(12)
    assert (one(proc(1, GPU0, "user-a"), now) is None) == inside
    assert (one(proc(1, GPU0, "user-x"), now) == ("foreign", 1, "user-a")) == inside


# ---------------------------------------------------------------------------------------
# named cases


def test_B30_handover_at_noon_previous_holder_becomes_foreign_against_new_holder() -> None:
    table = [res(1, "user-a", [GPU0], at(10), at(12)), res(2, "user-b", [GPU0], at(12), at(14))]
    p = ProcessReport(device_uuid=GPU0, pid=5101, unix_user="user-a", uid=1001, used_memory_mib=20480,
                      create_time=1741598000.0, name="python")
    verdicts = {t: one(p, t, table=table) for t in (at(11, 58), at(12), at(12, 0, 30), at(12, 5))}
    assert verdicts[at(11, 58)] is None
    for t in (at(12), at(12, 0, 30), at(12, 5)):
        assert verdicts[t] == ("foreign", 2, "user-b"), t
    # the same key at every poll: one finding, not one per poll
    keys = {judge([p], table, POLICY, now=t)[0].key for t in (at(12, 0, 30), at(12, 5))}
    assert keys == {f"{GPU0}:5101:1741598000.00:foreign"}
    # once R2 has ended too, nobody holds GPU0 and R1 ended within the overrun window
    assert one(p, at(14), table=table) == ("overrun", 1, None)


def test_B17_index_versus_uuid_trap() -> None:
    """node-02: index 0 = GTX 1660 SUPER (GPU-1111), index 1 = RTX 3090 (GPU-2222); user-a
    reserved the 3090. CUDA_VISIBLE_DEVICES=0 lands on the 3090 (CUDA fastest-first): covered.
    CUDA_VISIBLE_DEVICES=1 lands on the 1660: a finding, although "1" is the 3090's NVML index."""
    g1660 = "GPU-1111aaaa-0000-0000-0000-000000000000"
    g3090 = "GPU-2222bbbb-0000-0000-0000-000000000000"
    devices = [
        DeviceReport(uuid=g1660, index=0, name="NVIDIA GeForce GTX 1660 SUPER", pci_bus_id="00000000:01:00.0"),
        DeviceReport(uuid=g3090, index=1, name="NVIDIA GeForce RTX 3090", pci_bus_id="00000000:02:00.0"),
    ]
    table = [res(1, "user-a", [g3090], at(9), at(17))]
    run1 = proc(100, g3090, "user-a")  # CUDA index 0 -> the 3090
    run2 = proc(200, g1660, "user-a")  # CUDA index 1 -> the 1660
    out = judge([run1, run2], table, POLICY, now=at(10), devices=devices)
    assert [(j.pid, j.device_uuid, j.kind) for j in out] == [(200, g1660, "unreserved")]


def test_B15_xorg_root_exempt_render_app_of_user_b_flagged() -> None:
    table = [res(1, "user-a", [GPU0], at(9), at(17))]
    procs = [
        ProcessReport(device_uuid=GPU0, pid=36528, type="C+G", unix_user="user-a", uid=1001, name="python", create_time=1.0),
        ProcessReport(device_uuid=GPU0, pid=978, type="G", unix_user="root", uid=0, name="Xorg",
                      command="/usr/lib/Xorg", create_time=1.0, exe="/usr/lib/Xorg"),
        ProcessReport(device_uuid=GPU0, pid=33466, type="G", unix_user="user-b", uid=1002, name="blender", create_time=2.0),
    ]
    out = judge(procs, table, POLICY, now=at(10), devices=DEVICES)
    assert [(j.pid, j.kind, j.holder) for j in out] == [(33466, "foreign", "user-a")]
    # the verified Xorg executable is exempt even if a display manager runs it under a normal uid
    xorg_user = procs[1].model_copy(update={"unix_user": "gdm-user", "uid": 1500})
    assert judge([xorg_user], table, POLICY, now=at(10), include_idle=False) == []


def test_B16_display_and_baseline_processes_give_no_findings() -> None:
    devices = [
        DeviceReport(uuid=GPU0, index=0, memory_used_mib=91, utilization_gpu=0.0),
        DeviceReport(uuid=GPU1, index=1, memory_used_mib=2, utilization_gpu=0.0),
    ]
    procs = [ProcessReport(device_uuid=GPU0, pid=1357, type="G", used_memory_mib=4, unix_user="root", uid=0,
                           name="Xorg", create_time=1.0, exe="/usr/lib/xorg/Xorg")]
    assert judge(procs, [], POLICY, now=at(10), devices=devices) == []
    # the exempt process does not keep a reserved GPU from counting as idle
    table = [res(1, "user-a", [GPU0], at(9), at(17))]
    assert [j.kind for j in judge(procs, table, POLICY, now=at(10), devices=devices)] == ["idle"]


def test_B07_user_a_process_on_user_b_gi2_slice_is_foreign() -> None:
    procs = [
        ProcessReport(device_uuid=MIG2, pid=21180, unix_user="user-b", uid=1002, create_time=1.0, used_memory_mib=2296),
        ProcessReport(device_uuid=MIG2, pid=21198, unix_user="user-a", uid=1001, create_time=2.0, used_memory_mib=7484),
    ]
    out = judge(procs, TABLE, POLICY, now=at(11), devices=DEVICES, include_idle=False)
    assert [(j.pid, j.device_uuid, j.kind, j.reservation_id, j.holder) for j in out] == [
        (21198, MIG2, "foreign", 4, "user-b")
    ]


@pytest.mark.parametrize("status", ["exited", "access_denied", "not_visible", "unknown"])
def test_B05_B12_B13_unknown_owner_never_flagged(status: str) -> None:
    """B05 (not visible in our PID namespace), B12 (exited), B13 (access denied): never a
    finding, even if a stale unix_user came along, and never counted as another user."""
    p = ProcessReport(device_uuid=GPU0, pid=28290, unix_user="user-x", uid=1001, owner_status=status, used_memory_mib=1012)
    assert judge([p], TABLE, POLICY, now=at(11), devices=DEVICES, include_idle=False) == []
    bare = ProcessReport(device_uuid=GPU0, pid=2140, owner_status=status)
    assert judge([bare], TABLE, POLICY, now=at(11), devices=DEVICES, include_idle=False) == []


# ---------------------------------------------------------------------------------------
# idle (judged now; the tracker debounces it over policy.idle_minutes)


def _idle(procs, devices, table=None, policy=POLICY, now=None):
    return [(j.device_uuid, j.reservation_id, j.holder) for j in
            judge_idle(procs, devices, table if table is not None else TABLE, policy, now=now or at(11))]


def test_idle_when_no_holder_process_and_low_utilization() -> None:
    devices = [DeviceReport(uuid=GPU0, utilization_gpu=4.9), DeviceReport(uuid=GPU1, utilization_gpu=5.0)]
    assert _idle([], devices) == [(GPU0, 1, "user-a")]


def test_not_idle_with_holder_or_shared_user_process() -> None:
    devices = [DeviceReport(uuid=GPU0, utilization_gpu=0.0), DeviceReport(uuid=GPU1, utilization_gpu=0.0)]
    procs = [proc(1, GPU0, "user-a"), proc(2, GPU1, "user-c")]
    assert _idle(procs, devices) == []


def test_foreign_process_does_not_make_a_reservation_busy() -> None:
    devices = [DeviceReport(uuid=GPU0, utilization_gpu=1.0)]
    assert _idle([proc(1, GPU0, "user-x")], devices) == [(GPU0, 1, "user-a")]


def test_idle_is_not_judged_without_evidence() -> None:
    lost = [DeviceReport(uuid=GPU0, utilization_gpu=0.0, health="lost")]
    unlisted = [DeviceReport(uuid=GPU0, utilization_gpu=0.0, processes_status="unavailable")]
    assert _idle([], lost) == []
    assert _idle([], unlisted) == []
    assert _idle([], []) == []  # device not reported at all
    assert _idle([], [DeviceReport(uuid=GPU0, utilization_gpu=0.0)], now=at(12)) == []  # reservation over


def test_idle_mig_without_utilization_uses_processes() -> None:
    """B07: MIG utilization is n/a; idle then rests on processes, and an unknown-owner
    process might be the holder's, so it blocks idle."""
    assert _idle([], DEVICES) == [(GPU0, 1, "user-a"), (GPU1, 2, "user-b"), (MIG3, 3, "user-a"), (MIG2, 4, "user-b")]
    unknown = ProcessReport(device_uuid=MIG3, pid=9, owner_status="access_denied")
    assert (MIG3, 3, "user-a") not in _idle([unknown], DEVICES)


def test_parent_reservation_busy_through_a_mig_child() -> None:
    devices = DEVICES
    assert (H100, 5, "user-d") in _idle([], devices, now=at(21))
    assert _idle([proc(1, MIG2, "user-d")], devices, now=at(21)) == []


def test_idle_threshold_is_configurable() -> None:
    devices = [DeviceReport(uuid=GPU0, utilization_gpu=20.0)]
    assert _idle([], devices) == []
    assert _idle([], devices, policy=HostPolicy(idle_utilization_pct=25)) == [(GPU0, 1, "user-a")]


def test_judge_process_matches_judge() -> None:
    p = proc(21198, MIG2, "user-a")
    j = judge_process(p, TABLE, POLICY, now=at(11), devices=DEVICES)
    assert j is not None and (j.kind, j.holder) == ("foreign", "user-b")
    assert judge_process(p, TABLE, POLICY, now=at(11)).holder == "user-b"  # MIG2 reserved directly
    assert judge_process(proc(1, MIG2, "user-d"), TABLE, POLICY, now=at(21)) is not None  # no parent info
