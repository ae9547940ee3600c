"""NVML's error codes and what the agent makes of them.

Every ``pynvml`` failure is sorted into one of four kinds: not available (NotSupported,
NoPermission, FunctionNotFound, NotFound, and the binding's own ``NVMLLibraryMismatchError``
for a symbol the driver lacks), the whole host down (Uninitialized, LibRmVersionMismatch,
DriverNotLoaded, LibraryNotFound), one GPU lost (GpuIsLost) and one field failed.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from agent.schema import MonitoringReport

# NVML error codes (numeric, as in nvml.h; pynvml exposes the same names)
_ERR_UNINITIALIZED = 1
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_TIMEOUT = 10
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_LIB_RM_VERSION_MISMATCH = 18

_NA_CODES = {_ERR_NOT_SUPPORTED, _ERR_NO_PERMISSION, _ERR_FUNCTION_NOT_FOUND, _ERR_NOT_FOUND, _ERR_INVALID_ARGUMENT}
_HOST_CODES = {_ERR_UNINITIALIZED, _ERR_DRIVER_NOT_LOADED, _ERR_LIBRARY_NOT_FOUND, _ERR_LIB_RM_VERSION_MISMATCH}

MISMATCH_MESSAGE = "NVML unavailable: driver/library mismatch, reboot needed"

# nvidia-ml-py releases known to read the per-process struct with the wrong layout (pids and memory read from the wrong offsets):
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


class NoEvent(Exception):
    """``nvmlEventSetWait`` timed out: no event is waiting (the normal end of a drain)."""


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
    """Turn an NVML start-up failure into the host's monitoring state (no driver, a library/driver mismatch, a misconfigured host).

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


def is_function_missing(exc: BaseException, lib: object) -> bool:
    """True when ``exc`` says the driver lacks the called symbol, however the binding says it.

    nvidia-ml-py 12.x raises ``NVMLError_FunctionNotFound`` (an ``NVMLError`` with code 13);
    13.x wraps its unversioned helpers so that the same missing symbol raises
    ``NVMLLibraryMismatchError``, which is a plain ``Exception``, not an ``NVMLError``.
    """
    mismatch = getattr(lib, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type) and isinstance(exc, mismatch):
        return True
    return type(exc).__name__ == "NVMLLibraryMismatchError" or getattr(exc, "value", None) == _ERR_FUNCTION_NOT_FOUND
