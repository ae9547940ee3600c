"""The one rule that decides whether a device is in a critical condition (pure: no I/O).

Input: one :class:`~agent.schema.DeviceReport` of a snapshot. Output: its critical
conditions, each with a stable ``key`` (what a quarantine and an admin's acknowledgement are
compared by), a reason people read, and whether the condition ends by itself.

Critical:

* ``gpu_lost``: the GPU fell off the bus (``GPU_IS_LOST``, no handle): needs a reset;
* ``xid``: an XID error event whose code points at the hardware or driver (:data:`CRITICAL_XIDS`:
  ECC and row-remap faults, NVLink errors, fallen off the bus, GSP errors). XIDs that a
  user's program causes (13 graphics engine exception, 31 MMU fault, 43 stopped, 45
  preemptive cleanup, 68/69 video/graphics class errors) are not the device's fault;
* ``ecc_uncorrected``: volatile uncorrectable ECC errors (count > 0; key by count, so a
  rising count after an admin's clear quarantines again);
* ``retired_pages_pending`` / ``remapped_rows_pending``: memory waits for a GPU reset to
  retire a page or remap a row; ``remapped_rows_failure``: a row could not be remapped;
* ``thermal_slowdown`` / ``power_slowdown``: clocks cut for temperature or power brake.
  These end by themselves (``self_clearing``): the quarantine lifts once the device has
  reported without them for ``health_self_clear_seconds``.

A reading in state ``unknown`` (NotSupported, N/A) is never critical.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from agent.schema import DeviceReport
from app.i18n import N_, gettext

#: XID codes that mean the device (not the user's program) is in trouble
CRITICAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
#: kinds of condition that end by themselves
SELF_CLEARING = frozenset({"thermal_slowdown", "power_slowdown"})

_TEXT = {
    "gpu_lost": N_("GPU lost (fell off the bus)"),
    "ecc_uncorrected": N_("uncorrectable ECC errors"),
    "retired_pages_pending": N_("retired memory pages pending (GPU reset needed)"),
    "remapped_rows_pending": N_("remapped memory rows pending (GPU reset needed)"),
    "remapped_rows_failure": N_("memory row remapping failed"),
    "thermal_slowdown": N_("thermal slowdown"),
    "power_slowdown": N_("power brake slowdown"),
}


@dataclass(frozen=True, slots=True)
class Condition:
    """One critical condition of a device.

    ``kind``: a :data:`agent.schema.HealthKind`; ``key``: ``kind`` or ``kind:value``
    (``xid:79``, ``ecc_uncorrected:3``); ``reason``: a short sentence for people.
    """

    kind: str
    key: str
    reason: str
    self_clearing: bool = False

    def as_dict(self) -> dict:
        """The JSON form stored in ``device_quarantines.conditions``."""
        return asdict(self)


def critical_conditions(report: DeviceReport) -> list[Condition]:
    """The critical conditions of ``report`` (empty when it is healthy or says nothing),
    one per key, in the order the agent reported them."""
    out: dict[str, Condition] = {}
    if report.health == "lost":
        out["gpu_lost"] = Condition("gpu_lost", "gpu_lost", _TEXT["gpu_lost"])
    for check in report.health_checks:
        if check.state != "bad":
            continue
        kind = check.kind
        if kind == "xid":
            if check.value not in CRITICAL_XIDS:
                continue
            cond = Condition(kind, f"xid:{check.value}", f"XID {check.value} error")  # local_reason words it again
        elif kind == "ecc_uncorrected":
            count = check.value or 0
            if count <= 0:
                continue
            cond = Condition(kind, f"{kind}:{count}", f"{count} {_TEXT[kind]}")
        else:
            cond = Condition(kind, kind, _TEXT[kind], kind in SELF_CLEARING)
        out.setdefault(cond.key, cond)
    return list(out.values())


def describe(conditions: list[Condition] | list[dict]) -> str:
    """One line naming every condition (``"XID 79 error; thermal slowdown"``), at most 512 characters."""
    reasons = [c["reason"] if isinstance(c, dict) else c.reason for c in conditions]
    return "; ".join(reasons)[:512]


def local_reason(conditions: list[dict] | list[Condition] | tuple[str, ...]) -> str:
    """:func:`describe` in the current locale (:mod:`app.i18n`), rebuilt from the conditions'
    keys (dicts or :class:`Condition` with ``key``, or the key strings themselves), so a page
    shows a stored quarantine's reason in its reader's language; English outside a page."""
    parts = []
    for c in conditions:
        key = c if isinstance(c, str) else (c["key"] if isinstance(c, dict) else c.key)
        kind, _sep, value = key.partition(":")
        if kind == "xid":
            parts.append(gettext("XID %(code)s error", code=value))
        elif kind == "ecc_uncorrected":
            parts.append(gettext("%(count)s uncorrectable ECC errors", count=value))
        else:
            parts.append(gettext(_TEXT[kind]) if kind in _TEXT else kind)
    return "; ".join(parts)[:512]


__all__ = ["CRITICAL_XIDS", "Condition", "SELF_CLEARING", "critical_conditions", "describe", "local_reason"]
