"""The NVML source: every ``pynvml`` call of the agent goes through :meth:`NvmlSource._raw`.

That one choke point initialises NVML once, turns "not available" answers (NotSupported,
NoPermission, FunctionNotFound, NotFound) into ``None``, logs a function missing from the
driver once with the binding and driver versions, decodes bytes, and sorts the remaining
errors into three kinds: the whole host is down (Uninitialized, LibRmVersionMismatch,
DriverNotLoaded, LibraryNotFound), one GPU is lost (GpuIsLost, or its handle cannot be
had) and one field failed (recorded on that device, the poll goes on).

Collection runs in a daemon worker thread with a deadline (2 s by default): NVML calls can
hang on a wedged GPU, and the reporting loop must carry on, marking the telemetry stale.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from agent.schema import DeviceReport, MonitoringReport
from agent.telemetry import RawProcess, Telemetry, bogus_pid, log, read_pid_max, to_str, warn_once

MIB = 1024 * 1024
_NOT_AVAILABLE_U64 = 2**63  # anything this large is NVML's "value not available" (2^64-1), never real
_NOT_AVAILABLE_U32 = 0xFFFFFFFF

# NVML error codes (numeric, as in nvml.h; pynvml exposes the same names)
_ERR_UNINITIALIZED = 1
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_LIB_RM_VERSION_MISMATCH = 18

_NA_CODES = {_ERR_NOT_SUPPORTED, _ERR_NO_PERMISSION, _ERR_FUNCTION_NOT_FOUND, _ERR_NOT_FOUND, _ERR_INVALID_ARGUMENT}
_HOST_CODES = {_ERR_UNINITIALIZED, _ERR_DRIVER_NOT_LOADED, _ERR_LIBRARY_NOT_FOUND, _ERR_LIB_RM_VERSION_MISMATCH}

MISMATCH_MESSAGE = "NVML unavailable: driver/library mismatch, reboot needed"

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

# nvidia-ml-py releases known to read the per-process struct with the wrong layout (B01):
# 12.535.77 shipped the short-lived v3 layout with usedGpuCcProtectedMemory, which R535
# and later drivers do not fill, so every second entry is garbage (pid 0 / 2^32-1).
KNOWN_BAD_BINDINGS = {
    "12.535.77": "its process-info struct has usedGpuCcProtectedMemory, which drivers >= 535 do not "
    "return; pids read at the wrong stride (fixed in 12.535.108)",
}


def binding_driver_problem(binding: str | None, driver: str | None) -> str | None:
    """Why this nvidia-ml-py / driver pair reads process lists wrongly, or ``None`` if fine.

    The only pair known to be broken is nvidia-ml-py 12.535.77 with a driver of branch 535
    or later; older drivers use the v2 entry points and are unaffected.
    """
    if not binding or binding not in KNOWN_BAD_BINDINGS:
        return None
    try:
        branch = int((driver or "0").split(".")[0])
    except ValueError:
        return None
    if branch < 535:
        return None
    return f"nvidia-ml-py {binding} with driver {driver}: {KNOWN_BAD_BINDINGS[binding]}"


class NotAvailable(Exception):
    """NVML cannot say (NotSupported, NoPermission, FunctionNotFound, NotFound)."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.code = code


class GpuLost(Exception):
    """The GPU fell off the bus or cannot be addressed (GpuIsLost, no handle)."""


class HostDown(Exception):
    """NVML as a whole is unusable (not initialised, driver/library mismatch, no library)."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.code = code


class DeviceFault(Exception):
    """One NVML call failed for another reason (Unknown Error...); recorded on the device."""


def _binding_version() -> str | None:
    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return None


def _driver_present(proc_dir: Path = Path("/proc/driver/nvidia"), sys_dir: Path = Path("/sys/module/nvidia")) -> bool:
    """True when the NVIDIA kernel driver is loaded (``/proc/driver/nvidia`` or ``/sys/module/nvidia``)."""
    return proc_dir.exists() or sys_dir.exists()


def classify_init_error(code: int | None, detail: str, *, expect_gpus: bool, driver_present: bool) -> MonitoringReport:
    """Turn an NVML start-up failure into the host's monitoring state (B09, B10).

    ``code`` is the NVML error code, or ``None`` when the ``pynvml`` module itself is missing.
    """
    if code == _ERR_LIB_RM_VERSION_MISMATCH:
        return MonitoringReport(status="down", message=MISMATCH_MESSAGE)
    if code in (None, _ERR_LIBRARY_NOT_FOUND, _ERR_DRIVER_NOT_LOADED):
        if expect_gpus:
            return MonitoringReport(status="misconfigured", message=f"agent misconfigured: NVML not found ({detail}); the config says this host has GPUs")
        if not driver_present:
            return MonitoringReport(status="no_driver", message="no NVIDIA driver on this host: 0 GPUs")
        return MonitoringReport(
            status="misconfigured",
            message=f"agent misconfigured: NVML not found ({detail}) although the NVIDIA kernel driver is loaded",
        )
    return MonitoringReport(status="down", message=f"NVML unavailable: {detail}")


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
    name a GPU whose NVML handle cannot be had (B08).
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


class NvmlSource:
    """Telemetry from NVML through ``pynvml`` (or a test double with the same names).

    :param lib: the ``pynvml`` module or a stand-in; ``None`` imports ``pynvml`` on first use.
    :param expect_gpus: the host is meant to have GPUs (a missing library is then "misconfigured").
    :param timeout: seconds one poll may take before it is reported stale (default 2 s).
    :param slow_every: read ECC, retired pages, persistence, compute and MIG mode every N polls.
    """

    def __init__(
        self,
        lib: ModuleType | Any | None = None,
        *,
        expect_gpus: bool = False,
        timeout: float = 2.0,
        slow_every: int = 12,
        clock: Callable[[], float] = time.monotonic,
        driver_present: Callable[[], bool] = _driver_present,
        lost_lookup: Callable[[], list[tuple[str, str]]] = _lost_device_uuids,
        pid_max: int | None = None,
        binding_version: str | None = None,
    ) -> None:
        self._lib = lib
        self.expect_gpus = expect_gpus
        self.timeout = timeout
        self.slow_every = max(1, slow_every)
        self._clock = clock
        self._driver_present = driver_present
        self._lost_lookup = lost_lookup
        self._pid_max = pid_max or read_pid_max()
        self._binding = binding_version if binding_version is not None else getattr(lib, "BINDING_VERSION", None) or _binding_version()
        self._inited = False
        self._retry_at = 0.0
        self._backoff = 0.0
        self._failure: MonitoringReport | None = None
        self._init_code: int | None = None
        self._versions: dict[str, str | None] = {}
        self._static: dict[str, tuple[str | None, str | None]] = {}  # uuid -> (name, pci bus id)
        self._slow: dict[str, dict[str, Any]] = {}  # uuid -> slow fields
        self._known_by_index: dict[int, tuple[str, str | None, str | None]] = {}
        self._polls = 0
        self._last: Telemetry | None = None
        self._worker: threading.Thread | None = None
        self._result: Telemetry | BaseException | None = None
        self._state: tuple[str, str | None] | None = None
        self._codes: dict[str, int] = {}
        self._errors: tuple[type[BaseException], ...] = (Exception,)

    # -- public -------------------------------------------------------------------------

    @property
    def init_error_code(self) -> int | None:
        """The NVML error code of the last failed initialisation (``None`` if the module is missing)."""
        return self._init_code

    def poll(self) -> Telemetry:
        """Collect one reading within ``timeout`` seconds; a reading that does not finish in
        time is reported stale (the last good reading, ``stale=True``) and the loop carries on."""
        if self._worker is not None and self._worker.is_alive():
            return self._stale("NVML has not answered since the previous poll")
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["t"] = self.collect()
            except BaseException as exc:  # a bug in collection must not end the worker silently
                box["e"] = exc
            finally:
                done.set()

        self._worker = threading.Thread(target=work, name="nvml-poll", daemon=True)
        self._worker.start()
        if not done.wait(self.timeout):
            return self._stale(f"NVML did not answer within {self.timeout:g} s")
        self._worker = None
        if "e" in box:
            exc = box["e"]
            warn_once(f"collect-bug:{type(exc).__name__}", "NVML collection failed unexpectedly: %r", exc, level=logging.ERROR)
            return Telemetry(source="nvml", monitoring=MonitoringReport(status="down", message=f"agent error while reading NVML: {exc!r}"[:2048]))
        return box["t"]

    def close(self) -> None:
        """Shut NVML down if it was initialised (best effort)."""
        if self._inited and self._lib is not None:
            try:
                self._lib.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down, nothing to report to
                pass
            self._inited = False

    # -- the choke point ----------------------------------------------------------------

    def _load(self) -> None:
        if self._lib is None:
            import pynvml  # imported lazily: a host without the binding still runs the agent

            self._lib = pynvml
        lib = self._lib
        self._errors = (getattr(lib, "NVMLError", Exception),)

    def _raw(self, name: str, *args: Any) -> Any:
        """Call ``pynvml.<name>(*args)``; the one place the agent talks to NVML."""
        fn = getattr(self._lib, name, None)
        if fn is None:
            warn_once(
                f"nofn:{name}",
                "pynvml has no %s (nvidia-ml-py %s, driver %s): field reported as not available",
                name, self._binding, self._versions.get("driver"),
            )
            raise NotAvailable(f"{name} missing in nvidia-ml-py {self._binding}", _ERR_FUNCTION_NOT_FOUND)
        try:
            return fn(*args)
        except self._errors as exc:
            code = getattr(exc, "value", None)
            if code in _NA_CODES:
                if code == _ERR_FUNCTION_NOT_FOUND:
                    warn_once(
                        f"fnf:{name}",
                        "%s is not in this libnvidia-ml (driver %s, nvidia-ml-py %s): reported as not available; "
                        "a binding newer than the driver asks for versioned symbols the driver lacks",
                        name, self._versions.get("driver"), self._binding,
                    )
                raise NotAvailable(str(exc), code) from None
            if code == _ERR_GPU_IS_LOST:
                raise GpuLost(f"{name}: {exc}") from None
            if code in _HOST_CODES:
                raise HostDown(f"{name}: {exc}", code) from None
            raise DeviceFault(f"{name}: {exc}") from None
        except (NotAvailable, GpuLost, HostDown, DeviceFault):
            raise
        except Exception as exc:  # noqa: BLE001 - a binding bug (ctypes, struct) is a field error
            raise DeviceFault(f"{name}: {exc!r}") from None

    def _q(self, errs: list[str], name: str, *args: Any) -> Any:
        """:meth:`_raw` for one field: ``None`` when not available, a fault noted in ``errs``."""
        try:
            return self._raw(name, *args)
        except NotAvailable:
            return None
        except DeviceFault as exc:
            errs.append(str(exc))
            return None

    # -- init / host state --------------------------------------------------------------

    def _set_state(self, monitoring: MonitoringReport) -> None:
        key = (monitoring.status, monitoring.message)
        if key == self._state:
            return
        previous, self._state = self._state, key
        if monitoring.status == "ok":
            if previous is not None:
                log.warning("NVML monitoring recovered (was %s: %s)", previous[0], previous[1])
        elif monitoring.status == "no_driver":
            log.info("%s", monitoring.message)
        else:
            log.error("NVML monitoring %s: %s", monitoring.status, monitoring.message)

    def _init(self) -> MonitoringReport | None:
        """Initialise NVML; the failure's monitoring state, or ``None`` on success."""
        try:
            self._load()
        except ImportError as exc:
            self._init_code = None
            return classify_init_error(None, f"pynvml not importable: {exc}", expect_gpus=self.expect_gpus, driver_present=self._driver_present())
        try:
            self._lib.nvmlInit()
        except self._errors as exc:
            self._init_code = getattr(exc, "value", None)
            code = self._init_code if self._init_code is not None else -1
            return classify_init_error(code, str(exc), expect_gpus=self.expect_gpus, driver_present=self._driver_present())
        except Exception as exc:  # noqa: BLE001 - e.g. OSError from a broken library
            self._init_code = -1
            return MonitoringReport(status="down", message=f"NVML unavailable: {exc!r}"[:2048])
        self._inited = True
        self._init_code = 0
        errs: list[str] = []
        self._versions = {
            "driver": to_str(self._q(errs, "nvmlSystemGetDriverVersion"), "driver version"),
            "nvml": to_str(self._q(errs, "nvmlSystemGetNVMLVersion"), "NVML version"),
            "cuda": _cuda_version(self._q(errs, "nvmlSystemGetCudaDriverVersion_v2") or self._q(errs, "nvmlSystemGetCudaDriverVersion")),
        }
        problem = binding_driver_problem(self._binding, self._versions["driver"])
        if problem:
            warn_once("bad-binding", "known-bad binding/driver pair: %s; upgrade nvidia-ml-py", problem)
        return None

    def _schedule_retry(self, monitoring: MonitoringReport) -> None:
        cap = 300.0
        self._backoff = 5.0 if self._backoff == 0 else min(cap, self._backoff * 2)
        self._retry_at = self._clock() + self._backoff * random.uniform(0.8, 1.2)

    def _host_failure(self, monitoring: MonitoringReport) -> Telemetry:
        self._failure = monitoring
        self._set_state(monitoring)
        return Telemetry(source="nvml", monitoring=monitoring, binding_version=self._binding)

    def _stale(self, why: str) -> Telemetry:
        warn_once("stale:" + why, "%s; reporting the last reading as stale", why)
        if self._last is None:
            return Telemetry(source="nvml", stale=True, binding_version=self._binding,
                             monitoring=MonitoringReport(status="down", message=why))
        return replace(self._last, stale=True, monitoring=MonitoringReport(status="degraded", message=why + "; data is from the last reading"))

    # -- collection -----------------------------------------------------------------------

    def collect(self) -> Telemetry:
        """One synchronous reading (what the worker thread runs). Never raises for NVML errors."""
        if not self._inited:
            if self._failure is not None and self._clock() < self._retry_at:
                return Telemetry(source="nvml", monitoring=self._failure, binding_version=self._binding)
            failure = self._init()
            if failure is not None:
                self._schedule_retry(failure)
                return self._host_failure(failure)
            self._backoff = 0.0
            self._failure = None
        try:
            telemetry = self._read()
        except HostDown as exc:
            self.close()
            self._inited = False
            failure = classify_init_error(exc.code, str(exc), expect_gpus=self.expect_gpus, driver_present=self._driver_present())
            self._schedule_retry(failure)
            return self._host_failure(failure)
        self._set_state(MonitoringReport(status="ok") if telemetry.monitoring.status in ("ok", "degraded") else telemetry.monitoring)
        self._last = telemetry
        return telemetry

    def _read(self) -> Telemetry:
        self._polls += 1
        slow_round = self._polls % self.slow_every == 1 or self.slow_every == 1
        count = self._raw("nvmlDeviceGetCount")
        devices: list[DeviceReport] = []
        procs: list[RawProcess] = []
        suspect: list[str] = []
        for index in range(int(count or 0)):
            dev_devices, dev_procs, bogus = self._read_device(index, slow_round)
            devices.extend(dev_devices)
            procs.extend(dev_procs)
            if bogus:
                suspect.append(
                    f"NVML returned {bogus} bogus pid(s) (0, >= pid_max, 2^32-1) on {dev_devices[0].uuid}; "
                    f"nvidia-ml-py {self._binding}, driver {self._versions.get('driver')}: "
                    "the process-info struct layout of the binding probably does not match the driver"
                )
        for reason in suspect:
            warn_once("suspect:" + reason.split(" on ")[0] + str(self._versions.get("driver")), "snapshot suspect: %s", reason)
        monitoring = MonitoringReport()
        problems = [f"{d.uuid}: {d.health}" for d in devices if d.health != "ok"]
        problems += [f"{d.uuid}: processes {d.processes_status}" for d in devices if d.processes_status != "ok"]
        if self.expect_gpus and not devices:
            problems.append("NVML reports no GPU although expect_gpus is set")
        if problems:
            monitoring = MonitoringReport(status="degraded", message="; ".join(problems)[:2048])
        return Telemetry(
            source="nvml",
            devices=devices,
            processes=procs,
            monitoring=monitoring,
            driver_version=self._versions.get("driver"),
            nvml_version=self._versions.get("nvml"),
            cuda_version=self._versions.get("cuda"),
            binding_version=self._binding,
            suspect_reasons=suspect,
        )

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
                            processes_status="unavailable", processes_error="GPU lost")

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

        mem = q(errs, "nvmlDeviceGetMemoryInfo", handle)
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
            utilization_gpu=_pct(getattr(util, "gpu", None)),
            utilization_memory=_pct(getattr(util, "memory", None)),
            temperature_c=float(temp) if isinstance(temp, (int, float)) and 0 < temp < 1000 else None,
            power_draw_w=_watts(power),
            power_limit_w=_watts(limit),
            throttle_reasons=[n for bit, n in _THROTTLE_BITS.items() if reasons & bit] if isinstance(reasons, int) else None,
            **slow,
        )
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
        """MIG instances of one GPU as devices of their own (B07).

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
            mem = q(merrs, "nvmlDeviceGetMemoryInfo", mh)
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
        """Compute and graphics lists merged by pid (C, G, C+G); bogus pids dropped (B01, B15)."""
        merged: dict[tuple[str, int], RawProcess] = {}
        failures: list[tuple[str, NotAvailable | DeviceFault]] = []
        bogus = 0
        for kind, fname in (("C", "nvmlDeviceGetComputeRunningProcesses"), ("G", "nvmlDeviceGetGraphicsRunningProcesses")):
            try:
                rows = self._raw(fname, handle) or []
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
            status = "unavailable" if all_na else "error"
            error = ("unavailable: " if all_na else "") + "; ".join(parts)
            warn_once(f"procs:{uuid}:{error}", "process listing on %s: %s", uuid, error)
        return list(merged.values()), bogus, status, error[:1024] if error else None
