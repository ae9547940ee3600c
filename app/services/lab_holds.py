"""Who holds every device of the lab now, and who holds it next, from one read of the
reserved devices whose interval has not ended, reused while that read gives the same rows.

``GET /api/v1/devices`` and ``GET /metrics`` show holders for thousands of devices. Turning
the rows into holdings (:func:`~app.services.conflicts.match_holdings`, the one holder
rule, then :func:`~app.services.conflicts.holder_at`) costs more than reading them, so a
:class:`HoldsCache` keeps the answer under the rows *as the driver returned them* (cheap to
read and to compare: no type conversion) and the devices' key. Any booking, cancel, move
of a reservation's end or start, or new holder name gives other rows, so the next request
computes again; and because the rows change nothing when a reservation merely starts or
ends as the clock moves, the answer is also dropped at the first start or end after the
instant it was computed for (``valid_until``). Rows and answer come from one statement, so
what is cached under a key is what that key read.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from app.models import Device, Reservation, ReservationDevice
from app.services.conflicts import HeldBy, Holding, holder_at, match_holdings
from app.services.plain_holdings import holding_rows, item_rows

FOREVER = datetime.max.replace(tzinfo=UTC)

# Instants come back as the driver gives them (SQLite: text, PostgreSQL: datetimes) and are
# converted with the column type's own processor only when the answer is computed again.
# Walks ix_reservation_devices_end_at: history has ended, only these rows can hold.
_ROWS = {dialect: item_rows((ReservationDevice.active.is_(True), ReservationDevice.end_at > bindparam("now")),
                            dialect=dialect, raw_instants=True)
         for dialect in ("sqlite", "postgresql")}


class LabHolds(NamedTuple):
    """Device id -> the reservation holding it at the instant (``current``) and the first
    one starting after it (``upcoming``), for every non-retired device; devices nobody
    holds are absent. ``valid_until`` (UTC): the first start or end after the instant."""

    current: dict[int, HeldBy]
    upcoming: dict[int, HeldBy]
    valid_until: datetime


class DeviceRef(NamedTuple):
    """What the holder rule needs of a device."""

    id: int
    parent_id: int | None


class HoldsCache:
    """Per process, per application: the last :class:`LabHolds` with the rows and device
    key it was computed from. Thread-safe (requests run in a thread pool; two computing at
    once both compute, the later one is kept)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: tuple[tuple, list[DeviceRef]] | None = None
        self._holds: tuple[tuple, tuple, LabHolds] | None = None
        self.misses = 0

    def read(self, session: Session, *, now: datetime, lab: tuple) -> LabHolds:
        """The holders at ``now`` (UTC) of every non-retired device. ``lab``: the devices'
        key (:func:`app.services.now_state.lab_key`): when it moves, the devices are read
        again. Two statements at most (the reserved devices; the devices when ``lab``
        moved)."""
        # Core, not the ORM: plain rows, a third of the cost for thousands of them
        conn = session.connection()
        rows = tuple(map(tuple, conn.execute(_ROWS[conn.dialect.name], {"now": now}).fetchall()))
        with self._lock:
            got = self._holds
        if got is not None and got[0] == lab and got[1] == rows and now < got[2].valid_until:
            return got[2]
        self.misses += 1
        holds = _compute(session, self._lab_devices(session, lab), rows, now)
        with self._lock:
            self._holds = (lab, rows, holds)
        return holds

    def _lab_devices(self, session: Session, lab: tuple) -> list[DeviceRef]:
        with self._lock:
            got = self._devices
        if got is not None and got[0] == lab:
            return got[1]
        devices = [DeviceRef(*r) for r in session.execute(
            select(Device.id, Device.parent_id).where(Device.retired_at.is_(None)))]
        with self._lock:
            self._devices = (lab, devices)
        return devices


def _compute(session: Session, devices: Sequence[DeviceRef], rows: tuple, now: datetime) -> LabHolds:
    dialect = session.get_bind().dialect
    to_utc = Reservation.__table__.c.start_at.type.dialect_impl(dialect).result_processor(dialect, None)
    typed = [(*r[:5], to_utc(r[5]), to_utc(r[6]), *r[7:]) for r in rows]
    edges = [t for r in typed for t in (r[5], r[6]) if t > now]
    return now_and_next(match_holdings(devices, holding_rows(typed)), now, valid_until=min(edges, default=FOREVER))


def now_and_next(held: dict[int, list[Holding]], now: datetime, *, valid_until: datetime) -> LabHolds:
    """From each device's holdings (device id -> :class:`~app.services.conflicts.Holding`
    list, by start): the reservation holding it at ``now`` (UTC, :func:`holder_at`) and the
    first one starting after ``now``."""
    current: dict[int, HeldBy] = {}
    upcoming: dict[int, HeldBy] = {}
    for dev_id, found in held.items():
        h = holder_at(found, now)
        if h is not None:
            current[dev_id] = h.reservation  # type: ignore[assignment]
        nxt = next((x.reservation for x in found if x.reservation.start_at > now), None)
        if nxt is not None:
            upcoming[dev_id] = nxt  # type: ignore[assignment]
    return LabHolds(current=current, upcoming=upcoming, valid_until=valid_until)


__all__ = ["DeviceRef", "FOREVER", "HoldsCache", "LabHolds", "now_and_next"]
