"""Device health through the fake NVML and replayed captures: XID events, ECC, pending
retirement and remap, lost GPU, slowdowns; NotSupported is "unknown", never a failure."""

from __future__ import annotations

from pathlib import Path

from agent.nvml import NvmlSource
from agent.replay import parse_capture
from testkit.fake_nvml import FakeGPU, FakeNVML, b08_lost_gpu, nvml_error

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
HEALTH_CALLS = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
                "nvmlDeviceRegisterEvents", "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetCurrentClocksThrottleReasons")


def checks(dev) -> dict[str, list[tuple[str, int | None]]]:
    out: dict[str, list] = {}
    for c in dev.health_checks:
        out.setdefault(c.kind, []).append((c.state, c.value))
    return out


def source(*gpus: FakeGPU, **kw) -> tuple[NvmlSource, FakeNVML]:
    fake = FakeNVML(list(gpus), **kw)
    return NvmlSource(lib=fake, slow_every=1, pid_max=4_194_304, lost_lookup=lambda: []), fake


def test_every_condition_is_read_and_reported_bad():
    gpu = FakeGPU(uuid="GPU-sick", ecc_uncorrected=3, retired_pending=1, remapped=(1, 2, 1, 1),
                  throttle=0x40 | 0x80, xids=[79, 13])
    src, _ = source(gpu)
    dev = src.collect().devices[0]
    assert dev.health == "ok" and dev.error is None
    c = checks(dev)
    assert c["ecc_uncorrected"] == [("bad", 3)]
    assert c["retired_pages_pending"] == [("bad", None)]
    assert c["remapped_rows_pending"] == [("bad", 2)] and c["remapped_rows_failure"] == [("bad", None)]
    assert c["thermal_slowdown"] == [("bad", None)] and c["power_slowdown"] == [("bad", None)]
    assert c["xid"] == [("bad", 79), ("bad", 13)]


def test_xid_events_are_drained_once_with_timeout_zero_and_only_from_registered_gpus():
    sick = FakeGPU(uuid="GPU-a", xids=[48])
    well = FakeGPU(uuid="GPU-b", bus_id="00000000:02:00.0")
    src, fake = source(sick, well)
    first = {d.uuid: checks(d)["xid"] for d in src.collect().devices}
    assert first == {"GPU-a": [("bad", 48)], "GPU-b": [("ok", None)]}
    sick.xids.append(94)
    second = {d.uuid: checks(d)["xid"] for d in src.collect().devices}
    assert second == {"GPU-a": [("bad", 94)], "GPU-b": [("ok", None)]}
    assert fake.calls["nvmlEventSetCreate"] == 1 and fake.calls["nvmlDeviceRegisterEvents"] == 2
    assert src.collect().devices[0].health_checks[-1].state == "ok"  # nothing new: no XID
    src.close()
    assert fake.calls["nvmlEventSetFree"] == 1


def test_a_healthy_gpu_reports_every_check_ok():
    src, _ = source(FakeGPU(uuid="GPU-ok"))
    c = checks(src.collect().devices[0])
    assert set(c) == {"ecc_uncorrected", "retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure",
                      "thermal_slowdown", "power_slowdown", "xid"}
    assert all(state == "ok" for values in c.values() for state, _ in values)


def test_not_supported_means_unknown_never_a_failure():
    ns = {f: nvml_error("NotSupported") for f in HEALTH_CALLS}
    src, _ = source(FakeGPU(uuid="GPU-geforce", errors=ns, xids=[79]))
    t = src.collect()
    dev = t.devices[0]
    assert dev.health == "ok" and dev.error is None and t.monitoring.status == "ok"
    assert all(c.state == "unknown" for c in dev.health_checks), dev.health_checks


def test_no_event_set_in_the_driver_means_xid_unknown():
    gpu = FakeGPU(uuid="GPU-old")
    src, fake = source(gpu)
    fake.nvmlEventSetCreate = lambda: (_ for _ in ()).throw(nvml_error("FunctionNotFound"))  # type: ignore[method-assign]
    dev = src.collect().devices[0]
    assert checks(dev)["xid"] == [("unknown", None)] and dev.health == "ok"


def test_a_lost_gpu_is_reported_as_a_gpu_lost_check_and_the_others_still_report():
    src = NvmlSource(lib=b08_lost_gpu("GpuIsLost"), slow_every=1, pid_max=4_194_304, lost_lookup=lambda: [])
    devices = src.collect().devices
    assert [d.health for d in devices] == ["ok", "lost", "ok", "ok"]
    assert checks(devices[1]) == {"gpu_lost": [("bad", None)]}
    assert checks(devices[0])["xid"] == [("ok", None)]


def test_replayed_capture_carries_ecc_and_pending_retirement():
    cap = parse_capture((CORPUS / "pai__nvidia_smi_retired_pages.xml").read_bytes(), "retired_pages.xml")
    c = checks(cap.devices[0])
    assert c["ecc_uncorrected"] == [("bad", 1)] and c["retired_pages_pending"] == [("bad", None)]
    assert c["xid"] == [("unknown", None)]


def test_replayed_capture_carries_remapped_rows_and_unknown_where_na():
    a10g = checks(parse_capture((CORPUS / "telegraf__a10g.xml").read_bytes(), "a10g.xml").devices[0])
    assert a10g["remapped_rows_pending"] == [("ok", None)] and a10g["remapped_rows_failure"] == [("ok", None)]
    assert a10g["ecc_uncorrected"] == [("ok", 0)]
    gt = checks(parse_capture((CORPUS / "telegraf__gt-1030.xml").read_bytes(), "gt.xml").devices[0])
    assert gt["ecc_uncorrected"] == [("unknown", None)] and gt["remapped_rows_pending"] == [("unknown", None)]


def test_the_snapshot_carries_only_bad_and_unknown_readings():
    from tests.agent.conftest import snapshot_of

    gpu = FakeGPU(uuid="GPU-hot", throttle=0x40, errors={"nvmlDeviceGetRetiredPagesPendingStatus": nvml_error("NotSupported")})
    snap = snapshot_of(FakeNVML([gpu]))
    sent = snap.devices[0].health_checks
    assert {(c.kind, c.state) for c in sent} == {("thermal_slowdown", "bad"), ("retired_pages_pending", "unknown")}
