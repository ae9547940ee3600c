"""Device health through the NVML choke point: XID error events, uncorrectable ECC errors,
pages waiting for retirement, rows waiting for a remap (or a failed remap), a lost GPU, and
clocks slowed down for temperature or power.

Every reading is optional: a driver or GPU that answers NotSupported (GeForce boards have no
ECC, pre-Ampere GPUs no row remapper, Ampere and later no page retirement) gives a check in
state ``unknown``, never a failure of the poll. Which readings are critical is the service's
rule, not the agent's: the agent reports what it saw (:class:`~agent.schema.HealthCheck`).

XID errors arrive as NVML events. One event set is created after NVML is initialised; every
whole GPU is registered for ``nvmlEventTypeXidCriticalError`` the first time it is read, and
every poll drains the set with ``nvmlEventSetWait(set, 0)`` (timeout 0: never blocks the
poll) until NVML answers Timeout, at most :data:`MAX_EVENTS_PER_POLL` events.

nvidia-smi equivalents: ``-q -d ECC`` (volatile, uncorrectable), ``-q -d PAGE_RETIREMENT``
(Pending Page Blacklist), ``-q -d ROW_REMAPPER`` (Pending / Remapping Failure Occurred),
``-q -d PERFORMANCE`` (HW/SW Thermal Slowdown, HW Power Brake Slowdown).
"""

from __future__ import annotations

from typing import Any

from agent.nvml_errors import DeviceFault, GpuLost, HostDown, NoEvent, NotAvailable
from agent.schema import HealthCheck
from agent.telemetry import to_str, warn_once

#: nvml.h's nvmlEventTypeXidCriticalError (pynvml exposes the same name)
XID_CRITICAL_EVENT = 0x8
#: events read per poll at most: a GPU storming XIDs must not stall the poll
MAX_EVENTS_PER_POLL = 64
#: throttle reason names (agent.nvml_device._THROTTLE_BITS) that count as each slowdown
SLOWDOWN_REASONS = {
    "thermal_slowdown": ("hw_thermal_slowdown", "sw_thermal_slowdown"),
    "power_slowdown": ("hw_power_brake_slowdown",),
}


def slowdown_checks(throttle_reasons: list[str] | None) -> list[HealthCheck]:
    """Thermal and power slowdown checks from the active throttle reason names (``None``:
    NVML could not say, both ``unknown``)."""
    out = []
    for kind, names in SLOWDOWN_REASONS.items():
        if throttle_reasons is None:
            out.append(HealthCheck(kind=kind, state="unknown"))  # type: ignore[arg-type]
            continue
        active = [n for n in names if n in throttle_reasons]
        out.append(HealthCheck(kind=kind, state="bad" if active else "ok",  # type: ignore[arg-type]
                               detail=", ".join(active) or None))
    return out


def ecc_check(count: int | None) -> HealthCheck:
    """The volatile uncorrectable ECC check from the error count (``None``: not available)."""
    if count is None:
        return HealthCheck(kind="ecc_uncorrected", state="unknown")
    return HealthCheck(kind="ecc_uncorrected", state="bad" if count > 0 else "ok", value=count)


def flag_check(kind: str, flag: bool | None, value: int | None = None) -> HealthCheck:
    """A yes/no reading as a check: ``None`` unknown, ``True`` bad (with ``value`` if known)."""
    if flag is None:
        return HealthCheck(kind=kind, state="unknown")  # type: ignore[arg-type]
    return HealthCheck(kind=kind, state="bad" if flag else "ok", value=value if flag else None)  # type: ignore[arg-type]


LOST_CHECKS = [HealthCheck(kind="gpu_lost", state="bad", detail="GPU_IS_LOST or no device handle")]


class HealthReader:
    """The health half of :class:`agent.nvml.NvmlSource` (see module doc).

    Relies on the source's ``_raw``, ``_q`` and ``_lib``; keeps ``_events`` (the event set,
    ``False`` when the driver has none), ``_xid_registered`` (uuid -> registered, ``False``
    when the GPU does not support XID events) and ``_health_slow`` (uuid -> the slow checks).
    """

    _events: Any = None
    _xid_registered: dict[str, bool]
    _health_slow: dict[str, list[HealthCheck]]

    def _reset_health(self) -> None:
        """Forget the event set and registrations (NVML was shut down; handles are invalid)."""
        if self._events not in (None, False):
            try:
                self._raw("nvmlEventSetFree", self._events)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - freeing on the way down, nothing to report to
                pass
        self._events = None
        self._xid_registered = {}

    def _slow_health(self, errs: list[str], handle: Any, uuid: str, ecc: int | None) -> list[HealthCheck]:
        """ECC, pending page retirement and row remapping (read in the slow round)."""
        q = self._q  # type: ignore[attr-defined]
        checks = [ecc_check(ecc)]
        pending = q(errs, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        checks.append(flag_check("retired_pages_pending", bool(pending) if isinstance(pending, int) else None))
        rows = q(errs, "nvmlDeviceGetRemappedRows", handle)
        if isinstance(rows, (list, tuple)) and len(rows) >= 4:
            corr, unc, is_pending, failed = rows[:4]
            checks.append(flag_check("remapped_rows_pending", bool(is_pending),
                                     int(unc) if isinstance(unc, int) and unc < 2**32 - 1 else None))
            checks.append(flag_check("remapped_rows_failure", bool(failed)))
        else:
            checks += [flag_check("remapped_rows_pending", None), flag_check("remapped_rows_failure", None)]
        self._health_slow[uuid] = checks
        return checks

    def _device_health(self, errs: list[str], handle: Any, uuid: str, reasons: list[str] | None,
                       ecc: int | None, slow_round: bool) -> list[HealthCheck]:
        """The checks of one whole GPU for this poll, XID aside (added by :meth:`_add_xids`)."""
        slow = self._health_slow.get(uuid)
        if slow is None or slow_round:
            slow = self._slow_health(errs, handle, uuid, ecc)
        self._register_xid(handle, uuid)
        return [*slow, *slowdown_checks(reasons)]

    def _register_xid(self, handle: Any, uuid: str) -> None:
        if uuid in self._xid_registered:
            return
        if self._events is None:
            try:
                self._events = self._raw("nvmlEventSetCreate")  # type: ignore[attr-defined]
            except (NotAvailable, DeviceFault, GpuLost) as exc:
                warn_once("xid-set", "NVML event set not available (%s): XID errors reported as unknown", exc)
                self._events = False
        if self._events is False:
            self._xid_registered[uuid] = False
            return
        mask = getattr(self._lib, "nvmlEventTypeXidCriticalError", XID_CRITICAL_EVENT)  # type: ignore[attr-defined]
        mask = mask if isinstance(mask, int) else XID_CRITICAL_EVENT
        try:
            self._raw("nvmlDeviceRegisterEvents", handle, mask, self._events)  # type: ignore[attr-defined]
            self._xid_registered[uuid] = True
        except (NotAvailable, DeviceFault) as exc:
            warn_once(f"xid-reg:{uuid}", "XID events not available on %s (%s): reported as unknown", uuid, exc)
            self._xid_registered[uuid] = False

    def _drain_xids(self) -> dict[str, list[int]]:
        """XID codes per GPU UUID of the events waiting in the set (never blocks)."""
        found: dict[str, list[int]] = {}
        if self._events in (None, False):
            return found
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                data = self._raw("nvmlEventSetWait", self._events, 0)  # type: ignore[attr-defined]
            except NoEvent:
                break
            except HostDown:
                raise
            except (NotAvailable, DeviceFault, GpuLost) as exc:
                warn_once(f"xid-wait:{type(exc).__name__}", "reading XID events failed: %s", exc)
                break
            code = getattr(data, "eventData", None)
            try:
                uuid = to_str(self._raw("nvmlDeviceGetUUID", data.device), "GPU UUID")  # type: ignore[attr-defined]
            except (NotAvailable, DeviceFault, GpuLost):
                uuid = None
            if uuid and isinstance(code, int) and 0 <= code < 2**32:
                found.setdefault(uuid, []).append(code)
        return found

    def _add_xids(self, devices: list[Any]) -> None:
        """Append the ``xid`` checks to the whole GPUs among ``devices`` (DeviceReport)."""
        xids = self._drain_xids()
        for dev in devices:
            if dev.parent_uuid is not None or dev.health == "lost":
                continue
            registered = self._xid_registered.get(dev.uuid)
            codes = xids.get(dev.uuid, [])
            if codes:
                dev.health_checks += [HealthCheck(kind="xid", state="bad", value=c) for c in codes[:16]]
            else:
                dev.health_checks.append(HealthCheck(kind="xid", state="ok" if registered else "unknown"))
