"""Process-list readers for C symbols the installed nvidia-ml-py has no wrapper for.

nvidia-ml-py 12.535.x wraps only the ``_v3`` process-list symbols (its unversioned
``nvmlDeviceGetComputeRunningProcesses`` calls ``_v3`` too), so on a 450 or 470 driver,
which exports ``_v2`` and the bare v1 symbol but not ``_v3``, the binding alone cannot list
a single process. Like gpustat, the agent then calls the older symbol itself through the
binding's own loader (``pynvml._nvmlGetFunctionPointer``), with the struct layout that
symbol fills:

* ``..._v2``: ``nvmlProcessInfo_v2_t`` (pid, usedGpuMemory, gpuInstanceId, computeInstanceId);
* the bare symbol: ``nvmlProcessInfo_v1_t`` (pid, usedGpuMemory).

A missing symbol raises the binding's ``NVMLError_FunctionNotFound`` as any call would.
"""

from __future__ import annotations

from ctypes import Structure, byref, c_uint, c_ulonglong
from dataclasses import dataclass
from typing import Any, Callable

_SUCCESS = 0
_INSUFFICIENT_SIZE = 7
_NOT_AVAILABLE_U64 = 2**64 - 1


class ProcessInfoV1(Structure):
    """``nvmlProcessInfo_v1_t`` (nvml.h): what the bare process-list symbols fill."""

    _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong)]


class ProcessInfoV2(Structure):
    """``nvmlProcessInfo_v2_t`` (nvml.h): what the ``_v2`` process-list symbols fill."""

    _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong), ("gpuInstanceId", c_uint), ("computeInstanceId", c_uint)]


@dataclass(slots=True)
class ProcessRow:
    """One process as the binding's wrappers return it (``usedGpuMemory`` in bytes, ``None``
    when NVML cannot say; instance ids ``None`` for the v1 layout)."""

    pid: int
    usedGpuMemory: int | None  # noqa: N815 - the binding's attribute name
    gpuInstanceId: int | None = None  # noqa: N815
    computeInstanceId: int | None = None  # noqa: N815


def process_reader(lib: Any, symbol: str) -> Callable[[Any], list[ProcessRow]] | None:
    """A reader calling the C ``symbol`` (a process-list function) through ``lib``'s loader, or
    ``None`` when ``lib`` is not the real binding (no ``_nvmlGetFunctionPointer``).

    The reader takes a device handle and returns :class:`ProcessRow` objects; it raises
    ``lib.NVMLError`` subclasses like the binding's own wrappers.
    """
    loader = getattr(lib, "_nvmlGetFunctionPointer", None)
    error = getattr(lib, "NVMLError", None)
    if loader is None or error is None:
        return None
    struct = ProcessInfoV2 if symbol.endswith("_v2") else ProcessInfoV1

    def read(handle: Any) -> list[ProcessRow]:
        fn = loader(symbol)
        count = c_uint(0)
        ret = fn(handle, byref(count), None)
        if ret == _SUCCESS:
            return []
        if ret != _INSUFFICIENT_SIZE:
            raise error(ret)
        count.value = count.value * 2 + 5  # room for processes started between the two calls
        rows = (struct * count.value)()
        ret = fn(handle, byref(count), rows)
        if ret != _SUCCESS:
            raise error(ret)
        out = []
        for i in range(count.value):
            r = rows[i]
            used = None if r.usedGpuMemory == _NOT_AVAILABLE_U64 else int(r.usedGpuMemory)
            out.append(ProcessRow(int(r.pid), used, getattr(r, "gpuInstanceId", None), getattr(r, "computeInstanceId", None)))
        return out

    read.__name__ = symbol
    return read
