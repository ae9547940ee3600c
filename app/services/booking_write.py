"""The write of a new reservation, its devices and its shares: one path for bookings, series
occurrences and maintenance holds.

The rows are written with three SQLAlchemy Core ``INSERT`` statements (the reservation with
``RETURNING``, its ``reservation_devices`` and its ``reservation_shares`` as executemany),
inside :func:`app.services.conflicts.write_guarded`, so the database's no-double-booking
guard refuses them exactly as it refused the ORM's flush. The ORM's unit of work (object
states, dependency sort, one ``INSERT`` per object) cost about half of a booking's CPU for
rows whose shape never changes.

What the callers get back is a :class:`~app.models.Reservation` built from the written
rows, its relationships (``user``, ``host``, ``items`` with their ``device``, ``shares``) set
as if loaded. It is transient (no session, no identity key) and must never be added to a
session, which would insert it again: it is the answer's source, and a savepoint rolled
back after it (the waitlist tries slot after slot in one transaction) leaves no object in
the session that names a row that is gone. Change a reservation by loading it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import insert, inspect
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.models import Device, Host, Reservation, ReservationDevice, ReservationShare, User
from app.services.conflicts import UTC_ZONE, write_guarded

_RESERVATIONS = Reservation.__table__
# every column back, so the returned reservation carries the columns' defaults as written
_INSERT_RESERVATION = insert(_RESERVATIONS).returning(*_RESERVATIONS.c)
_INSERT_ITEMS = insert(ReservationDevice.__table__)
_INSERT_SHARES = insert(ReservationShare.__table__)
_COLUMN_KEYS = [(a.key, a.columns[0].key) for a in inspect(Reservation).column_attrs]


def add_reservation(
    session: Session,
    *,
    user: User,
    host: Host,
    devices: Sequence[Device],
    start: datetime,
    end: datetime,
    values: dict[str, Any],
    shares: Sequence[ReservationShare] = (),
    tz: ZoneInfo = UTC_ZONE,
) -> Reservation:
    """Write a reservation of ``devices`` on ``host`` for ``user`` over ``[start, end)``
    (UTC), with ``values`` for its other columns (``status``, ``kind``, ``note``,
    ``created_by_id``, ``override_reason``, ``series_id``, ``recurrence_start``,
    ``created_at``, ``updated_at``; columns left out take their defaults) and ``shares``
    (unsaved :class:`ReservationShare` objects with ``user`` or ``group`` set).

    The caller has checked the rules and the conflicts. Devices are written in id order,
    the one lock order of every writer. Raises :class:`~app.errors.ReservationConflict`
    (409) when the database's guard refuses an overlap another transaction committed since
    the check (PostgreSQL's exclusion constraints; on SQLite the write lock already excludes
    it). Returns the reservation as written, transient (module docstring).
    """
    ordered = sorted(devices, key=lambda d: d.id)
    items = [{"device_id": d.id, "physical_id": d.physical_id, "slice_kind": 1 if d.parent_id else 0,
              "start_at": start, "end_at": end, "active": True} for d in ordered]
    share_rows = [{"user_id": _id(s.user), "group_id": _id(s.group)} for s in shares]
    written: list[Any] = []

    def write() -> None:
        session.flush()  # ORM changes made before (an expired pending's freed devices) go first
        row = session.execute(_INSERT_RESERVATION, {**values, "user_id": user.id, "host_id": host.id,
                                                    "start_at": start, "end_at": end}).one()
        for child in (*items, *share_rows):
            child["reservation_id"] = row.id
        session.execute(_INSERT_ITEMS, items)
        if share_rows:
            session.execute(_INSERT_SHARES, share_rows)
        written.append(row)

    write_guarded(session, write, devices=ordered, start=start, end=end, exclude_id=None, tz=tz)
    return _as_loaded(written[0], user=user, host=host, items=zip(ordered, items), shares=zip(shares, share_rows))


def _id(obj: Any) -> int | None:
    """The id of a share's user or group, ``None`` for the side it does not name."""
    return obj.id if obj is not None else None


def _as_loaded(row: Any, *, user: User, host: Host, items: Iterable[tuple[Device, dict[str, Any]]],
               shares: Iterable[tuple[ReservationShare, dict[str, Any]]]) -> Reservation:
    """A detached :class:`Reservation` holding ``row``'s columns and the given relationships,
    each set as a loaded value (no change history, no events); ``items`` and ``shares``: each
    device or share with the values written for it."""
    r = Reservation()
    for attr, column in _COLUMN_KEYS:
        set_committed_value(r, attr, row._mapping[column])
    loaded = []
    for d, values in items:
        item = ReservationDevice()
        for key, value in (*values.items(), ("device", d), ("reservation", r)):
            set_committed_value(item, key, value)
        loaded.append(item)
    given = []
    for share, values in shares:
        for key, value in values.items():
            set_committed_value(share, key, value)
        given.append(share)
    for key, value in (("user", user), ("host", host), ("items", loaded), ("shares", given)):
        set_committed_value(r, key, value)
    return r


__all__ = ["add_reservation"]
