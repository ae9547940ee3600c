"""The replay source: ``nvidia-smi -q -x`` captures played back as if read from NVML.

Every capture is parsed once at start-up and the captures are cycled, one per poll. An
owners map (JSON: ``{"<pid>": {"user": "alice", "uid": 1001, "container_id": "..."}}``,
or ``{"<pid>": "alice"}``) gives replayed pids an owner, so a machine without GPUs can run
the whole system on a real host's state. Replayed pids are never looked up on this machine.

The parser tolerates what real captures contain: ``N/A``, ``[N/A]``, ``[Not Supported]``,
``Not available in WDDM driver model``, ``ERR!``, empty values, missing elements and an
``attached_gpus`` count that disagrees with the ``<gpu>`` list. GPUs are keyed by UUID
(or bus id when the UUID is missing) and numbered in PCI bus order like NVML, never in
document order (which may differ from PCI order).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from agent.nvml_health import ecc_check, flag_check, slowdown_checks
from agent.schema import DeviceReport, HealthCheck, MonitoringReport
from agent.telemetry import PID_MAX_LIMIT, RawProcess, Telemetry, bogus_pid, log

_NUMBER = re.compile(r"^\s*\[?\s*(-?\d+(?:\.\d+)?)")


def _text(el: ET.Element | None, path: str) -> str | None:
    """Stripped text of ``path`` under ``el``; ``None`` if missing or empty."""
    if el is None:
        return None
    node = el.find(path)
    if node is None or node.text is None:
        return None
    value = node.text.strip()
    return value or None


def _num(el: ET.Element | None, *paths: str) -> float | None:
    """The first of ``paths`` that holds a number ("81920 MiB" -> 81920.0); ``None`` for
    N/A, [Not Supported], ERR!, WDDM notes, empty or missing values."""
    for path in paths:
        value = _text(el, path)
        if value is None:
            continue
        m = _NUMBER.match(value)
        if m:
            return float(m.group(1))
    return None


def _int(el: ET.Element | None, *paths: str) -> int | None:
    value = _num(el, *paths)
    return int(value) if value is not None and value >= 0 else None


def _flag(el: ET.Element | None, path: str) -> bool | None:
    value = (_text(el, path) or "").lower()
    if value in ("enabled", "yes", "on"):
        return True
    if value in ("disabled", "no", "off"):
        return False
    return None


def _word(el: ET.Element | None, path: str) -> str | None:
    """A textual value ("Default", "Enabled"); ``None`` for N/A, [Not Supported], ERR! and empty."""
    value = _text(el, path)
    if value is None or value.startswith(("N/A", "[")) or value.upper().startswith("ERR") or value.startswith("Not "):
        return None
    return value


def _sum(values: list[float | None]) -> int | None:
    known = [v for v in values if v is not None]
    return int(sum(known)) if known else None


def _ecc_uncorrected(gpu: ET.Element) -> int | None:
    """Volatile uncorrectable ECC errors: ``double_bit/total`` (old schema) or the sum of the
    ``*_uncorrectable*`` counters (DTD v12/v13)."""
    vol = gpu.find("ecc_errors/volatile")
    if vol is None:
        return None
    old = _int(vol, "double_bit/total")
    if old is not None:
        return old
    return _sum([_num(child, ".") for child in vol if "uncorrectable" in child.tag and child.tag.startswith(("sram", "dram"))])


def _health(gpu: ET.Element, ecc: int | None, throttle: list[str] | None) -> list[HealthCheck]:
    """The health checks a capture can say: ECC (volatile, uncorrectable), pending page
    retirement (``retired_pages/pending_retirement``), row remapping (``remapped_rows``),
    slowdowns; XID events are not in captures (``unknown``)."""
    return [
        ecc_check(ecc),
        flag_check("retired_pages_pending", _flag(gpu, "retired_pages/pending_retirement")),
        flag_check("remapped_rows_pending", _flag(gpu, "remapped_rows/remapped_row_pending"),
                   _int(gpu, "remapped_rows/remapped_row_unc")),
        flag_check("remapped_rows_failure", _flag(gpu, "remapped_rows/remapped_row_failure")),
        *slowdown_checks(throttle),
        HealthCheck(kind="xid", state="unknown"),
    ]


def _throttle(gpu: ET.Element) -> list[str] | None:
    block = gpu.find("clocks_event_reasons")
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
    if block is None or len(block) == 0:
        return None
    active, known = [], False
    for child in block:
        value = (child.text or "").strip().lower()
        if value in ("active", "not active"):
            known = True
        if value == "active":
            active.append(re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag))
    return active if known else None


@dataclass(slots=True)
class Capture:
    """One parsed capture file."""

    name: str
    devices: list[DeviceReport]
    processes: list[RawProcess]
    driver_version: str | None
    cuda_version: str | None
    notes: list[str] = field(default_factory=list)
    bogus_pids: int = 0


def parse_capture(data: bytes | str, name: str = "capture.xml", *, pid_max: int | None = None) -> Capture:
    """Parse one ``nvidia-smi -q -x`` document into devices and processes.

    MIG instances (``<mig_devices>``) become devices of their own with ``parent_uuid`` set.
    Captures carry no MIG UUIDs, so each gets ``MIG-<parent uuid>/<gi>/<ci>``: stable for the
    capture, keyed on the GPU-instance and compute-instance ids, never on the MIG index.
    Raises ``ValueError`` only for a document that is not XML at all.
    """
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise ValueError(f"{name}: not an nvidia-smi XML capture: {exc}") from None
    pid_max = pid_max or PID_MAX_LIMIT  # the capture comes from another host: use Linux's limit
    notes: list[str] = []
    gpus = root.findall("gpu")
    attached = _int(root, "attached_gpus")
    if attached is not None and attached != len(gpus):
        notes.append(f"{name}: attached_gpus says {attached}, the capture lists {len(gpus)}")

    parsed: dict[str, tuple[str, ET.Element]] = {}
    for gpu in gpus:
        bus = _text(gpu, "pci/pci_bus_id") or (gpu.get("id") or "").strip() or None
        uuid = _text(gpu, "uuid") or (f"GPU-bus-{bus}" if bus else None)
        if uuid is None:
            notes.append(f"{name}: a <gpu> without uuid or bus id was skipped")
            continue
        if uuid in parsed:
            notes.append(f"{name}: duplicate GPU {uuid} skipped")
            continue
        parsed[uuid] = (bus or "", gpu)

    # NVML numbers GPUs in PCI bus order; document order (and minor_number) may differ.
    order = sorted(parsed, key=lambda u: (parsed[u][0].lower(), u))
    devices: list[DeviceReport] = []
    processes: list[RawProcess] = []
    bogus = 0
    for index, uuid in enumerate(order):
        bus, gpu = parsed[uuid]
        limit = _num(gpu, "power_readings/enforced_power_limit", "power_readings/power_limit",
                     "gpu_power_readings/current_power_limit", "gpu_power_readings/enforced_power_limit")
        retired = _sum([_num(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
                        _num(gpu, "retired_pages/double_bit_retirement/retired_count")])
        util_gpu = _num(gpu, "utilization/gpu_util")
        util_mem = _num(gpu, "utilization/memory_util")
        throttle, ecc = _throttle(gpu), _ecc_uncorrected(gpu)
        devices.append(DeviceReport(
            uuid=uuid,
            index=index,
            name=(_text(gpu, "product_name") or None),
            pci_bus_id=bus or None,
            memory_total_mib=_num(gpu, "fb_memory_usage/total"),
            memory_used_mib=_num(gpu, "fb_memory_usage/used"),
            memory_reserved_mib=_num(gpu, "fb_memory_usage/reserved"),
            utilization_gpu=util_gpu if util_gpu is not None and util_gpu <= 100 else None,
            utilization_memory=util_mem if util_mem is not None and util_mem <= 100 else None,
            temperature_c=_num(gpu, "temperature/gpu_temp"),
            power_draw_w=_num(gpu, "power_readings/power_draw", "gpu_power_readings/power_draw",
                              "gpu_power_readings/instant_power_draw", "gpu_power_readings/average_power_draw"),
            power_limit_w=limit,
            throttle_reasons=throttle,
            ecc_uncorrected=ecc,
            health_checks=_health(gpu, ecc, throttle),
            retired_pages=retired,
            persistence_mode=_flag(gpu, "persistence_mode"),
            compute_mode=_word(gpu, "compute_mode"),
            mig_mode=_flag(gpu, "mig_mode/current_mig"),
            processes_status="ok" if gpu.find("processes") is not None else "unavailable",
            processes_error=None if gpu.find("processes") is not None else "capture has no <processes> element",
        ))
        parent = devices[-1]
        mig_map: dict[tuple[int | None, int | None], str] = {}
        mig_devices = gpu.findall("mig_devices/mig_device")
        for mig in sorted(mig_devices, key=lambda m: (_int(m, "gpu_instance_id") or 0, _int(m, "compute_instance_id") or 0)):
            gi, ci = _int(mig, "gpu_instance_id"), _int(mig, "compute_instance_id")
            mig_uuid = _text(mig, "uuid") or f"MIG-{uuid}/{gi}/{ci}"
            mig_map[(gi, ci)] = mig_uuid
            mig_map.setdefault((gi, None), mig_uuid)
            devices.append(DeviceReport(
                uuid=mig_uuid,
                index=_int(mig, "index"),
                name=_text(mig, "name") or (f"{parent.name} MIG" if parent.name else None),
                memory_total_mib=_num(mig, "fb_memory_usage/total"),
                memory_used_mib=_num(mig, "fb_memory_usage/used"),
                memory_reserved_mib=_num(mig, "fb_memory_usage/reserved"),
                parent_uuid=uuid,
                mig_profile=_text(mig, "profile"),
                gpu_instance_id=gi,
                compute_instance_id=ci,
                mig_mode=True,
                ecc_uncorrected=_int(mig, "ecc_error_count/volatile_count/sram_uncorrectable"),
                processes_status=parent.processes_status,
                processes_error=parent.processes_error,
            ))
        merged: dict[tuple[str, int], RawProcess] = {}
        for info in gpu.findall("processes/process_info"):
            pid = _int(info, "pid")
            if pid is None or bogus_pid(pid, pid_max):
                bogus += 1
                continue
            target = uuid
            gi, ci = _int(info, "gpu_instance_id"), _int(info, "compute_instance_id")
            if mig_map and gi is not None:
                target = mig_map.get((gi, ci)) or mig_map.get((gi, None)) or uuid
            ptype = (_text(info, "type") or "C").upper().replace(" ", "")
            if ptype not in ("C", "G", "C+G"):
                # nvidia-smi's "M+C" is an MPS client: NVML lists it among the compute processes
                ptype = "C"
            key = (target, pid)
            mem = _num(info, "used_memory")
            if key in merged:  # the same pid listed twice on one GPU: merge like NVML's two lists
                seen = merged[key]
                if seen.type != ptype:
                    seen.type = "C+G"
                if mem is not None and (seen.used_memory_mib is None or mem > seen.used_memory_mib):
                    seen.used_memory_mib = mem
                continue
            merged[key] = RawProcess(device_uuid=target, pid=pid, type=ptype, used_memory_mib=mem,  # type: ignore[arg-type]
                                     command=_text(info, "process_name"))
        processes.extend(merged.values())
    return Capture(
        name=name,
        devices=devices,
        processes=processes,
        driver_version=_text(root, "driver_version"),
        cuda_version=_word(root, "cuda_version"),
        notes=notes,
        bogus_pids=bogus,
    )


def load_owners(path: Path | None) -> dict[int, dict]:
    """Read a replay owners map: ``{"<pid>": {"user": str, "uid": int, "container_id": str}}``.

    A bare string value is the user name. Raises ``ValueError`` naming the bad entry.
    """
    if path is None:
        return {}
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of pid -> owner")
    owners: dict[int, dict] = {}
    for key, value in raw.items():
        if key.startswith("_"):
            continue  # comments
        try:
            pid = int(key)
        except ValueError:
            raise ValueError(f"{path}: key {key!r} is not a pid") from None
        if isinstance(value, str):
            value = {"user": value}
        if not isinstance(value, dict):
            raise ValueError(f"{path}: owner of pid {pid} must be an object or a user name")
        uid = value.get("uid")
        owners[pid] = {
            "user": value.get("user") or value.get("unix_user"),
            "uid": int(uid) if uid is not None else None,
            "container_id": value.get("container_id"),
        }
    return owners


class ReplaySource:
    """Cycle through captures, one per poll, with source="replay" and ``replay_of`` set."""

    def __init__(self, files: list[Path], owners: Path | None = None) -> None:
        if not files:
            raise ValueError("replay needs at least one capture file")
        self.captures = [parse_capture(Path(f).read_bytes(), Path(f).name) for f in files]
        for cap in self.captures:
            for note in cap.notes:
                log.info("replay: %s", note)
        self.owners = load_owners(owners)
        self._next = 0

    def poll(self) -> Telemetry:
        """The next capture, as telemetry."""
        cap = self.captures[self._next % len(self.captures)]
        self._next += 1
        suspect = []
        if cap.bogus_pids:
            suspect.append(f"capture {cap.name} lists {cap.bogus_pids} bogus pid(s) (0, >= pid_max, 2^32-1); driver {cap.driver_version}")
        return Telemetry(
            source="replay",
            devices=[d.model_copy(deep=True) for d in cap.devices],
            processes=[RawProcess(p.device_uuid, p.pid, p.type, p.used_memory_mib, p.command) for p in cap.processes],
            monitoring=MonitoringReport(status="ok", message="; ".join(cap.notes)[:2048] or None),
            driver_version=cap.driver_version,
            cuda_version=cap.cuda_version,
            suspect_reasons=suspect,
            replay_of=[cap.name],
            replay_owners=self.owners,
        )

    def close(self) -> None:
        """Nothing to release."""
