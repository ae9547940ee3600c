"""The replay source against every real capture of the corpus (tests/data/corpus).

Expected values are read from each file here, independently of the parser under test,
with ``xml.etree`` and a few regexes.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from agent.collect import SnapshotBuilder
from agent.replay import ReplaySource, load_owners, parse_capture
from tests.agent.conftest import CORPUS_XML, T0

PACKAGE = Path(__file__).resolve().parents[2] / "agent"
CAPTURES = PACKAGE / "captures"


def _number(text: str | None) -> float | None:
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*MiB", text or "")
    return float(m.group(1)) if m else None


def _expected(path: Path) -> dict:
    root = ET.parse(path).getroot()
    gpus = {}
    procs = []
    for gpu in root.iter("gpu"):
        uuid = gpu.findtext("uuid").strip()
        gpus[uuid] = {
            "name": (gpu.findtext("product_name") or "").strip(),
            "total": _number(gpu.findtext("fb_memory_usage/total")),
            "used": _number(gpu.findtext("fb_memory_usage/used")),
            "reserved": _number(gpu.findtext("fb_memory_usage/reserved")),
            "migs": len(gpu.findall("mig_devices/mig_device")),
            "bus": (gpu.findtext("pci/pci_bus_id") or gpu.get("id")).strip(),
        }
        for info in gpu.findall("processes/process_info"):
            kind = (info.findtext("type") or "").strip()
            kind = "C" if kind == "M+C" else kind  # an MPS client is in NVML's compute list
            procs.append((uuid, int(info.findtext("pid")), _number(info.findtext("used_memory")), kind))
    return {"gpus": gpus, "procs": procs, "n_gpu_elements": len(re.findall(rb"<gpu id=", path.read_bytes()))}


def test_corpus_is_there(corpus_files):
    assert len(corpus_files) >= 15


@pytest.mark.parametrize("path", CORPUS_XML, ids=[p.name for p in CORPUS_XML])
def test_every_corpus_capture_parses_to_the_values_in_the_file(path):
    want = _expected(path)
    cap = parse_capture(path.read_bytes(), path.name)
    whole = [d for d in cap.devices if d.parent_uuid is None]
    migs = [d for d in cap.devices if d.parent_uuid is not None]
    assert len(whole) == want["n_gpu_elements"] == len(want["gpus"])
    assert {d.uuid for d in whole} == set(want["gpus"])
    for d in whole:
        w = want["gpus"][d.uuid]
        assert d.name == w["name"]
        assert d.memory_total_mib == w["total"]
        assert d.memory_used_mib == w["used"]
        assert d.memory_reserved_mib == w["reserved"]
        assert d.pci_bus_id == w["bus"]
        assert len([m for m in migs if m.parent_uuid == d.uuid]) == w["migs"]
    # process rows: one per (device, pid); MIG processes land on a MIG device of the same GPU
    got = sorted((p.pid, p.used_memory_mib, p.type) for p in cap.processes)
    assert got == sorted((pid, mem, t) for _, pid, mem, t in want["procs"])
    parents = {d.uuid: (d.parent_uuid or d.uuid) for d in cap.devices}
    assert sorted((parents[p.device_uuid], p.pid) for p in cap.processes) == sorted((u, pid) for u, pid, _, _ in want["procs"])
    # indices are NVML's: PCI bus order, 0..n-1
    assert sorted(d.index for d in whole) == list(range(len(whole)))
    assert [d.index for d in sorted(whole, key=lambda d: d.pci_bus_id.lower())] == list(range(len(whole)))


def test_b17_out_of_order_capture_keyed_by_bus_id_not_document_order():
    cap = parse_capture((CAPTURES / "pai__nvidia_smi_out_of_order.xml").read_bytes())
    by_index = {d.index: (d.pci_bus_id, d.uuid) for d in cap.devices}
    assert by_index == {
        0: ("00001580:00:00.0", "GPU-c3b26f7a-8dcb-619c-fa1b-8029265a4db0"),
        1: ("00002DF7:00:00.0", "GPU-b01b80eb-0f18-1df0-cf88-0725bd90f1e1"),
        2: ("00004968:00:00.0", "GPU-30bc2701-3bc2-5f35-0ebd-9867a077e138"),
        3: ("0000F8D6:00:00.0", "GPU-3341aba2-f01d-2c1f-7dd4-e389779faec2"),
    }
    procs = {p.pid: p.device_uuid for p in cap.processes}
    assert procs == {58813: "GPU-c3b26f7a-8dcb-619c-fa1b-8029265a4db0", 58642: "GPU-b01b80eb-0f18-1df0-cf88-0725bd90f1e1"}
    # reversing the document order changes nothing
    root = ET.fromstring((CAPTURES / "pai__nvidia_smi_out_of_order.xml").read_bytes())
    gpus = root.findall("gpu")
    for g in gpus:
        root.remove(g)
    for g in reversed(gpus):
        root.append(g)
    again = parse_capture(ET.tostring(root))
    assert {d.index: d.uuid for d in again.devices} == {k: v[1] for k, v in by_index.items()}


def test_mig_capture_devices_with_derived_stable_uuids():
    cap = parse_capture((CAPTURES / "telegraf__a100-sxm4-v12.xml").read_bytes(), "a100.xml")
    parent, *migs = cap.devices
    assert parent.mig_mode is True and parent.utilization_gpu is None
    assert [m.gpu_instance_id for m in migs] == [3, 4, 5, 6]
    assert [m.uuid for m in migs] == [f"MIG-{parent.uuid}/{gi}/0" for gi in (3, 4, 5, 6)]
    assert all(m.memory_total_mib == 19968 and m.memory_used_mib == 12 for m in migs)
    assert "attached_gpus says 4" in cap.notes[0]
    assert parse_capture((CAPTURES / "telegraf__a100-sxm4-v12.xml").read_bytes()).devices[1].uuid == migs[0].uuid


def test_b04_b15_vgpu_capture_memory_unknown_names_empty():
    path = next(p for p in CORPUS_XML if p.name == "telegraf__tesla_p4.xml")
    src = ReplaySource([path])
    snap = SnapshotBuilder(src, host="vm").build(1, T0)
    assert len(snap.processes) == 13
    assert all(p.type == "C+G" and p.used_memory_mib is None for p in snap.processes)
    unnamed = [p for p in snap.processes if p.command is None]
    assert len(unnamed) == 12 and all(p.name == "(unnamed)" for p in unnamed)  # empty <process_name>
    (named,) = [p for p in snap.processes if p.command is not None]
    assert (named.command, named.name) == ("C:\\Windows\\explorer.exe", "explorer.exe")
    assert all(p.owner_status == "unknown" and p.unix_user is None for p in snap.processes)


def test_same_pid_on_two_gpus_is_two_rows():
    cap = parse_capture((CAPTURES / "telegraf__dual_a5000-v13.xml").read_bytes())
    rows = sorted((p.device_uuid, p.used_memory_mib) for p in cap.processes if p.pid == 100477)
    assert rows == [("GPU-12345678-aaaa-bbbb-cccc-0123456789ab", 22430.0), ("GPU-12345678-aaaa-bbbb-cccc-0123456789cd", 17246.0)]


def test_b19_tolerates_na_variants_missing_elements_and_count_mismatch():
    xml = """<?xml version="1.0" ?>
    <nvidia_smi_log>
      <attached_gpus>3</attached_gpus>
      <gpu id="00000000:02:00.0">
        <product_name>GeForce GTX 770</product_name>
        <uuid>GPU-bbbb</uuid>
        <fb_memory_usage><total>[N/A]</total><used>ERR!</used></fb_memory_usage>
        <utilization><gpu_util>[Not Supported]</gpu_util><memory_util></memory_util></utilization>
        <temperature><gpu_temp>Not available in WDDM driver model</gpu_temp></temperature>
        <power_readings><power_draw>[Not Supported]</power_draw><power_limit>N/A</power_limit></power_readings>
        <compute_mode>[Not Supported]</compute_mode>
        <processes>
          <process_info><pid>0</pid><type>C</type><process_name>x</process_name><used_memory>1 MiB</used_memory></process_info>
          <process_info><pid>4242</pid><type></type><process_name></process_name><used_memory>[N/A]</used_memory></process_info>
          <process_info><type>G</type></process_info>
        </processes>
      </gpu>
      <gpu id="00000000:01:00.0"><uuid>GPU-aaaa</uuid></gpu>
    </nvidia_smi_log>"""
    cap = parse_capture(xml, "synthetic.xml")
    a, b = cap.devices
    assert (a.uuid, a.index, b.uuid, b.index) == ("GPU-aaaa", 0, "GPU-bbbb", 1)
    for f in ("memory_total_mib", "memory_used_mib", "utilization_gpu", "utilization_memory", "temperature_c",
              "power_draw_w", "power_limit_w", "compute_mode"):
        assert getattr(b, f) is None, f
    assert a.name is None and a.processes_status == "unavailable"
    assert [(p.pid, p.type, p.used_memory_mib, p.command) for p in cap.processes] == [(4242, "C", None, None)]
    assert cap.bogus_pids == 2
    assert "attached_gpus says 3" in cap.notes[0]


def test_not_xml_is_a_clear_error():
    with pytest.raises(ValueError, match="not an nvidia-smi XML capture"):
        parse_capture(b"Failed to initialize NVML: Driver/library version mismatch", "broken.xml")


def test_replay_cycles_captures_and_applies_owner_map(tmp_path):
    owners = tmp_path / "owners.json"
    owners.write_text(json.dumps({
        "58813": {"user": "user-a", "uid": 1001, "container_id": "c" * 64},
        "58642": "user-b",
        "_comment": "pids from pai__nvidia_smi_out_of_order.xml",
    }))
    src = ReplaySource([CAPTURES / "pai__nvidia_smi_out_of_order.xml", CAPTURES / "telegraf__dual_a5000-v13.xml"], owners)
    builder = SnapshotBuilder(src, host="node-01")
    first, second, third = (builder.build(i, T0) for i in range(3))
    assert first.source == "replay" and first.replay_of == ["pai__nvidia_smi_out_of_order.xml"]
    assert second.replay_of == ["telegraf__dual_a5000-v13.xml"]
    assert third.replay_of == first.replay_of and third.devices == first.devices
    by_pid = {p.pid: p for p in first.processes}
    assert (by_pid[58813].unix_user, by_pid[58813].uid, by_pid[58813].container_id) == ("user-a", 1001, "c" * 64)
    assert by_pid[58813].owner_status == "replay" and by_pid[58813].name == "python"
    assert by_pid[58642].unix_user == "user-b" and by_pid[58642].uid is None
    assert {p.owner_status for p in second.processes} == {"unknown"}  # llama-server has no owner entry
    assert first.driver_version == "430.26" and second.driver_version == "590.44.01"


def test_owner_map_errors_name_the_entry(tmp_path):
    bad = tmp_path / "owners.json"
    bad.write_text(json.dumps({"abc": "user-a"}))
    with pytest.raises(ValueError, match="'abc' is not a pid"):
        load_owners(bad)


def test_bundled_captures_sources_and_sample_owner_map():
    names = sorted(p.name for p in CAPTURES.glob("*.xml"))
    assert names == ["pai__nvidia_smi_out_of_order.xml", "telegraf__a100-sxm4-v12.xml", "telegraf__dual_a5000-v13.xml"]
    sources = (CAPTURES / "SOURCES.md").read_text()
    for name in names:
        assert name in sources
    assert sources.count("MIT") >= 3
    for upstream in ("influxdata/telegraf", "microsoft/pai"):
        assert upstream in sources
    owners = load_owners(CAPTURES / "owners.example.json")
    cap_pids = {p.pid for n in names for p in parse_capture((CAPTURES / n).read_bytes()).processes}
    assert set(owners) <= cap_pids and owners
