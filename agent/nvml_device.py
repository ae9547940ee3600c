"""Reading one GPU (and its MIG instances) through the NVML choke point.

:class:`DeviceReader` is the half of :class:`agent.nvml.NvmlSource` that turns one device
handle into :class:`~agent.schema.DeviceReport` records and :class:`RawProcess` rows. It
calls NVML only through ``self._raw`` / ``self._q`` (defined on the source), so every call
is classified the same way.

Two things the binding does differently across drivers are settled here:

* process lists: the newest entry point the driver exports is used (``_v3``, then
  ``_v2``, then the unversioned symbol, as gpustat does), remembered per list kind; only
  when none exists is the list "unavailable: function not found in driver <version>";
* memory: ``nvmlDeviceGetMemoryInfo`` with the v2 structure where the driver has it
  (drivers from 510), whose ``used`` excludes the driver's reserved memory, as nvidia-smi
  shows it; the v1 structure folds reserved memory into ``used``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agent.nvml_compat import process_reader
from agent.nvml_errors import _ERR_FUNCTION_NOT_FOUND, DeviceFault, GpuLost, HostDown, NotAvailable
from agent.nvml_health import LOST_CHECKS
from agent.schema import DeviceReport
from agent.telemetry import RawProcess, bogus_pid, to_str, warn_once

MIB = 1024 * 1024
_NOT_AVAILABLE_U64 = 2**63  # anything this large is NVML's "value not available" (2^64-1), never real
_NOT_AVAILABLE_U32 = 0xFFFFFFFF

# nvmlClocksEventReason* bits (nvml.h) -> names used in DeviceReport.throttle_reasons
_THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}
_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")

# Process-list entry points, newest first: a 450/470 driver lacks the _v3 symbols. The bare
# symbol (v1 layout) is always called through agent.nvml_compat, since the binding's wrapper
# of that name calls _v3 (12.535.x) or raises NVMLLibraryMismatchError (13.x).
PROCESS_LIST_FUNCTIONS = {
    "C": ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
          "nvmlDeviceGetComputeRunningProcesses"),
    "G": ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2",
          "nvmlDeviceGetGraphicsRunningProcesses"),
}


def _mib(value: Any) -> float | None:
    """Bytes -> MiB; ``None`` for missing values and NVML's 2^64-1 "not available" sentinel."""
    if value is None or not isinstance(value, int) or value < 0 or value >= _NOT_AVAILABLE_U64:
        return None
    return value / MIB


def _watts(milliwatts: Any) -> float | None:
    if not isinstance(milliwatts, int) or milliwatts < 0 or milliwatts >= _NOT_AVAILABLE_U32:
        return None
    return milliwatts / 1000.0


def _pct(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or value < 0 or value > 100:
        return None
    return float(value)


def _cuda_version(value: Any) -> str | None:
    if not isinstance(value, int) or value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def _lost_device_uuids(gpus_dir: Path = Path("/proc/driver/nvidia/gpus")) -> list[tuple[str, str]]:
    """(bus id, UUID) for every GPU the kernel driver knows, in PCI order.

    Read from ``/proc/driver/nvidia/gpus/<bus>/information`` ("GPU UUID:" line); used to
    name a GPU whose NVML handle cannot be had (fallen off the bus, GPU_IS_LOST).
    """
    out: list[tuple[str, str]] = []
    try:
        entries = sorted(p for p in gpus_dir.iterdir() if p.is_dir())
    except OSError:
        return out
    for entry in entries:
        try:
            text = (entry / "information").read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"GPU UUID:\s*(\S+)", text)
        if m:
            out.append((entry.name, m.group(1)))
    return out



class DeviceReader:
    """Per-device reading for :class:`agent.nvml.NvmlSource` (see module doc).

    Relies on the source's ``_raw``, ``_q``, ``_lib``, ``_versions``, ``_pid_max``,
    ``_static``, ``_slow``, ``_known_by_index``, ``_lost_lookup``, ``_proc_fn`` and
    ``_mem_v2`` attributes.
    """

    def _lost(self, index: int, why: str) -> DeviceReport:
        known = self._known_by_index.get(index)
        if known is None:
            table = self._lost_lookup()
            if index < len(table):
                bus, uuid = table[index]
                known = (uuid, None, bus)
        if known is None:
            known = (f"GPU-unknown-index-{index}", None, None)
        uuid, name, bus = known
        return DeviceReport(uuid=uuid, index=index, name=name, pci_bus_id=bus, health="lost", error=why[:1024],
                            processes_status="unavailable", processes_error="GPU lost",
                            health_checks=list(LOST_CHECKS))

    def _read_device(self, index: int, slow_round: bool) -> tuple[list[DeviceReport], list[RawProcess], int]:
        lib = self._lib
        try:
            handle = self._raw("nvmlDeviceGetHandleByIndex", index)
        except HostDown:
            raise
        except (NotAvailable, GpuLost, DeviceFault) as exc:
            return [self._lost(index, f"Unable to determine the device handle for GPU {index}: {exc}")], [], 0
        try:
            return self._read_handle(lib, index, handle, slow_round)
        except GpuLost as exc:
            return [self._lost(index, str(exc))], [], 0

    def _read_handle(self, lib: Any, index: int, handle: Any, slow_round: bool) -> tuple[list[DeviceReport], list[RawProcess], int]:
        errs: list[str] = []
        q = self._q
        uuid = to_str(q(errs, "nvmlDeviceGetUUID", handle), "GPU UUID")
        static = self._static.get(uuid or "")
        if static is None:
            name = to_str(q(errs, "nvmlDeviceGetName", handle), "GPU name")
            pci = q(errs, "nvmlDeviceGetPciInfo", handle)
            bus = to_str(getattr(pci, "busId", None), "PCI bus id") if pci is not None else None
            static = (name, bus)
            if uuid:
                self._static[uuid] = static
        name, bus = static
        if not uuid:
            uuid = f"GPU-bus-{bus}" if bus else f"GPU-unknown-index-{index}"
        self._known_by_index[index] = (uuid, name, bus)

        mem = self._memory(errs, handle)
        util = q(errs, "nvmlDeviceGetUtilizationRates", handle)
        temp = q(errs, "nvmlDeviceGetTemperature", handle, getattr(lib, "NVML_TEMPERATURE_GPU", 0))
        power = q(errs, "nvmlDeviceGetPowerUsage", handle)
        limit = q(errs, "nvmlDeviceGetEnforcedPowerLimit", handle)
        reasons = q(errs, "nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:
            reasons = q(errs, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        slow = self._slow.get(uuid)
        if slow is None or slow_round:
            slow = self._read_slow(errs, lib, handle)
            self._slow[uuid] = slow

        device = DeviceReport(
            uuid=uuid,
            index=index,
            name=name[:256] if name else None,
            pci_bus_id=bus,
            memory_total_mib=_mib(getattr(mem, "total", None)),
            memory_used_mib=_mib(getattr(mem, "used", None)),
            memory_reserved_mib=_mib(getattr(mem, "reserved", None)),
            utilization_gpu=_pct(getattr(util, "gpu", None)),
            utilization_memory=_pct(getattr(util, "memory", None)),
            temperature_c=float(temp) if isinstance(temp, (int, float)) and 0 < temp < 1000 else None,
            power_draw_w=_watts(power),
            power_limit_w=_watts(limit),
            throttle_reasons=[n for bit, n in _THROTTLE_BITS.items() if reasons & bit] if isinstance(reasons, int) else None,
            **slow,
        )
        device.health_checks = self._device_health(errs, handle, uuid, device.throttle_reasons, slow.get("ecc_uncorrected"),
                                                   slow_round)
        mig_devices: list[DeviceReport] = []
        mig_map: dict[tuple[int, int | None], str] = {}
        if slow.get("mig_mode"):
            mig_devices = self._read_mig(errs, uuid, handle)
            for md in mig_devices:
                mig_map[(md.gpu_instance_id, md.compute_instance_id)] = md.uuid  # type: ignore[index]
                mig_map.setdefault((md.gpu_instance_id, None), md.uuid)  # type: ignore[arg-type]
        procs, bogus, status, perr = self._read_processes(handle, uuid, mig_map)
        for dev in (device, *mig_devices):
            dev.processes_status = status  # MIG instances are listed through their parent
            dev.processes_error = perr
        if errs:
            device.health = "error"
            device.error = "; ".join(errs)[:1024]
        return [device, *mig_devices], procs, bogus

    def _memory(self, errs: list[str], handle: Any) -> Any:
        """``nvmlDeviceGetMemoryInfo`` with the v2 structure (``nvmlMemory_v2``) where both the
        binding and the driver have it, else v1; ``None`` when not available.

        v2's ``used`` is what nvidia-smi shows and ``reserved`` is the driver's share apart;
        v1's ``used`` includes the reserved memory. A driver without the ``_v2`` symbol
        (before 510) is remembered, so v2 is asked once, not on every poll; a v2 call that
        fails otherwise falls back to v1 for that reading.
        """
        version = getattr(self._lib, "nvmlMemory_v2", None)
        if version is not None and self._mem_v2 is not False:
            try:
                mem = self._raw("nvmlDeviceGetMemoryInfo", handle, version)
                self._mem_v2 = True
                return mem
            except NotAvailable as exc:
                if exc.code == _ERR_FUNCTION_NOT_FOUND:
                    self._mem_v2 = False  # the driver predates v2: never ask again
                # otherwise (e.g. NotSupported on this device) v1 may still answer
        return self._q(errs, "nvmlDeviceGetMemoryInfo", handle)

    def _list(self, kind: str, handle: Any) -> list[Any]:
        """One process list (``kind`` "C" compute, "G" graphics) from the newest entry point the
        driver exports (:data:`PROCESS_LIST_FUNCTIONS`); the one that worked is remembered.

        Raises :class:`NotAvailable` (code FunctionNotFound when no version exists) or
        :class:`DeviceFault`.
        """
        names = PROCESS_LIST_FUNCTIONS[kind]
        known = self._proc_fn.get(kind)
        if known is not None:
            names = names[names.index(known):]
        missing: NotAvailable | None = None
        for name in names:
            fn = None
            if name == PROCESS_LIST_FUNCTIONS[kind][-1] or getattr(self._lib, name, None) is None:
                fn = process_reader(self._lib, name)
            try:
                rows = self._raw(name, handle, fn=fn) or []
            except NotAvailable as exc:
                if exc.code != _ERR_FUNCTION_NOT_FOUND:
                    raise
                missing = exc
                continue
            self._proc_fn[kind] = name
            return list(rows)
        raise missing or NotAvailable("no process-list function", _ERR_FUNCTION_NOT_FOUND)

    def _read_slow(self, errs: list[str], lib: Any, handle: Any) -> dict[str, Any]:
        """Fields that change rarely (read every ``slow_every`` polls)."""
        q = self._q
        ecc = q(errs, "nvmlDeviceGetTotalEccErrors", handle,
                getattr(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), getattr(lib, "NVML_VOLATILE_ECC", 0))
        retired: int | None = None
        for cause in (getattr(lib, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
                      getattr(lib, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)):
            pages = q(errs, "nvmlDeviceGetRetiredPages", handle, cause)
            if isinstance(pages, (list, tuple)):
                retired = (retired or 0) + len(pages)
        persistence = q(errs, "nvmlDeviceGetPersistenceMode", handle)
        compute = q(errs, "nvmlDeviceGetComputeMode", handle)
        mig = q(errs, "nvmlDeviceGetMigMode", handle)
        mig_current = mig[0] if isinstance(mig, (list, tuple)) and mig else None
        return {
            "ecc_uncorrected": ecc if isinstance(ecc, int) and 0 <= ecc < _NOT_AVAILABLE_U64 else None,
            "retired_pages": retired,
            "persistence_mode": bool(persistence) if isinstance(persistence, int) else None,
            "compute_mode": _COMPUTE_MODES.get(compute) if isinstance(compute, int) else None,
            "mig_mode": bool(mig_current == 1) if isinstance(mig_current, int) else None,
        }

    def _read_mig(self, errs: list[str], parent_uuid: str, handle: Any) -> list[DeviceReport]:
        """MIG instances of one GPU as devices of their own (each MIG instance is reservable on its own).

        A MIG device whose UUID cannot be read gets ``MIG-<parent uuid>/<gi>/<ci>``: stable for
        as long as the instance exists, never the MIG index alone.
        """
        q = self._q
        count = q(errs, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        found: list[tuple[int, int, DeviceReport]] = []
        for slot in range(int(count)):
            try:
                mh = self._raw("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            except NotAvailable:
                continue  # empty slot (NotFound) or no permission to see it
            except DeviceFault as exc:
                errs.append(str(exc))
                continue
            merrs: list[str] = []
            gi = q(merrs, "nvmlDeviceGetGpuInstanceId", mh)
            ci = q(merrs, "nvmlDeviceGetComputeInstanceId", mh)
            gi = gi if isinstance(gi, int) and gi < _NOT_AVAILABLE_U32 else None
            ci = ci if isinstance(ci, int) and ci < _NOT_AVAILABLE_U32 else None
            uuid = to_str(q(merrs, "nvmlDeviceGetUUID", mh), "MIG UUID") or f"MIG-{parent_uuid}/{gi}/{ci}"
            name = to_str(q(merrs, "nvmlDeviceGetName", mh), "MIG name")
            profile = _MIG_PROFILE.search(name or "")
            mem = self._memory(merrs, mh)
            util = q(merrs, "nvmlDeviceGetUtilizationRates", mh)
            dev = DeviceReport(
                uuid=uuid,
                name=name[:256] if name else None,
                memory_total_mib=_mib(getattr(mem, "total", None)),
                memory_used_mib=_mib(getattr(mem, "used", None)),
                utilization_gpu=_pct(getattr(util, "gpu", None)),
                utilization_memory=_pct(getattr(util, "memory", None)),
                parent_uuid=parent_uuid,
                mig_profile=profile.group(1) if profile else None,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                mig_mode=True,
                processes_status="ok",
            )
            if merrs:
                dev.health = "error"
                dev.error = "; ".join(merrs)[:1024]
            found.append((gi if gi is not None else 1 << 30, ci or 0, dev))
        found.sort(key=lambda t: (t[0], t[1]))
        for position, (_, _, dev) in enumerate(found):
            dev.index = position
        return [d for _, _, d in found]

    def _read_processes(
        self, handle: Any, uuid: str, mig_map: dict[tuple[int, int | None], str]
    ) -> tuple[list[RawProcess], int, str, str | None]:
        """Compute and graphics lists merged by pid (C, G, C+G); bogus pids dropped (a misread struct or a process of another PID namespace).

        Returns (processes, bogus pid count, processes_status, processes_error).
        """
        merged: dict[tuple[str, int], RawProcess] = {}
        failures: list[tuple[str, NotAvailable | DeviceFault]] = []
        bogus = 0
        for kind in ("C", "G"):
            try:
                rows = self._list(kind, handle)
            except (NotAvailable, DeviceFault) as exc:
                failures.append((kind, exc))
                continue
            for row in rows:
                pid = getattr(row, "pid", None)
                if bogus_pid(pid, self._pid_max):
                    bogus += 1
                    continue
                gi = getattr(row, "gpuInstanceId", None)
                ci = getattr(row, "computeInstanceId", None)
                target = uuid
                if mig_map and isinstance(gi, int) and gi < _NOT_AVAILABLE_U32:
                    target = mig_map.get((gi, ci if isinstance(ci, int) else None)) or mig_map.get((gi, None)) or uuid
                mem = _mib(getattr(row, "usedGpuMemory", None))
                key = (target, pid)
                seen = merged.get(key)
                if seen is None:
                    merged[key] = RawProcess(device_uuid=target, pid=pid, type=kind, used_memory_mib=mem)  # type: ignore[arg-type]
                else:
                    if seen.type != kind and seen.type != "C+G":
                        seen.type = "C+G"
                    if mem is not None and (seen.used_memory_mib is None or mem > seen.used_memory_mib):
                        seen.used_memory_mib = mem
        status, error = "ok", None
        if failures:
            driver = self._versions.get("driver")
            parts = []
            for kind, exc in failures:
                label = "compute" if kind == "C" else "graphics"
                if isinstance(exc, NotAvailable) and exc.code == _ERR_FUNCTION_NOT_FOUND:
                    parts.append(f"{label}: function not found in driver {driver}")
                else:
                    parts.append(f"{label}: {exc}")
            all_na = all(isinstance(e, NotAvailable) for _, e in failures)
            if all(kind == "G" for kind, _ in failures):
                # The compute list worked: the device is observed for compute processes; only
                # the graphics part is missing (many datacenter GPUs do not support it).
                status = "ok"
                error = "graphics list " + ("unavailable" if all_na else "failed") + ": " + "; ".join(parts)
            else:
                status = "unavailable" if all_na else "error"
                error = ("unavailable: " if all_na else "") + "; ".join(parts)
            warn_once(f"procs:{uuid}:{error}", "process listing on %s: %s", uuid, error)
        return list(merged.values()), bogus, status, error[:1024] if error else None
