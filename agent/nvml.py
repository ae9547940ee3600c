"""The NVML source: every ``pynvml`` call of the agent goes through :meth:`NvmlSource._raw`.

That one choke point initialises NVML once, turns "not available" answers (NotSupported,
NoPermission, FunctionNotFound, NotFound, and nvidia-ml-py 13.x's
``NVMLLibraryMismatchError`` for a symbol the driver lacks) into ``None``, logs a function missing from the
driver once with the binding and driver versions, decodes bytes, and sorts the remaining
errors into three kinds: the whole host is down (Uninitialized, LibRmVersionMismatch,
DriverNotLoaded, LibraryNotFound), one GPU is lost (GpuIsLost, or its handle cannot be
had) and one field failed (recorded on that device, the poll goes on). The error kinds live
in :mod:`agent.nvml_errors`, per-device reading in :mod:`agent.nvml_device`.

Driver, NVML and CUDA versions that could not be read at start-up are asked again on later
polls (a transient error then must not leave them empty for good), and the known-bad
binding check runs as soon as the driver version is known.

Collection runs in a daemon worker thread with a deadline (2 s by default): NVML calls can
hang on a wedged GPU, and the reporting loop must carry on, marking the telemetry stale.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import replace
from types import ModuleType
from typing import Any, Callable

from agent.nvml_device import DeviceReader, _cuda_version, _lost_device_uuids
from agent.nvml_health import HealthReader
from agent.nvml_errors import (
    _ERR_FUNCTION_NOT_FOUND,
    _ERR_GPU_IS_LOST,
    _ERR_TIMEOUT,
    _HOST_CODES,
    _NA_CODES,
    KNOWN_BAD_BINDINGS,
    MISMATCH_MESSAGE,
    DeviceFault,
    GpuLost,
    HostDown,
    NoEvent,
    NotAvailable,
    _binding_version,
    _driver_present,
    binding_driver_problem,
    classify_init_error,
    is_function_missing,
)
from agent.schema import DeviceReport, MonitoringReport
from agent.telemetry import RawProcess, Telemetry, log, read_pid_max, to_str, warn_once

__all__ = [
    "KNOWN_BAD_BINDINGS", "MISMATCH_MESSAGE", "DeviceFault", "GpuLost", "HostDown", "NotAvailable", "NvmlSource",
    "binding_driver_problem", "classify_init_error", "is_function_missing",
]

class NvmlSource(DeviceReader, HealthReader):
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
        self._proc_fn: dict[str, str] = {}  # "C"/"G" -> the process-list function the driver has
        self._mem_v2: bool | None = None  # nvmlDeviceGetMemoryInfo_v2 present (None: not asked yet)
        self._binding_checked = False
        self._retry_now = False
        self._events = None  # the XID event set (agent.nvml_health)
        self._xid_registered: dict[str, bool] = {}
        self._health_slow: dict = {}  # uuid -> ECC / pending retirement / remap checks

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
            self._reset_health()
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

    def _raw(self, name: str, *args: Any, fn: Callable[..., Any] | None = None) -> Any:
        """Call ``pynvml.<name>(*args)`` (or ``fn``, a reader of :mod:`agent.nvml_compat` for a
        symbol the binding does not wrap); the one place the agent talks to NVML."""
        fn = fn or getattr(self._lib, name, None)
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
                    self._warn_missing(name)
                raise NotAvailable(str(exc), code) from None
            if code == _ERR_TIMEOUT:
                raise NoEvent(name) from None
            if code == _ERR_GPU_IS_LOST:
                raise GpuLost(f"{name}: {exc}") from None
            if code in _HOST_CODES:
                raise HostDown(f"{name}: {exc}", code) from None
            raise DeviceFault(f"{name}: {exc}") from None
        except (NotAvailable, GpuLost, HostDown, DeviceFault, NoEvent):
            raise
        except Exception as exc:  # noqa: BLE001 - a binding bug (ctypes, struct) is a field error
            if is_function_missing(exc, self._lib):
                self._warn_missing(name)
                raise NotAvailable(f"{name}: function not found ({exc})", _ERR_FUNCTION_NOT_FOUND) from None
            raise DeviceFault(f"{name}: {exc!r}") from None

    def _warn_missing(self, name: str) -> None:
        warn_once(
            f"fnf:{name}",
            "%s is not in this libnvidia-ml (driver %s, nvidia-ml-py %s): reported as not available; "
            "a binding newer than the driver asks for versioned symbols the driver lacks",
            name, self._versions.get("driver"), self._binding,
        )

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
        self._versions = {}
        self._binding_checked = False
        try:
            self._read_versions()
        except HostDown as exc:
            # NVML said yes to nvmlInit and then "uninitialized" (seen while the driver is still
            # starting): monitoring is down for this poll, and the next poll starts over.
            self.close()
            self._init_code = exc.code
            self._retry_now = True
            return MonitoringReport(status="down", message=f"NVML not ready while starting ({exc}); retrying on the next poll")
        return None

    def _read_versions(self) -> None:
        """Fill the driver, NVML and CUDA versions still unknown; run the known-bad-binding
        check once the driver version is known. Raises :class:`HostDown`."""
        errs: list[str] = []
        if not self._versions.get("driver"):
            self._versions["driver"] = to_str(self._q(errs, "nvmlSystemGetDriverVersion"), "driver version")
        if not self._versions.get("nvml"):
            self._versions["nvml"] = to_str(self._q(errs, "nvmlSystemGetNVMLVersion"), "NVML version")
        if not self._versions.get("cuda"):
            self._versions["cuda"] = _cuda_version(
                self._q(errs, "nvmlSystemGetCudaDriverVersion_v2") or self._q(errs, "nvmlSystemGetCudaDriverVersion"))
        if not self._binding_checked and self._versions.get("driver"):
            self._binding_checked = True
            problem = binding_driver_problem(self._binding, self._versions["driver"])
            if problem:
                warn_once("bad-binding", "known-bad binding/driver pair: %s; upgrade nvidia-ml-py", problem)

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
                if self._retry_now:
                    self._retry_now = False
                    self._retry_at = 0.0
                else:
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
        if slow_round and not all(self._versions.get(k) for k in ("driver", "nvml", "cuda")):
            self._read_versions()
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
        self._add_xids(devices)
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
