"""A fake ``libnvidia-ml.so.1`` under the REAL ``pynvml`` module.

:class:`FakeLibNvml` stands in for the ``ctypes.CDLL`` object that ``pynvml`` keeps in
``pynvml.nvmlLib``: each C symbol is a Python function taking the same ctypes arguments
(``byref`` pointers, string buffers, struct arrays) and returning an ``nvmlReturn_t`` code.
A symbol listed in ``missing`` raises ``AttributeError`` like a driver that does not export
it, so ``pynvml._nvmlGetFunctionPointer`` answers exactly as it does on such a driver and
the binding's own wrappers (and their error types, which change between nvidia-ml-py
releases) run unchanged.

:func:`run_scenarios` runs the cases B49-B53 through :class:`agent.nvml.NvmlSource` on
whatever ``pynvml`` is importable and returns plain data; ``python -m
tests.agent.fake_libnvml`` prints it as JSON, so a test can run it under another
nvidia-ml-py release in a subprocess.
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any, Callable

SUCCESS, UNINITIALIZED, NOT_SUPPORTED, INSUFFICIENT_SIZE = 0, 1, 3, 7
MiB = 1024 * 1024
NA_U32 = 0xFFFFFFFF


def _handle_index(handle: Any) -> int:
    """The GPU index encoded in a handle made by ``nvmlDeviceGetHandleByIndex_v2``."""
    return (ctypes.cast(handle, ctypes.c_void_p).value or 1) - 1


def _set(ref: Any, value: Any) -> None:
    ref._obj.value = value


class FakeLibNvml:
    """The C side of NVML for one GPU.

    :param driver: what ``nvmlSystemGetDriverVersion`` writes.
    :param compute: (pid, used bytes) rows of the compute process list.
    :param graphics: rows of the graphics list, or an NVML return code to answer with.
    :param missing: C symbols the "driver" does not export.
    :param memory_v1: (total, used) bytes of the v1 structure; ``memory_v2`` (total, used,
        reserved) of the v2 structure.
    :param fail_first: symbol -> return code answered on its first call only.
    """

    def __init__(self, *, driver: str = "535.104.05", compute: list[tuple[int, int]] | None = None,
                 graphics: list[tuple[int, int]] | int = NOT_SUPPORTED, missing: set[str] | None = None,
                 memory_v1: tuple[int, int] = (80 * 1024 * MiB, 8099 * MiB),
                 memory_v2: tuple[int, int, int] = (80 * 1024 * MiB, 8000 * MiB, 99 * MiB),
                 fail_first: dict[str, int] | None = None) -> None:
        self.driver = driver
        self.compute = compute or []
        self.graphics = graphics
        self.missing = missing or set()
        self.memory_v1 = memory_v1
        self.memory_v2 = memory_v2
        self.fail_first = dict(fail_first or {})
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., int]:
        if name.startswith("__") or name in self.missing:
            raise AttributeError(name)
        impl = getattr(type(self), "_" + name, None)

        def symbol(*args: Any) -> int:
            self.calls.append(name)
            if name in self.fail_first:
                return self.fail_first.pop(name)
            if impl is None:
                return NOT_SUPPORTED
            return impl(self, *args)

        return symbol

    # -- system ---------------------------------------------------------------------------
    def _nvmlInitWithFlags(self, flags: Any) -> int:  # noqa: N802
        return SUCCESS

    def _nvmlShutdown(self) -> int:  # noqa: N802
        return SUCCESS

    def _nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:  # noqa: N802
        buf.value = self.driver.encode()
        return SUCCESS

    def _nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:  # noqa: N802
        buf.value = b"12." + self.driver.encode()
        return SUCCESS

    def _nvmlSystemGetCudaDriverVersion_v2(self, ref: Any) -> int:  # noqa: N802
        _set(ref, 12020)
        return SUCCESS

    # -- device ---------------------------------------------------------------------------
    def _nvmlDeviceGetCount_v2(self, ref: Any) -> int:  # noqa: N802
        _set(ref, 1)
        return SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:  # noqa: N802
        address = ctypes.c_void_p(index.value + 1)
        ctypes.memmove(ctypes.addressof(ref._obj), ctypes.addressof(address), ctypes.sizeof(ctypes.c_void_p))
        return SUCCESS

    def _nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:  # noqa: N802
        buf.value = f"GPU-fake-{_handle_index(handle)}".encode()
        return SUCCESS

    def _nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:  # noqa: N802
        buf.value = b"NVIDIA A100-SXM4-80GB"
        return SUCCESS

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:  # noqa: N802
        total, used = self.memory_v1
        ref._obj.total, ref._obj.used, ref._obj.free = total, used, total - used
        return SUCCESS

    def _nvmlDeviceGetMemoryInfo_v2(self, handle: Any, ref: Any) -> int:  # noqa: N802
        total, used, reserved = self.memory_v2
        ref._obj.total, ref._obj.used, ref._obj.reserved = total, used, reserved
        ref._obj.free = total - used - reserved
        return SUCCESS

    def _list(self, rows: list[tuple[int, int]] | int, count: Any, procs: Any) -> int:
        if isinstance(rows, int):
            return rows
        if procs is None:
            if not rows:
                return SUCCESS
            _set(count, len(rows))
            return INSUFFICIENT_SIZE
        for i, (pid, used) in enumerate(rows):
            procs[i].pid, procs[i].usedGpuMemory = pid, used
            procs[i].gpuInstanceId = procs[i].computeInstanceId = NA_U32
        _set(count, len(rows))
        return SUCCESS

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, procs: Any) -> int:  # noqa: N802
        return self._list(self.compute, count, procs)

    _nvmlDeviceGetComputeRunningProcesses_v2 = _nvmlDeviceGetComputeRunningProcesses_v3
    _nvmlDeviceGetComputeRunningProcesses = _nvmlDeviceGetComputeRunningProcesses_v3

    def _nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, procs: Any) -> int:  # noqa: N802
        return self._list(self.graphics, count, procs)

    _nvmlDeviceGetGraphicsRunningProcesses_v2 = _nvmlDeviceGetGraphicsRunningProcesses_v3
    _nvmlDeviceGetGraphicsRunningProcesses = _nvmlDeviceGetGraphicsRunningProcesses_v3


def install(lib: FakeLibNvml) -> Any:
    """Put ``lib`` under the real ``pynvml`` (as its loaded library) and return the module."""
    import pynvml

    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml


V3 = {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"}
ALL_LISTS = V3 | {"nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v2",
                  "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"}


def _reading(lib: FakeLibNvml, polls: int = 1) -> list[dict[str, Any]]:
    from agent.nvml import NvmlSource

    pynvml = install(lib)
    src = NvmlSource(lib=pynvml, pid_max=4_194_304)
    out = []
    for _ in range(polls):
        t = src.collect()
        out.append({
            "monitoring": t.monitoring.status,
            "message": t.monitoring.message,
            "versions": [t.driver_version, t.nvml_version, t.cuda_version],
            "pids": sorted(p.pid for p in t.processes),
            "memory_mib": [p.used_memory_mib for p in t.processes],
            "devices": [d.model_dump(include={"uuid", "health", "error", "processes_status", "processes_error",
                                              "memory_used_mib", "memory_reserved_mib"}) for d in t.devices],
        })
    src.close()
    return out


def _raw_unversioned() -> dict[str, Any]:
    """What the choke point makes of the binding's unversioned process-list wrapper when the
    driver lacks every process-list symbol (13.x: NVMLLibraryMismatchError)."""
    from agent.nvml import NotAvailable, NvmlSource

    pynvml = install(FakeLibNvml(driver="470.82.01", missing=set(ALL_LISTS)))
    src = NvmlSource(lib=pynvml, pid_max=4_194_304)
    src.collect()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        binding_raises = None
    except Exception as exc:  # noqa: BLE001 - recording what the binding raises
        binding_raises = type(exc).__name__
    try:
        src._raw("nvmlDeviceGetComputeRunningProcesses", handle)
        classified = None
    except NotAvailable as exc:
        classified = exc.code
    except Exception as exc:  # noqa: BLE001
        classified = type(exc).__name__
    src.close()
    return {"binding_raises": binding_raises, "classified_code": classified}


def run_scenarios() -> dict[str, Any]:
    """Every case of this module on the importable ``pynvml``; plain data for JSON."""
    from importlib import metadata

    return {
        "binding": metadata.version("nvidia-ml-py"),
        "b49": _reading(FakeLibNvml(compute=[(41001, 2048 * MiB)], graphics=NOT_SUPPORTED)),
        "b50": _reading(FakeLibNvml(driver="470.82.01", compute=[(41001, 2048 * MiB)], graphics=[], missing=set(V3))),
        "b50_none": _reading(FakeLibNvml(driver="470.82.01", compute=[(41001, 2048 * MiB)], missing=set(ALL_LISTS))),
        "b51": _raw_unversioned(),
        "b52": _reading(FakeLibNvml(driver="535.104.05", graphics=[])),
        "b52_no_v2": _reading(FakeLibNvml(driver="470.82.01", graphics=[], missing={"nvmlDeviceGetMemoryInfo_v2"})),
        "b53": _reading(FakeLibNvml(compute=[(41001, 2048 * MiB)], graphics=[],
                                    fail_first={"nvmlSystemGetNVMLVersion": UNINITIALIZED}), polls=2),
    }


if __name__ == "__main__":
    json.dump(run_scenarios(), sys.stdout)
