"""Who holds which device, read as plain values: the holder rule of
:mod:`app.services.conflicts` (:func:`~app.services.conflicts.match_holdings`) over tuples,
with no ORM objects, for pages and lists of thousands of devices."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, Select, String, literal_column, or_, select, true, type_coerce
from sqlalchemy.orm import Session

from app.models import Reservation, ReservationDevice, User
from app.services.conflicts import HeldBy, HolderName, Holding, match_holdings

CHUNK = 4000  # device ids per statement: under SQLite's bound-parameter limit


def item_rows(where: Sequence[ColumnElement[bool]], *, dialect: str, raw_instants: bool = False) -> Select:
    """The statement of (item id, device id, physical id, slice kind, reservation id, start,
    end, kind, note, holder's username) of the ``reservation_devices`` rows ``where``
    selects, each with its reservation and holder, as :func:`holding_rows` takes them.
    ``raw_instants``: start and end as the driver returns them, unconverted.

    Each row's reservation is reached by its primary key, whatever the planner's statistics.
    On PostgreSQL a plain join let the planner choose by estimates that go stale as soon as
    bookings are made after the tables were analysed (the instant compared lies past what
    was analysed: one row estimated on each side), and it then scanned a range of
    reservations once per reserved device, or the whole history for a hash join; a
    ``LATERAL`` subquery that cannot be flattened (``OFFSET 0``) is one index lookup per
    row. SQLite has no ``LATERAL``; its planner reaches the reservation by rowid.
    """
    if dialect == "postgresql":
        r = (select(Reservation.start_at, Reservation.end_at, Reservation.kind, Reservation.note, Reservation.user_id)
             .where(Reservation.id == ReservationDevice.reservation_id).offset(literal_column("0")).lateral("r"))
        start, end, kind, note, user_id = r.c.start_at, r.c.end_at, r.c.kind, r.c.note, r.c.user_id
        joined = select(ReservationDevice).join(r, true())
    else:
        start, end, kind, note, user_id = (Reservation.start_at, Reservation.end_at, Reservation.kind, Reservation.note,
                                           Reservation.user_id)
        joined = select(ReservationDevice).join(Reservation, Reservation.id == ReservationDevice.reservation_id)
    if raw_instants:
        start, end = type_coerce(start, String), type_coerce(end, String)
    return (joined.with_only_columns(ReservationDevice.id, ReservationDevice.device_id, ReservationDevice.physical_id,
                                     ReservationDevice.slice_kind, ReservationDevice.reservation_id, start, end, kind,
                                     note, User.username, maintain_column_froms=False)
            .join(User, User.id == user_id).where(*where))


def plain_holdings(session: Session, *, devices: Sequence, start: datetime, end: datetime) -> dict[int, list[Holding]]:
    """:func:`holdings` as plain values (:class:`HeldBy`, ``via`` a device id), read as
    tuples: for pages and lists of thousands of devices. Device ids go to the database in
    chunks (under SQLite's bound-parameter limit), each walking the device indexes."""
    if not devices:
        return {}
    ids = [d.id for d in devices]
    physical = sorted({d.parent_id or d.id for d in devices})
    seen: dict[int, tuple] = {}
    for i in range(0, max(len(ids), len(physical)), CHUNK):
        chunk, phys = ids[i : i + CHUNK], physical[i : i + CHUNK]
        for row in session.execute(item_rows(
            (ReservationDevice.active.is_(True), ReservationDevice.start_at < end, ReservationDevice.end_at > start,
             or_(ReservationDevice.device_id.in_(chunk), ReservationDevice.physical_id.in_(phys))),
            dialect=session.get_bind().dialect.name,
        )):
            seen[row[0]] = row
    return match_holdings(devices, holding_rows(seen.values()))


def holding_rows(rows: Iterable[Sequence]) -> list[tuple]:
    """The rows :func:`~app.services.conflicts.match_holdings` takes, by start as
    :func:`~app.services.conflicts.holdings` orders them (an item's interval is its
    reservation's), from (item id, device id, physical id, slice kind, reservation id,
    start, end, kind, note, username) tuples (UTC instants); one :class:`HeldBy` per
    reservation."""
    users: dict[str, HolderName] = {}
    held: dict[int, HeldBy] = {}
    out = []
    for _id, dev, phys_id, kind, rid, r_start, r_end, r_kind, note, username in sorted(rows, key=lambda r: (r[5], r[4])):
        r = held.get(rid)
        if r is None:
            user = users.get(username) or users.setdefault(username, HolderName(username))
            r = held[rid] = HeldBy(id=rid, start_at=r_start, end_at=r_end, kind=r_kind, note=note, user=user)
        out.append((dev, phys_id, kind, r, dev))
    return out
