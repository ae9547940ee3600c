"""A fake ``pynvml`` for tests and benchmarks, with scenarios named after docs/cases.md.

:class:`FakeNVML` is a module-like object: the ``nvml*`` functions the agent (and gpustat /
nvitop) call, answered from :class:`FakeGPU` records, plus every ``NVML_*`` constant and
``NVMLError_*`` class taken from the real ``pynvml``, so errors are the real exception
classes. A function it does not implement raises ``NVMLError_FunctionNotFound`` like a
driver that lacks the symbol. Pass it as ``NvmlSource(lib=fake)``, or install it over the
real module with :func:`patched_pynvml` for third-party tools.

:class:`FakeProcessTable` stands in for ``psutil.Process`` so owner lookups of fake pids
give chosen users, cgroups, exits and permission errors.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter, namedtuple
from dataclasses import dataclass, field
from typing import Any, Iterator

import psutil
import pynvml as _real

from testkit.fake_nvml_health import FakeHealthCalls

GiB = 1024**3
MiB = 1024**2
NA_U32 = 0xFFFFFFFF
NA_U64 = 2**64 - 1


def nvml_error(name: str) -> BaseException:
    """A real pynvml exception instance, e.g. ``nvml_error("NotSupported")``."""
    return getattr(_real, f"NVMLError_{name}")()


@dataclass
class FakeProc:
    """One entry of a running-process list: pid, usedGpuMemory (bytes or None), MIG ids."""

    pid: int
    usedGpuMemory: int | None = 0  # noqa: N815 - pynvml's field names
    gpuInstanceId: int = NA_U32  # noqa: N815
    computeInstanceId: int = NA_U32  # noqa: N815


@dataclass
class FakeMig:
    """A MIG device: GPU instance ``gi``, compute instance ``ci``; ``uuid`` None = unreadable."""

    gi: int
    ci: int = 0
    uuid: str | bytes | None = None
    profile: str = "1g.10gb"
    mem_total: int = 10 * GiB
    mem_used: int = 13 * MiB
    errors: dict[str, BaseException] = field(default_factory=dict)


@dataclass
class FakeGPU:
    """One GPU. Memory in bytes, power in mW, temperature in °C, utilization in %.

    ``errors`` maps an ``nvml*`` function name to the exception it raises for this GPU;
    ``handle_error`` is raised by ``nvmlDeviceGetHandleByIndex``.
    """

    uuid: str | bytes = "GPU-00000000-0000-0000-0000-000000000000"
    name: str | bytes = "NVIDIA A100-SXM4-80GB"
    bus_id: str | bytes = "00000000:01:00.0"
    mem_total: int | None = 80 * GiB
    mem_used: int | None = 1 * GiB
    util_gpu: int = 37
    util_mem: int = 12
    temp: int = 41
    power_mw: int = 65_000
    limit_mw: int = 400_000
    fan: int = 30
    throttle: int = 0x1
    ecc_uncorrected: int = 0
    retired: tuple[list[int], list[int]] = ((), ())  # type: ignore[assignment]
    persistence: int = 1
    compute_mode: int = 0
    mig_mode: tuple[int, int] = (0, 0)
    compute: list[FakeProc] = field(default_factory=list)
    graphics: list[FakeProc] = field(default_factory=list)
    migs: list[FakeMig] = field(default_factory=list)
    errors: dict[str, BaseException] = field(default_factory=dict)
    handle_error: BaseException | None = None
    xids: list[int] = field(default_factory=list)  # XID events waiting to be read (testkit.fake_nvml_health)
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrected, uncorrected, pending, failure


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None


_Mem = namedtuple("_Mem", "total free used")
_Util = namedtuple("_Util", "gpu memory")
_Pci = namedtuple("_Pci", "busId bus device domain pciDeviceId")


class FakeNVML(FakeHealthCalls):
    """A stand-in for the ``pynvml`` module (see module doc).

    :param init_error: raised by ``nvmlInit`` (B09, B10).
    :param hang: when set, every device call blocks until the event is set (stale polls).
    """

    def __init__(self, gpus: list[FakeGPU], *, driver: str | bytes = "535.104.05", cuda: int = 12020,
                 binding: str = "12.535.133", init_error: BaseException | None = None,
                 hang: threading.Event | None = None) -> None:
        self.gpus = gpus
        self.driver = driver
        self.cuda = cuda
        self.BINDING_VERSION = binding
        self.init_error = init_error
        self.hang = hang
        self.initialized = False
        self.calls: Counter[str] = Counter()

    # constants, error classes and unknown functions ---------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "nvmlClocks", "nvmlEventType")) or name == "NVMLError":
            return getattr(_real, name)
        if name.startswith("nvml"):
            def missing(*_a: Any, **_k: Any) -> Any:
                raise nvml_error("FunctionNotFound")
            return missing
        raise AttributeError(name)

    # plumbing ------------------------------------------------------------------------------
    def _enter(self, fname: str, handle: _Handle | None = None) -> tuple[FakeGPU | None, FakeMig | None]:
        self.calls[fname] += 1
        if not self.initialized:
            raise nvml_error("Uninitialized")
        if self.hang is not None and not self.hang.is_set():
            self.hang.wait()
        if handle is None:
            return None, None
        gpu = self.gpus[handle.gpu]
        mig = gpu.migs[handle.mig] if handle.mig is not None else None
        errs = mig.errors if mig is not None else gpu.errors
        if fname in errs:
            raise errs[fname]
        return gpu, mig

    # system ----------------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlInitWithFlags(self, flags: int = 0) -> None:  # noqa: N802
        self.nvmlInit()

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str | bytes:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetNVMLVersion")
        driver = self.driver.decode() if isinstance(self.driver, bytes) else self.driver
        return f"12.{driver}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlSystemGetProcessName(self, pid: int) -> str:  # noqa: N802
        self._enter("nvmlSystemGetProcessName")
        return "python"

    # devices ---------------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex")
        if index >= len(self.gpus):
            raise nvml_error("InvalidArgument")
        if self.gpus[index].handle_error is not None:
            raise self.gpus[index].handle_error
        return _Handle(index)

    def nvmlDeviceGetIndex(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetIndex", h)
        return h.gpu

    def nvmlDeviceGetUUID(self, h: _Handle) -> str | bytes:  # noqa: N802
        gpu, mig = self._enter("nvmlDeviceGetUUID", h)
        if mig is not None:
            if mig.uuid is None:
                raise nvml_error("NoPermission")
            return mig.uuid
        return gpu.uuid  # type: ignore[union-attr]

    def nvmlDeviceGetName(self, h: _Handle) -> str | bytes:  # noqa: N802
        gpu, mig = self._enter("nvmlDeviceGetName", h)
        if mig is not None:
            base = gpu.name.decode() if isinstance(gpu.name, bytes) else gpu.name  # type: ignore[union-attr]
            return f"{base} MIG {mig.profile}"
        return gpu.name  # type: ignore[union-attr]

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> _Pci:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetPciInfo", h)
        bus = gpu.bus_id if isinstance(gpu.bus_id, bytes) else gpu.bus_id.encode()  # type: ignore[union-attr]
        return _Pci(bus, int(bus.split(b":")[1], 16), 0, 0, 0x20B210DE)

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: Any = None) -> _Mem:  # noqa: N802
        gpu, mig = self._enter("nvmlDeviceGetMemoryInfo", h)
        src = mig or gpu
        total, used = src.mem_total, src.mem_used  # type: ignore[union-attr]
        free = (total - used) if isinstance(total, int) and isinstance(used, int) else None
        return _Mem(total, free, used)

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> _Util:  # noqa: N802
        gpu, mig = self._enter("nvmlDeviceGetUtilizationRates", h)
        if mig is not None:
            raise nvml_error("NotSupported")
        return _Util(gpu.util_gpu, gpu.util_mem)  # type: ignore[union-attr]

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetTemperature", h)
        return gpu.temp  # type: ignore[union-attr]

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetPowerUsage", h)
        return gpu.power_mw  # type: ignore[union-attr]

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return gpu.limit_mw  # type: ignore[union-attr]

    def nvmlDeviceGetPowerManagementLimit(self, h: _Handle) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetPowerManagementLimit", h)
        return gpu.limit_mw  # type: ignore[union-attr]

    def nvmlDeviceGetFanSpeed(self, h: _Handle) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetFanSpeed", h)
        return gpu.fan  # type: ignore[union-attr]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return gpu.throttle  # type: ignore[union-attr]

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetTotalEccErrors", h)
        return gpu.ecc_uncorrected  # type: ignore[union-attr]

    def nvmlDeviceGetRetiredPages(self, h: _Handle, cause: int) -> list[int]:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetRetiredPages", h)
        return list(gpu.retired[cause])  # type: ignore[union-attr]

    def nvmlDeviceGetPersistenceMode(self, h: _Handle) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetPersistenceMode", h)
        return gpu.persistence  # type: ignore[union-attr]

    def nvmlDeviceGetComputeMode(self, h: _Handle) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetComputeMode", h)
        return gpu.compute_mode  # type: ignore[union-attr]

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:  # noqa: N802
        gpu, mig = self._enter("nvmlDeviceGetMigMode", h)
        if mig is not None:
            raise nvml_error("NotSupported")
        return list(gpu.mig_mode)  # type: ignore[union-attr]

    def nvmlDeviceIsMigDeviceHandle(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceIsMigDeviceHandle")
        return int(h.mig is not None)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7 if gpu.mig_mode[0] else 0  # type: ignore[union-attr]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, index: int) -> _Handle:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index >= len(gpu.migs):  # type: ignore[union-attr]
            raise nvml_error("NotFound")
        return _Handle(h.gpu, index)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: _Handle) -> _Handle:  # noqa: N802
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        return _Handle(h.gpu)

    def nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:  # noqa: N802
        _, mig = self._enter("nvmlDeviceGetGpuInstanceId", h)
        if mig is None:
            raise nvml_error("InvalidArgument")
        return mig.gi

    def nvmlDeviceGetComputeInstanceId(self, h: _Handle) -> int:  # noqa: N802
        _, mig = self._enter("nvmlDeviceGetComputeInstanceId", h)
        if mig is None:
            raise nvml_error("InvalidArgument")
        return mig.ci

    def _procs(self, fname: str, h: _Handle, kind: str) -> list[FakeProc]:
        gpu, mig = self._enter(fname, h)
        rows = gpu.compute if kind == "C" else gpu.graphics  # type: ignore[union-attr]
        if mig is not None:
            rows = [r for r in rows if r.gpuInstanceId == mig.gi and r.computeInstanceId == mig.ci]
        return [FakeProc(r.pid, r.usedGpuMemory, r.gpuInstanceId, r.computeInstanceId) for r in rows]

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[FakeProc]:  # noqa: N802
        return self._procs("nvmlDeviceGetComputeRunningProcesses", h, "C")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: _Handle) -> list[FakeProc]:  # noqa: N802
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", h, "G")

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses
    nvmlDeviceGetGraphicsRunningProcesses_v2 = nvmlDeviceGetGraphicsRunningProcesses

    def nvmlDeviceGetEncoderUtilization(self, h: _Handle) -> list[int]:  # noqa: N802
        self._enter("nvmlDeviceGetEncoderUtilization", h)
        return [0, 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: _Handle) -> list[int]:  # noqa: N802
        self._enter("nvmlDeviceGetDecoderUtilization", h)
        return [0, 167000]

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock_type: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetClockInfo", h)
        return 1410

    nvmlDeviceGetMaxClockInfo = nvmlDeviceGetClockInfo

    def nvmlDeviceGetPerformanceState(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetPerformanceState", h)
        return 0

    def nvmlDeviceGetDisplayActive(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetDisplayActive", h)
        return 0

    nvmlDeviceGetDisplayMode = nvmlDeviceGetDisplayActive


@contextlib.contextmanager
def patched_pynvml(fake: FakeNVML, *also: Any) -> Iterator[FakeNVML]:
    """Install ``fake``'s functions over the real ``pynvml`` module (for gpustat / nvitop).

    ``also``: modules that keep their own copies of pynvml functions (``nvitop.api.libnvml``);
    their copies are replaced too, except their own init/shutdown wrappers.
    """
    names = [n for n in dir(FakeNVML) if n.startswith("nvml")]
    targets = [(_real, names)] + [(m, [n for n in names if n not in ("nvmlInit", "nvmlInitWithFlags", "nvmlShutdown")]) for m in also]
    _missing = object()
    saved = [(mod, n, getattr(mod, n, _missing)) for mod, ns in targets for n in ns]
    try:
        for mod, ns in targets:
            for n in ns:
                setattr(mod, n, getattr(fake, n))
        yield fake
    finally:
        for mod, n, v in saved:
            if v is _missing:
                delattr(mod, n)
            else:
                setattr(mod, n, v)


# -- owners ------------------------------------------------------------------------------------

from agent.procid import ProcessIdentity  # noqa: E402 - only the owner fakes need it

_Uids = namedtuple("_Uids", "real effective saved")


@dataclass
class FakeOwner:
    """A fake process: uid, user, argv, cgroup text; ``error`` raised by every lookup."""

    uid: int = 1000
    user: str | None = "user-a"
    argv: list[str] = field(default_factory=lambda: ["python", "train.py", "--lr", "3e-4"])
    create_time: float = 1_767_000_000.0
    cgroup: str | None = "0::/user.slice/user-1000.slice/session-3.scope"
    error: str | None = None  # "exited" (NoSuchProcess) or "denied" (AccessDenied)
    name: str | None = None
    start_ticks: int = 4242  # /proc/PID/stat field 22
    exe: str | None = None  # a verified system executable, as agent.procid.verified_exe would say


class FakeProcessTable:
    """Plays ``psutil.Process`` (``process_factory``), ``pwd`` (``user_lookup``),
    ``/proc/<pid>/cgroup`` (``cgroup_reader``), ``/proc/<pid>/stat`` (``identify_process``) and
    the executable check (``exe_check``) for :class:`agent.owners.OwnerResolver`."""

    def __init__(self, owners: dict[int, FakeOwner]) -> None:
        self.owners = owners
        self.lookups: Counter[int] = Counter()

    def resolver_kwargs(self) -> dict[str, Any]:
        """Keyword arguments wiring this table into ``OwnerResolver``."""
        return {"process_factory": self.process, "user_lookup": self.user, "cgroup_reader": self.cgroup,
                "identify_process": self.identify, "exe_check": self.exe}

    def identify(self, pid: int) -> ProcessIdentity | None:
        owner = self.owners.get(pid)
        if owner is None or owner.error == "exited":
            return None
        return ProcessIdentity(pid=pid, start_ticks=owner.start_ticks, boot_id="fake-boot")

    def exe(self, pid: int) -> str | None:
        owner = self.owners.get(pid)
        return owner.exe if owner else None

    def process(self, pid: int) -> "_FakeProcess":
        self.lookups[pid] += 1
        owner = self.owners.get(pid)
        if owner is None or owner.error == "exited":
            raise psutil.NoSuchProcess(pid)
        if owner.error == "denied":
            raise psutil.AccessDenied(pid)
        return _FakeProcess(pid, owner)

    def user(self, uid: int) -> str | None:
        for owner in self.owners.values():
            if owner.uid == uid:
                return owner.user
        return None

    def cgroup(self, pid: int) -> str | None:
        owner = self.owners.get(pid)
        return owner.cgroup if owner else None


class _FakeProcess:
    def __init__(self, pid: int, owner: FakeOwner) -> None:
        self.pid = pid
        self._o = owner

    def create_time(self) -> float:
        return self._o.create_time

    def uids(self) -> _Uids:
        return _Uids(self._o.uid, self._o.uid, self._o.uid)

    def name(self) -> str:
        return self._o.name if self._o.name is not None else (self._o.argv[0].rsplit("/", 1)[-1] if self._o.argv else "")

    def cmdline(self) -> list[str]:
        return list(self._o.argv)


# -- scenarios (CASES.md) ---------------------------------------------------------------------

def _uuid(n: int) -> str:
    return f"GPU-{n:08x}-aaaa-bbbb-cccc-{n:012x}"


def b01_garbage_pids() -> FakeNVML:
    """B01: R535 driver, nvidia-ml-py 12.535.77: real pids 41001/41077 among 0 and 2^32-1."""
    procs = [FakeProc(41001, 2 * GiB), FakeProc(0, 0), FakeProc(NA_U32, 0), FakeProc(NA_U32, 0),
             FakeProc(41077, 1 * GiB), FakeProc(0, 0), FakeProc(NA_U32, 0)]
    return FakeNVML([FakeGPU(uuid=_uuid(0), compute=procs)], driver="535.86.05", binding="12.535.77")


def b03_function_not_found() -> FakeNVML:
    """B03: both running-process entry points missing from libnvidia-ml; metrics still work."""
    fnf = {"nvmlDeviceGetComputeRunningProcesses": nvml_error("FunctionNotFound"),
           "nvmlDeviceGetGraphicsRunningProcesses": nvml_error("FunctionNotFound")}
    return FakeNVML([FakeGPU(uuid=_uuid(0), errors=dict(fnf)), FakeGPU(uuid=_uuid(1), bus_id="00000000:02:00.0", errors=dict(fnf))],
                    driver="470.82.01")


def b04_memory_not_available() -> FakeNVML:
    """B04: per-process memory None (nvidia-ml-py) on GPU0 and 2^64-1 (other bindings) on GPU1."""
    return FakeNVML([
        FakeGPU(uuid=_uuid(0), compute=[FakeProc(13820, None)], graphics=[FakeProc(2140, None)]),
        FakeGPU(uuid=_uuid(1), bus_id="00000000:02:00.0", compute=[FakeProc(13820, NA_U64)], graphics=[FakeProc(2140, NA_U64)]),
    ])


def b05_foreign_pid_namespace() -> FakeNVML:
    """B05: NVML returns host pid 28290, which the agent's PID namespace does not show."""
    return FakeNVML([FakeGPU(uuid=_uuid(0), compute=[FakeProc(28290, 1061158912)])])


def b07_mig_h100() -> FakeNVML:
    """B07: H100 in MIG mode: GI 2 (3g.40gb), 3 (2g.20gb), 9 and 10 (1g.10gb); parent
    utilization NotSupported; GI 9 memory NoPermission; two processes in GI 2 listed on the parent."""
    migs = [
        FakeMig(gi=2, uuid="MIG-2a2a2a2a-0000-0000-0000-000000000002", profile="3g.40gb", mem_total=40 * GiB, mem_used=10 * GiB),
        FakeMig(gi=3, uuid="MIG-3b3b3b3b-0000-0000-0000-000000000003", profile="2g.20gb", mem_total=20 * GiB),
        FakeMig(gi=9, uuid="MIG-9c9c9c9c-0000-0000-0000-000000000009", errors={"nvmlDeviceGetMemoryInfo": nvml_error("NoPermission")}),
        FakeMig(gi=10, uuid=None),  # UUID unreadable: derived as MIG-<parent>/10/0
    ]
    procs = [FakeProc(21180, 2407530496, 2, 0), FakeProc(21198, 7847542784, 2, 0)]
    return FakeNVML([FakeGPU(uuid=_uuid(0x100), name="NVIDIA H100 80GB HBM3", mig_mode=(1, 1), migs=migs, compute=procs,
                             errors={"nvmlDeviceGetUtilizationRates": nvml_error("NotSupported")})],
                    driver="590.48.01", binding="13.590.48")


def b08_lost_gpu(error: str = "Unknown") -> FakeNVML:
    """B08: 4 GPUs; ``nvmlDeviceGetHandleByIndex(1)`` raises Unknown (or GpuIsLost)."""
    gpus = [FakeGPU(uuid=_uuid(i), bus_id=f"00000000:{0x0A + i:02X}:00.0") for i in range(4)]
    gpus[1].handle_error = nvml_error(error)
    return FakeNVML(gpus)


def b09_version_mismatch() -> FakeNVML:
    """B09: ``nvmlInit`` raises LibRmVersionMismatch after an unattended driver upgrade."""
    return FakeNVML([FakeGPU(uuid=_uuid(0))], init_error=nvml_error("LibRmVersionMismatch"))


def b10_no_library() -> FakeNVML:
    """B10: ``nvmlInit`` raises LibraryNotFound."""
    return FakeNVML([], init_error=nvml_error("LibraryNotFound"))


def b12_exits_mid_lookup() -> FakeNVML:
    """B12: pid 22919 listed by NVML, gone by the owner lookup; 22920 is fine."""
    return FakeNVML([FakeGPU(uuid=_uuid(0), compute=[FakeProc(22919, 100 * MiB), FakeProc(22920, 200 * MiB)])])


def b13_access_denied() -> FakeNVML:
    """B13: pid 2140's owner cannot be read (AccessDenied / hidepid); 41001 is readable."""
    return FakeNVML([FakeGPU(uuid=_uuid(0), compute=[FakeProc(2140, 100 * MiB), FakeProc(41001, 200 * MiB)])])


def b15_graphics_and_compute() -> FakeNVML:
    """B15: 36528 in both lists (C+G), Xorg 978 and a render app 33466 in the graphics list."""
    return FakeNVML([FakeGPU(uuid=_uuid(0), compute=[FakeProc(36528, 9665773568)],
                             graphics=[FakeProc(978, 38797312), FakeProc(33466, 230686720), FakeProc(36528, 9665773568)])])


def b16_idle_with_display() -> FakeNVML:
    """B16: GPU0 91 MiB used by Xorg only, 0 %; GPU1 2 MiB used, no processes."""
    return FakeNVML([
        FakeGPU(uuid=_uuid(0), mem_used=91 * MiB, util_gpu=0, util_mem=0, graphics=[FakeProc(1357, 4 * MiB)]),
        FakeGPU(uuid=_uuid(1), bus_id="00000000:02:00.0", mem_used=2 * MiB, util_gpu=0, util_mem=0),
    ])


def b18_bytes_names() -> FakeNVML:
    """B18: names as bytes, str and undecodable bytes; a UUID as bytes."""
    return FakeNVML([
        FakeGPU(uuid=_uuid(0).encode(), name=b"NVIDIA A100-SXM4-80GB"),
        FakeGPU(uuid=_uuid(1), name="NVIDIA A100-SXM4-80GB", bus_id="00000000:02:00.0"),
        FakeGPU(uuid=_uuid(2), name=b"\xf8\x01NVIDIA", bus_id="00000000:03:00.0"),
    ], driver=b"535.104.05")


def b19_not_supported() -> FakeNVML:
    """B19: power NotSupported on GPU1, fan NotSupported on GPU0, GPU2 answers nearly nothing."""
    ns = nvml_error
    return FakeNVML([
        FakeGPU(uuid=_uuid(0), name="NVIDIA GeForce GTX 770", errors={"nvmlDeviceGetFanSpeed": ns("NotSupported")}),
        FakeGPU(uuid=_uuid(1), bus_id="00000000:02:00.0", errors={"nvmlDeviceGetPowerUsage": ns("NotSupported")}),
        FakeGPU(uuid=_uuid(2), bus_id="00000000:03:00.0", errors={
            f: ns("NotSupported") for f in (
                "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage",
                "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPages",
                "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows", "nvmlDeviceRegisterEvents",
                "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetComputeMode", "nvmlDeviceGetMigMode")}),
    ])


def busy_host(n_gpus: int = 8, pids: list[int] | None = None, procs_per_gpu: int = 5) -> FakeNVML:
    """A healthy host of ``n_gpus`` GPUs with ``procs_per_gpu`` compute processes each
    (8 x 5 = 40 by default); ``pids`` supplies real pids so owner lookups hit live processes."""
    pids = pids or [10_000 + i for i in range(n_gpus * procs_per_gpu)]
    gpus = []
    for g in range(n_gpus):
        mine = pids[g * procs_per_gpu:(g + 1) * procs_per_gpu]
        gpus.append(FakeGPU(uuid=_uuid(g), bus_id=f"00000000:{0x10 + g:02X}:00.0", mem_used=(5 + g) * GiB,
                            compute=[FakeProc(p, 512 * MiB) for p in mine]))
    return FakeNVML(gpus)
