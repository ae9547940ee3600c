"""The replay source reads a real capture as the agent reads NVML on the same GPU.

``bench/gpu_check.sh`` ran on a rented machine with one NVIDIA H200 (driver 580.159.04) and
saved ``nvidia-smi -q -x`` and, about a second later, the agent's own reading of NVML
(``gpuroster-agent --print``), twice:

* ``busy`` (step 5): one CUDA process of a system account (uid 999) holding GPU 0;
* ``mps`` (step 7): that process, and under the Multi-Process Service two CUDA processes of
  ``gr-intruder`` (uid 20002) as MPS clients. nvidia-smi types the clients ``M+C``; NVML's
  compute list names both clients and the MPS server, which the control daemon started
  under the clients' uid.

Captures under tests/data/corpus/gpuroster__h200-driver580-*.xml, readings under
tests/data/nvml/. What a capture and NVML both state about the device and its processes
must come out of the replay source as the agent read it from NVML; readings that move by
the second (temperature, power, memory in use) within a small margin.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agent.policy import judge
from agent.replay import parse_capture
from agent.schema import DeviceReport, HostPolicy, ProcessReport, ReservationEntry

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = {"busy": 1, "mps": 4}  # name -> compute processes listed

# fields both sources state that do not change between two reads a second apart
STATIC = ("uuid", "index", "name", "pci_bus_id", "memory_total_mib", "power_limit_w", "persistence_mode",
          "compute_mode", "mig_mode", "parent_uuid", "ecc_uncorrected", "health", "processes_status")
# readings that move: the largest difference taken as the same state (units of each field)
MOVING = {"temperature_c": 2.0, "power_draw_w": 10.0, "memory_used_mib": 16.0, "memory_reserved_mib": 2.0,
          "utilization_gpu": 5.0, "utilization_memory": 5.0}


@pytest.fixture(scope="module", params=sorted(CASES))
def both(request) -> tuple:
    capture = DATA / "corpus" / f"gpuroster__h200-driver580-{request.param}.xml"
    reading = DATA / "nvml" / f"h200-driver580-{request.param}.agent.json"
    cap = parse_capture(capture.read_bytes(), capture.name)
    return cap, json.loads(reading.read_text()), CASES[request.param]


def test_versions_agree(both):
    cap, nvml, _ = both
    assert (cap.driver_version, cap.cuda_version) == (nvml["driver_version"], nvml["cuda_version"]) == ("580.159.04", "13.0")


def test_device_fields_agree(both):
    cap, nvml, _ = both
    assert [d.uuid for d in cap.devices] == [d["uuid"] for d in nvml["devices"]]
    for replayed, read in zip(cap.devices, nvml["devices"], strict=True):
        got = replayed.model_dump()
        assert {f: got[f] for f in STATIC} == {f: read[f] for f in STATIC}
        for field, margin in MOVING.items():
            assert got[field] is not None and read[field] is not None, field
            assert abs(got[field] - read[field]) <= margin, (field, got[field], read[field])


def test_health_checks_agree_where_nvml_reports_them(both):
    """The agent sends only checks that are not ``ok``; the capture must not find more."""
    cap, nvml, _ = both
    for replayed, read in zip(cap.devices, nvml["devices"], strict=True):
        not_ok = {(c.kind, c.state) for c in replayed.health_checks if c.state != "ok"}
        sent = {(c["kind"], c["state"]) for c in read["health_checks"]}
        # NVML's XID event set is read only by the agent's loop, never by one --print poll's capture
        assert not_ok - {("xid", "unknown")} == sent
        assert ("retired_pages_pending", "unknown") in sent  # Hopper retires no pages: it remaps rows


def test_process_rows_agree(both):
    cap, nvml, listed = both
    replayed = sorted((p.device_uuid, p.pid, p.type, p.used_memory_mib) for p in cap.processes)
    read = sorted((p["device_uuid"], p["pid"], p["type"], p["used_memory_mib"]) for p in nvml["processes"])
    assert replayed == read and len(read) == listed
    # the capture names the executable; the agent the full command line it read from /proc
    commands = {p["pid"]: p["command"] for p in nvml["processes"]}
    for proc in cap.processes:
        full = commands[proc.pid]
        assert full == proc.command or full.startswith(proc.command + " ") or full.split()[0].endswith("/" + proc.command)


def _mps_reading() -> tuple[list[ProcessReport], list[DeviceReport], datetime]:
    nvml = json.loads((DATA / "nvml" / "h200-driver580-mps.agent.json").read_text())
    return ([ProcessReport.model_validate(p) for p in nvml["processes"]],
            [DeviceReport.model_validate(d) for d in nvml["devices"]], datetime.fromisoformat(nvml["collected_at"]))


def _reservation(unix_name: str, uid: int, gpu: str, now: datetime) -> ReservationEntry:
    return ReservationEntry(id=1, user=unix_name, unix_name=unix_name, unix_uid=uid, device_uuids=[gpu],
                            start=now - timedelta(hours=1), end=now + timedelta(hours=1))


def test_mps_clients_and_their_server_are_judged_as_the_clients_user():
    """Under MPS the server runs as its clients' user: held by that user, nothing is a
    finding; held by someone else, the clients and the server are, and only they."""
    processes, devices, now = _mps_reading()
    gpu = devices[0].uuid
    mps = {p.pid for p in processes if p.uid == 20002}
    assert len(mps) == 3 and {p.name for p in processes if p.pid in mps} == {"python3", "nvidia-cuda-mps-server"}
    policy = HostPolicy(policy="terminate")
    own = judge(processes, [_reservation("gr-intruder", 20002, gpu, now)], policy, now=now, devices=devices,
                include_idle=False)
    assert own == []
    other = judge(processes, [_reservation("gr-holder", 20001, gpu, now)], policy, now=now, devices=devices,
                  include_idle=False)
    assert {(j.pid, j.kind, j.unix_user) for j in other} == {(pid, "foreign", "gr-intruder") for pid in mps}
    # the process of uid 999 (a system account, below min_uid) is judged by nobody
    assert all(j.pid in mps for j in other)
