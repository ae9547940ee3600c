"""Which devices are quarantined (read-only queries): what booking, placement, pages and
metrics ask. Opening and clearing quarantines is :mod:`app.services.quarantine`."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable
from zoneinfo import ZoneInfo

from sqlalchemy import select

from app.errors import Conflict
from app.models import Device, DeviceQuarantine
from app.timeutil import fmt_local


def open_by_device(session, device_ids: Iterable[int] | None = None) -> dict[int, DeviceQuarantine]:  # noqa: ANN001
    """Device id -> its open quarantine, for ``device_ids`` (``None``: every device)."""
    q = select(DeviceQuarantine).where(DeviceQuarantine.cleared_at.is_(None))
    if device_ids is not None:
        ids = sorted({i for i in device_ids if i is not None})
        if not ids:
            return {}
        q = q.where(DeviceQuarantine.device_id.in_(ids))
    return {row.device_id: row for row in session.scalars(q.order_by(DeviceQuarantine.id))}


QuarantineNow = namedtuple("QuarantineNow", ("id", "reason", "started_at", "self_clearing", "keys"))
"""An open quarantine as a plain value (``started_at`` UTC; ``keys``: its conditions' keys, a
tuple, for :func:`app.services.health_rule.local_reason`): compared by value, so pages may
key what they draw on it."""


def open_plain(session, device_ids: Iterable[int], *, chunk: int = 4000) -> dict[int, QuarantineNow]:  # noqa: ANN001
    """Device id -> its open quarantine as a :data:`QuarantineNow`, for ``device_ids`` (read
    as tuples, ``chunk`` ids per statement, under SQLite's bound-parameter limit)."""
    ids = sorted({i for i in device_ids if i is not None})
    out: dict[int, QuarantineNow] = {}
    for i in range(0, len(ids), chunk):
        for dev_id, *rest in session.execute(
            select(DeviceQuarantine.device_id, DeviceQuarantine.id, DeviceQuarantine.reason,
                   DeviceQuarantine.started_at, DeviceQuarantine.self_clearing, DeviceQuarantine.conditions)
            .where(DeviceQuarantine.cleared_at.is_(None), DeviceQuarantine.device_id.in_(ids[i : i + chunk]))
            .order_by(DeviceQuarantine.id)
        ):
            *head, conditions = rest
            out[dev_id] = QuarantineNow(*head, tuple(c["key"] for c in conditions or ()))
    return out


def quarantine_of(found: dict[int, DeviceQuarantine], device) -> DeviceQuarantine | None:  # noqa: ANN001
    """The open quarantine that keeps ``device`` (anything with ``id`` and ``parent_id``) from
    being booked, among ``found``: its own, or its GPU's for a MIG instance."""
    return found.get(device.id) or (found.get(device.parent_id) if device.parent_id else None)


def quarantined_among(session, devices: Iterable[Device]) -> list[tuple[Device, DeviceQuarantine]]:  # noqa: ANN001
    """The devices among ``devices`` that may not be booked for health, with the quarantine."""
    devices = list(devices)
    found = open_by_device(session, {d.id for d in devices} | {d.parent_id for d in devices})
    return [(d, q) for d in devices if (q := quarantine_of(found, d)) is not None]


def refuse_quarantined(session, devices: Iterable[Device], *, tz: ZoneInfo) -> None:  # noqa: ANN001
    """Raise Conflict (409, field ``devices``) naming every quarantined device among
    ``devices`` with its reason and since when (in the lab's zone ``tz``)."""
    bad = quarantined_among(session, devices)
    if bad:
        parts = [f"{d.uuid} is quarantined since {fmt_local(q.started_at, tz)}: {q.reason}" for d, q in bad]
        raise Conflict("devices: " + "; ".join(parts) + "; not bookable until the quarantine is cleared", field="devices")


__all__ = ["QuarantineNow", "open_by_device", "open_plain", "quarantine_of", "quarantined_among", "refuse_quarantined"]
