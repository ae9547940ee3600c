"""The health calls of the fake ``pynvml`` (:class:`testkit.fake_nvml.FakeNVML`): XID events,
pending page retirement and row remapping, as NVML answers them.

:class:`FakeGPU <testkit.fake_nvml.FakeGPU>` carries ``xids`` (XID codes waiting to be read as
events, consumed by ``nvmlEventSetWait`` in order), ``retired_pending`` (0/1) and
``remapped`` (corrected rows, uncorrected rows, pending, failure occurred). A GPU that does
not support a call names it in its ``errors`` (e.g. ``NotSupported``), like every other call.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pynvml as _real

_EventData = namedtuple("_EventData", "device eventType eventData gpuInstanceId computeInstanceId")


class FakeEventSet:
    """What ``nvmlEventSetCreate`` returns: the handles registered and the event mask of each."""

    def __init__(self) -> None:
        self.registered: dict[Any, int] = {}
        self.freed = False


class FakeHealthCalls:
    """Mixin of :class:`testkit.fake_nvml.FakeNVML` (needs its ``_enter`` and ``gpus``)."""

    def nvmlEventSetCreate(self) -> FakeEventSet:  # noqa: N802
        self._enter("nvmlEventSetCreate")  # type: ignore[attr-defined]
        return FakeEventSet()

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:  # noqa: N802
        self._enter("nvmlEventSetFree")  # type: ignore[attr-defined]
        event_set.freed = True

    def nvmlDeviceRegisterEvents(self, h: Any, event_types: int, event_set: FakeEventSet) -> None:  # noqa: N802
        self._enter("nvmlDeviceRegisterEvents", h)  # type: ignore[attr-defined]
        event_set.registered[h] = event_set.registered.get(h, 0) | int(event_types)

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> _EventData:  # noqa: N802
        """The next queued XID of a registered GPU; ``NVMLError_Timeout`` when none waits
        (``timeout_ms`` is not waited: the fake's queue is filled by the test, not by time)."""
        self._enter("nvmlEventSetWait")  # type: ignore[attr-defined]
        for h, mask in event_set.registered.items():
            gpu = self.gpus[h.gpu]  # type: ignore[attr-defined]
            if mask & _real.nvmlEventTypeXidCriticalError and gpu.xids:
                return _EventData(h, _real.nvmlEventTypeXidCriticalError, gpu.xids.pop(0), 0xFFFFFFFF, 0xFFFFFFFF)
        raise _real.NVMLError_Timeout()

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetRetiredPagesPendingStatus", h)  # type: ignore[attr-defined]
        return int(gpu.retired_pending)

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:  # noqa: N802
        gpu, _ = self._enter("nvmlDeviceGetRemappedRows", h)  # type: ignore[attr-defined]
        return tuple(gpu.remapped)  # type: ignore[return-value]
