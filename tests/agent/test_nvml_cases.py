"""The NVML source on a fake pynvml: one scenario per case of CASES.md."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from agent.nvml import MISMATCH_MESSAGE, NvmlSource, binding_driver_problem
from tests.agent.conftest import T0, nvml_builder, snapshot_of
from testkit.fake_nvml import (
    GiB,
    MiB,
    FakeGPU,
    FakeNVML,
    FakeOwner,
    FakeProc,
    b01_garbage_pids,
    b03_function_not_found,
    b04_memory_not_available,
    b05_foreign_pid_namespace,
    b07_mig_h100,
    b08_lost_gpu,
    b09_version_mismatch,
    b10_no_library,
    b12_exits_mid_lookup,
    b13_access_denied,
    b15_graphics_and_compute,
    b16_idle_with_display,
    b18_bytes_names,
    b19_not_supported,
    nvml_error,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_b01_garbage_pids_dropped_snapshot_suspect_real_pids_attributed():
    owners = {41001: FakeOwner(uid=1001, user="user-a"), 41077: FakeOwner(uid=1001, user="user-a")}
    snap = snapshot_of(b01_garbage_pids(), owners)
    assert [p.pid for p in snap.processes] == [41001, 41077]
    assert [p.unix_user for p in snap.processes] == ["user-a", "user-a"]
    assert snap.processes[0].used_memory_mib == 2048 and snap.processes[1].used_memory_mib == 1024
    assert snap.suspect is True
    reason = " ".join(snap.suspect_reasons)
    assert "5 bogus pid" in reason and "12.535.77" in reason and "535.86.05" in reason
    assert all(p.owner_status == "ok" for p in snap.processes)


def test_b01_supported_binding_driver_pairs_are_pinned():
    # the one known-bad pair: 12.535.77 reads the R535+ struct at the wrong stride
    assert binding_driver_problem("12.535.77", "535.86.05") is not None
    assert binding_driver_problem("12.535.77", "550.54.15") is not None
    assert binding_driver_problem("12.535.77", "470.82.01") is None  # old driver: v2 entry points
    assert binding_driver_problem("12.535.108", "535.104.05") is None
    assert binding_driver_problem("12.535.133", "535.86.05") is None
    assert binding_driver_problem("13.590.48", "590.48.01") is None
    assert binding_driver_problem(None, "535.86.05") is None


def test_b01_clean_list_is_not_suspect():
    fake = FakeNVML([FakeGPU(uuid="GPU-1", compute=[FakeProc(41001, GiB)])])
    snap = snapshot_of(fake, {41001: FakeOwner()})
    assert snap.suspect is False and snap.suspect_reasons == []


def test_b01_pid_at_or_above_pid_max_is_bogus():
    fake = FakeNVML([FakeGPU(uuid="GPU-1", compute=[FakeProc(40000, GiB), FakeProc(32768, GiB), FakeProc(32767, GiB)])])
    source = NvmlSource(lib=fake, pid_max=32768, driver_present=lambda: True)
    t = source.poll()
    assert [p.pid for p in t.processes] == [32767]
    assert "2 bogus pid" in t.suspect_reasons[0]


def test_b03_function_not_found_keeps_metrics_marks_processes_unavailable():
    snap = snapshot_of(b03_function_not_found())
    assert len(snap.devices) == 2
    for dev in snap.devices:
        assert dev.memory_total_mib == 80 * 1024 and dev.utilization_gpu == 37 and dev.temperature_c == 41
        assert dev.processes_status == "unavailable"
        assert "function not found in driver 470.82.01" in dev.processes_error
        assert dev.health == "ok"
    assert snap.processes == []
    assert snap.monitoring.status == "degraded"  # never "ok with no processes"


def test_b04_memory_not_available_is_none_never_zero_or_16eib():
    owners = {13820: FakeOwner(uid=1001, user="user-a"), 2140: FakeOwner(uid=1002, user="user-b")}
    snap = snapshot_of(b04_memory_not_available(), owners)
    assert len(snap.processes) == 4
    for p in snap.processes:
        assert p.used_memory_mib is None
        assert p.unix_user in ("user-a", "user-b")
    assert {(p.pid, p.type) for p in snap.processes} == {(13820, "C"), (2140, "G")}


def test_b05_foreign_pid_namespace_reports_not_visible_never_attributed():
    snap = snapshot_of(b05_foreign_pid_namespace(), {}, host_pid_ns=False)
    (proc,) = snap.processes
    assert proc.pid == 28290 and proc.owner_status == "not_visible"
    assert proc.unix_user is None and proc.uid is None
    assert snap.pid_namespace_ok is False
    assert snap.monitoring.status == "degraded"
    assert "host PID namespace" in snap.monitoring.message


def test_b07_mig_instances_are_devices_processes_mapped_by_gpu_instance():
    owners = {21180: FakeOwner(uid=1002, user="user-b"), 21198: FakeOwner(uid=1001, user="user-a")}
    snap = snapshot_of(b07_mig_h100(), owners)
    parent = snap.devices[0]
    migs = {d.gpu_instance_id: d for d in snap.devices if d.parent_uuid}
    assert parent.parent_uuid is None and parent.mig_mode is True
    assert parent.utilization_gpu is None and parent.utilization_memory is None  # n/a, not 0 %
    assert parent.health == "ok"
    assert sorted(migs) == [2, 3, 9, 10]
    assert all(m.parent_uuid == parent.uuid for m in migs.values())
    assert migs[2].mig_profile == "3g.40gb" and migs[3].mig_profile == "2g.20gb"
    assert migs[2].memory_total_mib == 40 * 1024
    assert migs[9].memory_total_mib is None and migs[9].memory_used_mib is None  # NoPermission -> n/a
    assert migs[9].health == "ok"  # not an error
    assert migs[10].uuid == f"MIG-{parent.uuid}/10/0"  # unreadable UUID: derived, stable
    assert [m.index for m in sorted(migs.values(), key=lambda d: d.gpu_instance_id)] == [0, 1, 2, 3]
    by_pid = {p.pid: p for p in snap.processes}
    assert by_pid[21198].device_uuid == migs[2].uuid  # user-a's process sits on GI 2
    assert by_pid[21180].device_uuid == migs[2].uuid
    assert by_pid[21198].unix_user == "user-a"
    assert not any(p.device_uuid == migs[3].uuid for p in snap.processes)


@pytest.mark.parametrize("error", ["Unknown", "GpuIsLost"])
def test_b08_lost_gpu_reported_lost_others_normal(error):
    fake = b08_lost_gpu(error)
    table = [(f"0000:{0x0A + i:02x}:00.0", f"GPU-from-proc-{i}") for i in range(4)]
    builder = nvml_builder(fake, lost_table=table)
    for seq in range(3):  # keeps polling
        snap = builder.build(seq, T0)
        assert [d.index for d in snap.devices] == [0, 1, 2, 3]
        assert [d.health for d in snap.devices] == ["ok", "lost", "ok", "ok"]
        lost = snap.devices[1]
        assert lost.uuid == "GPU-from-proc-1" and lost.pci_bus_id == "0000:0b:00.0"
        assert "Unable to determine the device handle" in lost.error
        assert lost.memory_used_mib is None and lost.utilization_gpu is None
        assert snap.devices[2].memory_used_mib == 1024
        assert snap.monitoring.status == "degraded"


def test_b08_gpu_lost_after_being_seen_keeps_its_uuid():
    fake = FakeNVML([FakeGPU(uuid="GPU-aaaa"), FakeGPU(uuid="GPU-bbbb", bus_id="00000000:02:00.0")])
    builder = nvml_builder(fake)
    builder.build(1, T0)
    fake.gpus[1].errors["nvmlDeviceGetMemoryInfo"] = nvml_error("GpuIsLost")
    snap = builder.build(2, T0)
    assert snap.devices[1].uuid == "GPU-bbbb" and snap.devices[1].health == "lost"
    assert snap.devices[0].health == "ok"


def test_b09_version_mismatch_monitoring_down_retries_with_backoff_logs_once(caplog):
    clock = FakeClock()
    fake = b09_version_mismatch()
    builder = nvml_builder(fake, clock=clock)
    caplog.set_level(logging.INFO, logger="gpuroster.agent")
    for seq in range(8):  # 3.5 s of polls: inside the first backoff window (5 s +- 20 %)
        snap = builder.build(seq, T0)
        assert snap.monitoring.status == "down"
        assert snap.monitoring.message == MISMATCH_MESSAGE
        assert snap.devices == [] and snap.processes == []
        clock.t += 0.5
    assert fake.calls["nvmlInit"] == 1
    assert len([r for r in caplog.records if "mismatch" in r.getMessage()]) == 1
    clock.t += 10
    builder.build(11, T0)
    assert fake.calls["nvmlInit"] == 2
    # the host is rebooted: NVML comes back and the agent recovers on its own
    fake.init_error = None
    clock.t += 400
    snap = builder.build(12, T0)
    assert snap.monitoring.status == "ok" and len(snap.devices) == 1


def test_b09_mismatch_in_the_middle_of_running():
    clock = FakeClock()
    fake = FakeNVML([FakeGPU(uuid="GPU-1")])
    builder = nvml_builder(fake, clock=clock)
    assert builder.build(1, T0).monitoring.status == "ok"
    fake.gpus[0].errors["nvmlDeviceGetUUID"] = nvml_error("LibRmVersionMismatch")
    snap = builder.build(2, T0)
    assert snap.monitoring.status == "down" and snap.monitoring.message == MISMATCH_MESSAGE
    assert snap.devices == []


def test_b10_no_library_no_driver_is_zero_gpus_not_an_error(caplog):
    caplog.set_level(logging.WARNING, logger="gpuroster.agent")
    clock = FakeClock()
    builder = nvml_builder(b10_no_library(), driver_present=False, clock=clock)
    for seq in range(5):
        snap = builder.build(seq, T0)
        clock.t += 30
        assert snap.monitoring.status == "no_driver" and snap.devices == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_b10_no_library_where_gpus_expected_is_misconfigured_logged_once(caplog):
    caplog.set_level(logging.INFO, logger="gpuroster.agent")
    clock = FakeClock()
    builder = nvml_builder(b10_no_library(), driver_present=False, expect_gpus=True, clock=clock)
    for seq in range(5):
        snap = builder.build(seq, T0)
        clock.t += 400
        assert snap.monitoring.status == "misconfigured"
        assert "NVML not found" in snap.monitoring.message
    assert len([r for r in caplog.records if "misconfigured" in r.getMessage()]) == 1


def test_b10_pynvml_module_missing_is_handled(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *a, **k):  # noqa: ANN001, ANN002, ANN003
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    source = NvmlSource(lib=None, driver_present=lambda: False, binding_version="")
    assert source.poll().monitoring.status == "no_driver"


def test_b12_process_exits_mid_lookup_marked_exited_rest_sent():
    owners = {22919: FakeOwner(error="exited"), 22920: FakeOwner(uid=1001, user="user-a")}
    snap = snapshot_of(b12_exits_mid_lookup(), owners)
    by_pid = {p.pid: p for p in snap.processes}
    assert by_pid[22919].owner_status == "exited" and by_pid[22919].unix_user is None
    assert by_pid[22920].owner_status == "ok" and by_pid[22920].unix_user == "user-a"


def test_b13_access_denied_is_unattributed():
    owners = {2140: FakeOwner(error="denied"), 41001: FakeOwner(uid=1001, user="user-a")}
    snap = snapshot_of(b13_access_denied(), owners)
    by_pid = {p.pid: p for p in snap.processes}
    assert by_pid[2140].owner_status == "access_denied"
    assert by_pid[2140].unix_user is None and by_pid[2140].uid is None
    assert by_pid[41001].unix_user == "user-a"


def test_b13_hidepid_makes_invisible_pids_access_denied():
    owners = {41001: FakeOwner(uid=1001, user="user-a")}
    snap = snapshot_of(b13_access_denied(), owners, hidepid=True)
    by_pid = {p.pid: p for p in snap.processes}
    assert by_pid[2140].owner_status == "access_denied"  # not in our /proc view: hidden, not exited


def test_b15_compute_and_graphics_merged_by_pid():
    owners = {
        36528: FakeOwner(uid=1001, user="user-a"),
        978: FakeOwner(uid=0, user="root", argv=["/usr/lib/Xorg", ":0"]),
        33466: FakeOwner(uid=1002, user="user-b", argv=["blender"]),
    }
    snap = snapshot_of(b15_graphics_and_compute(), owners)
    by_pid = {p.pid: p for p in snap.processes}
    assert len(snap.processes) == 3
    assert by_pid[36528].type == "C+G" and by_pid[36528].used_memory_mib == 9218
    assert by_pid[978].type == "G" and by_pid[978].unix_user == "root" and by_pid[978].name == "Xorg"
    assert by_pid[33466].type == "G" and by_pid[33466].unix_user == "user-b"


def test_b16_display_process_and_baseline_memory_reported_as_is():
    owners = {1357: FakeOwner(uid=0, user="root", argv=["/usr/lib/xorg/Xorg"])}
    snap = snapshot_of(b16_idle_with_display(), owners)
    gpu0, gpu1 = snap.devices
    assert gpu0.memory_used_mib == 91 and gpu0.utilization_gpu == 0
    assert gpu1.memory_used_mib == 2
    (xorg,) = snap.processes
    assert xorg.type == "G" and xorg.unix_user == "root" and xorg.used_memory_mib == 4
    assert not any(p.device_uuid == gpu1.uuid for p in snap.processes)


def test_b18_bytes_str_and_undecodable_names_normalised(caplog):
    caplog.set_level(logging.WARNING, logger="gpuroster.agent")
    builder = nvml_builder(b18_bytes_names())
    snap = builder.build(1, T0)
    builder.build(2, T0)
    names = [d.name for d in snap.devices]
    assert names[0] == names[1] == "NVIDIA A100-SXM4-80GB"
    assert isinstance(names[2], str) and "\ufffd" in names[2] and names[2].endswith("NVIDIA")
    assert snap.devices[0].uuid == "GPU-00000000-aaaa-bbbb-cccc-000000000000"  # bytes -> same str
    assert snap.devices[0].pci_bus_id == "00000000:01:00.0"
    assert snap.driver_version == "535.104.05"
    assert len([r for r in caplog.records if "not valid UTF-8" in r.getMessage()]) == 1


def test_b19_not_supported_fields_are_independently_none():
    snap = snapshot_of(b19_not_supported())
    assert len(snap.devices) == 3
    assert all(d.health == "ok" for d in snap.devices)
    assert snap.devices[0].power_draw_w == 65.0
    assert snap.devices[1].power_draw_w is None and snap.devices[1].power_limit_w == 400.0
    bare = snap.devices[2]
    for field in ("utilization_gpu", "utilization_memory", "temperature_c", "power_draw_w", "power_limit_w",
                  "throttle_reasons", "ecc_uncorrected", "retired_pages", "persistence_mode", "compute_mode", "mig_mode"):
        assert getattr(bare, field) is None, field
    assert bare.memory_total_mib == 80 * 1024
    assert snap.monitoring.status == "ok"


def test_unknown_field_error_recorded_on_device_poll_goes_on():
    fake = FakeNVML([FakeGPU(uuid="GPU-1", errors={"nvmlDeviceGetTemperature": nvml_error("Unknown")}),
                     FakeGPU(uuid="GPU-2", bus_id="00000000:02:00.0")])
    snap = snapshot_of(fake)
    assert snap.devices[0].health == "error" and "nvmlDeviceGetTemperature" in snap.devices[0].error
    assert snap.devices[0].temperature_c is None and snap.devices[0].memory_used_mib == 1024
    assert snap.devices[1].health == "ok"


def test_full_device_fields_with_units():
    fake = FakeNVML([FakeGPU(uuid="GPU-1", mem_total=80 * GiB, mem_used=512 * MiB, power_mw=65_500, limit_mw=400_000,
                             throttle=0x1 | 0x4, ecc_uncorrected=3, retired=([1, 2], [3]), compute_mode=3)])
    snap = snapshot_of(fake)
    d = snap.devices[0]
    assert d.memory_total_mib == 81920 and d.memory_used_mib == 512
    assert d.power_draw_w == 65.5 and d.power_limit_w == 400.0
    assert d.throttle_reasons == ["gpu_idle", "sw_power_cap"]
    assert d.ecc_uncorrected == 3 and d.retired_pages == 3
    assert d.persistence_mode is True and d.compute_mode == "Exclusive_Process" and d.mig_mode is False
    assert d.pci_bus_id == "00000000:01:00.0" and d.name == "NVIDIA A100-SXM4-80GB"
    assert snap.cuda_version == "12.2" and snap.binding_version == "12.535.133"
    assert snap.source == "nvml" and snap.stale is False


def test_hung_nvml_marks_stale_within_deadline_and_loop_carries_on():
    hang = threading.Event()
    fake = FakeNVML([FakeGPU(uuid="GPU-1", compute=[FakeProc(41001, GiB)])])
    source = NvmlSource(lib=fake, timeout=0.2, pid_max=4_194_304, driver_present=lambda: True)
    first = source.poll()
    assert first.stale is False and len(first.devices) == 1
    fake.hang = hang  # the next NVML call blocks
    t0 = time.monotonic()
    stale = source.poll()
    assert time.monotonic() - t0 < 1.0
    assert stale.stale is True and [d.uuid for d in stale.devices] == ["GPU-1"]  # last reading, marked stale
    again = source.poll()  # the worker is still stuck: no second thread piles up
    assert again.stale is True
    hang.set()
    time.sleep(0.05)
    fresh = source.poll()
    assert fresh.stale is False and fresh.monitoring.status == "ok"


def test_hung_nvml_before_any_reading_reports_down_not_idle():
    hang = threading.Event()
    fake = FakeNVML([FakeGPU(uuid="GPU-1")], hang=hang)
    source = NvmlSource(lib=fake, timeout=0.1, driver_present=lambda: True)
    t = source.poll()
    hang.set()
    assert t.stale is True and t.monitoring.status == "down" and t.devices == []
