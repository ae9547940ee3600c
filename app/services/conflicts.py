"""What a booking must pass before it is written (the devices it names are resolved and
checked for health by :mod:`app.services.device_refs`): none is reserved by another live reservation for an overlapping ``[start, end)``
(a whole GPU and its MIG slices exclude each other); then the guarded write, whose
exclusion-constraint violation (PostgreSQL) becomes a 409 naming the conflicts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import and_, bindparam, or_, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload, selectinload

from app.errors import ReservationConflict
from app.models import Device, Reservation, ReservationDevice, ReservationShare
from app.schemas.reservation import ConflictRef
from app.services.device_names import device_label
from app.timeutil import MAX_INSTANT, add_capped, fmt_local

UTC_ZONE = ZoneInfo("UTC")


def loaded_options() -> list:
    """Loader options for a reservation with devices, user, host and shares (relationships
    are ``lazy="raise"``)."""
    return [
        selectinload(Reservation.items).selectinload(ReservationDevice.device),
        selectinload(Reservation.user),
        selectinload(Reservation.host),
        selectinload(Reservation.shares).selectinload(ReservationShare.user),
        selectinload(Reservation.shares).selectinload(ReservationShare.group),
    ]


def devices_sorted(r: Reservation) -> list[Device]:
    """The reservation's devices in index order (UUID for devices without an index)."""
    return sorted((i.device for i in r.items), key=lambda d: (d.index if d.index is not None else 1 << 30, d.uuid))


# ---------------------------------------------------------------------------- conflicts


def _overlap_params(devices: Sequence[Device], start: datetime, end: datetime, exclude_id: int | None) -> dict:
    """The parameters of :data:`_CONFLICT_IDS` and :data:`_BUSY` for ``devices`` in
    ``[start, end)``, leaving out the reservation ``exclude_id`` (``None``: none)."""
    return {
        "exclude_id": exclude_id or 0,
        "ids": [d.id for d in devices],
        "whole_phys": [d.physical_id for d in devices if not d.parent_id],
        "slice_phys": [d.physical_id for d in devices if d.parent_id],
        "start": start,
        "end": end,
    }


# Active reservation_devices rows that exclude the devices with ids ``ids`` in
# ``[start, end)``: the device itself, a MIG slice of a whole GPU asked for (``whole_phys``,
# their physical ids) and the whole GPU of a MIG slice asked for (``slice_phys``). One
# statement shape for any number of devices, built once: building and hashing a new
# expression for every booking cost more CPU than the database spent running it.
_OVERLAP = and_(
    ReservationDevice.active.is_(True),
    ReservationDevice.start_at < bindparam("end"),
    ReservationDevice.end_at > bindparam("start"),
    or_(
        ReservationDevice.device_id.in_(bindparam("ids", expanding=True)),
        and_(ReservationDevice.physical_id.in_(bindparam("whole_phys", expanding=True)), ReservationDevice.slice_kind != 0),
        and_(ReservationDevice.physical_id.in_(bindparam("slice_phys", expanding=True)), ReservationDevice.slice_kind != 1),
    ),
)
# ... other than those of the reservation ``exclude_id`` (0 excludes none: row ids start at 1)
_CONFLICT_IDS = select(ReservationDevice.reservation_id).where(
    _OVERLAP, ReservationDevice.reservation_id != bindparam("exclude_id"))
_BUSY = select(ReservationDevice.start_at, ReservationDevice.end_at).where(
    _OVERLAP, ReservationDevice.reservation_id != bindparam("exclude_id"))


@dataclass(frozen=True)
class Holding:
    """One live reservation that keeps ``device_id`` from being free.

    ``via`` is ``None`` when the reservation names the device itself; otherwise the device
    it names instead: the whole GPU (for a MIG slice) or one of its MIG slices (for a whole
    GPU); from :func:`plain_holdings`, that device's id. Sibling slices never hold each other.
    """

    device_id: int
    reservation: Reservation | HeldBy
    via: Device | int | None = None


@dataclass(frozen=True, slots=True)
class HolderName:
    """The holder of a :class:`HeldBy` (only what pages and the API show of them)."""

    username: str


@dataclass(frozen=True, slots=True)
class HeldBy:
    """A live reservation as plain values (UTC instants), for read paths that build no ORM
    objects; the attributes the pages and the holder rule read of a :class:`Reservation`."""

    id: int
    start_at: datetime
    end_at: datetime
    kind: str
    note: str | None
    user: HolderName


def match_holdings(devices: Sequence, rows: Sequence) -> dict[int, list[Holding]]:
    """The holder rule on rows already read: device id -> its holdings, in the rows' order.

    ``devices``: anything with ``id`` and ``parent_id``; ``rows``: (device id, physical id,
    slice kind, reservation, via) per active ``reservation_devices`` row. A row holds a
    device it names, and a device of the same physical GPU with the other slice kind (a
    whole GPU and its MIG slices hold each other). Linear in devices plus rows."""
    by_device: dict[int, list[int]] = {}
    by_physical: dict[tuple[int, int], list[int]] = {}  # (physical id, slice kind) -> rows
    for pos, row in enumerate(rows):
        by_device.setdefault(row[0], []).append(pos)
        by_physical.setdefault((row[1], row[2]), []).append(pos)
    out: dict[int, list[Holding]] = {}
    for d in devices:
        own = by_device.get(d.id)
        other = by_physical.get((d.parent_id or d.id, 0 if d.parent_id else 1))  # the other slice kind
        if own is None and other is None:
            continue
        hits = sorted({*(own or ()), *(other or ())}) if own and other else (own or other)
        out[d.id] = [Holding(device_id=d.id, reservation=rows[p][3], via=None if rows[p][0] == d.id else rows[p][4])
                     for p in hits]  # type: ignore[union-attr]
    return out


def holdings(session: Session, *, devices: Sequence[Device], start: datetime, end: datetime) -> dict[int, list[Holding]]:
    """Device id -> the active reservations overlapping ``[start, end)`` that hold it, by start.

    The same rule as the booking check (``_OVERLAP``): a whole-GPU reservation holds
    its MIG slices and a MIG-slice reservation holds its whole GPU. Reservations come with
    their user loaded. One query for all ``devices`` (anything with ``id`` and ``parent_id``:
    ORM devices or plain rows).
    """
    if not devices:
        return {}
    ids = [d.id for d in devices]
    physical = {d.parent_id or d.id for d in devices}
    rows = session.scalars(
        select(ReservationDevice)
        .where(ReservationDevice.active.is_(True), ReservationDevice.start_at < end, ReservationDevice.end_at > start,
               or_(ReservationDevice.device_id.in_(ids), ReservationDevice.physical_id.in_(physical)))
        # one statement: the device and the reservation with its user joined in
        .options(joinedload(ReservationDevice.device),
                 joinedload(ReservationDevice.reservation).joinedload(Reservation.user))
        .order_by(ReservationDevice.start_at, ReservationDevice.reservation_id)
    ).all()
    return match_holdings(devices, [(r.device_id, r.physical_id, r.slice_kind, r.reservation, r.device) for r in rows])


def holder_at(found: Sequence[Holding], at: datetime) -> Holding | None:
    """The holding in force at ``at`` among ``found`` (one device's): a reservation naming the
    device itself first, then the earliest start (a whole GPU whose slices are booked by
    several people shows the first of them)."""
    live = [h for h in found if h.reservation.start_at <= at < h.reservation.end_at]
    live.sort(key=lambda h: (h.via is not None, h.reservation.start_at, h.reservation.id))
    return live[0] if live else None


def holders_at(session: Session, *, devices: Sequence[Device], at: datetime) -> dict[int, Holding]:
    """Device id -> who holds it at the instant ``at`` (devices nobody holds are absent)."""
    found = holdings(session, devices=devices, start=at, end=at + timedelta(microseconds=1))
    out = {}
    for dev_id, items in found.items():
        h = holder_at(items, at)
        if h is not None:
            out[dev_id] = h
    return out


def find_conflicts(
    session: Session, *, devices: Sequence[Device], start: datetime, end: datetime, exclude_id: int | None = None
) -> list[Reservation]:
    """Active reservations holding any of ``devices`` (or their MIG parent/slices) in ``[start, end)``."""
    ids = set(session.scalars(_CONFLICT_IDS, _overlap_params(devices, start, end, exclude_id)))
    if not ids:
        return []
    return list(session.scalars(select(Reservation).where(Reservation.id.in_(ids)).options(*loaded_options()).order_by(Reservation.start_at)))


def earliest_free_start(
    session: Session, *, devices: Sequence[Device], after: datetime, length: timedelta, exclude_id: int | None = None
) -> datetime:
    """The earliest instant ``t >= after`` at which all ``devices`` are free for ``[t, t + length)``."""
    busy = sorted(session.execute(_BUSY, _overlap_params(devices, after, MAX_INSTANT, exclude_id)).all())
    t = after
    moved = True
    while moved:
        moved = False
        for s, e in busy:
            if s < add_capped(t, length) and e > t:
                t = e
                moved = True
    return t


def conflict_error(
    session: Session, *, devices: Sequence[Device], start: datetime, end: datetime, exclude_id: int | None,
    tz: ZoneInfo = UTC_ZONE, viewer: str | None = None, found: Sequence[Reservation] | None = None,
) -> ReservationConflict:
    """A 409 naming each conflicting reservation and the earliest free start. The message is
    for people: times in the lab's zone ``tz``, devices by their labels (``GPU 0``,
    ``GPU 0 · MIG 4``), the reservations of ``viewer`` (the requester's username) called
    theirs; ``conflicts`` (:func:`conflict_refs`) and ``earliest_free_start`` (ISO 8601 UTC)
    are for machines.
    ``found``: what :func:`find_conflicts` already returned for the same arguments, if the
    caller has it (not read again)."""
    conflicts = list(found) if found is not None else find_conflicts(
        session, devices=devices, start=start, end=end, exclude_id=exclude_id)
    free = earliest_free_start(session, devices=devices, after=start, length=end - start, exclude_id=exclude_id)
    blocking = in_the_way(devices, conflicts, start, end)
    refs = _refs(conflicts, blocking)
    parent_ids = {d.parent_id for c in conflicts for d in blocking[c.id] if d.parent_id is not None}
    parents = {d.id: d for d in session.scalars(select(Device).where(Device.id.in_(parent_ids)))} if parent_ids else {}

    def whose(c: Reservation) -> str:
        return "yours" if viewer is not None and c.user.username == viewer else f"by {c.user.username}"

    what = "; ".join(
        f"#{c.id} {whose(c)} on {', '.join(device_label(d, parents.get(d.parent_id)) for d in blocking[c.id])} "
        f"[{fmt_local(c.start_at, tz)}, {fmt_local(c.end_at, tz)})" for c in conflicts
    ) or "a reservation committed concurrently"
    return ReservationConflict(
        f"requested devices are reserved: {what}; all free from {fmt_local(free, tz)}",
        conflicts=refs,
        earliest_free_start=free.isoformat(),
    )


def in_the_way(devices: Sequence[Device], conflicts: Sequence[Reservation], start: datetime,
               end: datetime) -> dict[int, list[Device]]:
    """Reservation id -> its devices that hold one of the requested ``devices`` (by the holder
    rule, :func:`match_holdings`: the device itself, or the whole GPU of a requested MIG slice,
    or a MIG slice of a requested whole GPU) for part of ``[start, end)``, in index order. A
    booking of one GPU that collides with a reservation of four is told of the one GPU in its
    way, not of all four, nor of one its holder gave back early."""
    rows = [(i.device_id, i.physical_id, i.slice_kind, c, i.device) for c in conflicts for i in c.items
            if i.active and i.start_at < end and i.end_at > start]  # a device given back early is in no one's way
    held = {(h.reservation.id, h.via.id if h.via is not None else h.device_id)
            for hs in match_holdings(devices, rows).values() for h in hs}
    return {c.id: [d for d in devices_sorted(c) if (c.id, d.id) in held] or devices_sorted(c) for c in conflicts}


def conflict_refs(devices: Sequence[Device], conflicts: Sequence[Reservation], start: datetime,
                  end: datetime) -> list[dict]:
    """The ``conflicts`` member of a 409 (:class:`~app.schemas.reservation.ConflictRef` as
    JSON): each reservation in the way of ``devices`` over ``[start, end)``, with only its
    devices in the way (:func:`in_the_way`)."""
    return _refs(conflicts, in_the_way(devices, conflicts, start, end))


def _refs(conflicts: Sequence[Reservation], blocking: dict[int, list[Device]]) -> list[dict]:
    return [ConflictRef(id=c.id, user=c.user.username, devices=[d.uuid for d in blocking[c.id]], start=c.start_at,
                        end=c.end_at).model_dump(mode="json") for c in conflicts]


def write_guarded(
    session: Session,
    mutate: Callable[[], None],
    *,
    devices: Sequence[Device],
    start: datetime,
    end: datetime,
    exclude_id: int | None,
    tz: ZoneInfo = UTC_ZONE,
) -> None:
    """Run ``mutate()`` and flush inside a savepoint; an exclusion violation (PostgreSQL
    23P01: another transaction committed an overlapping reservation meanwhile) rolls back
    just the savepoint and becomes a 409 naming the conflict.

    On PostgreSQL the writer first takes :func:`lock_physical_gpus`, so two writers never
    have conflicting rows in flight at once: the exclusion check never waits on a
    transaction that waits back (a deadlock, 40P01, which would surface as a 503)."""
    if session.get_bind().dialect.name == "sqlite":
        # serialised by BEGIN IMMEDIATE and checked just before: no savepoint needed
        mutate()
        session.flush()
        return
    lock_physical_gpus(session, devices)
    try:
        with session.begin_nested():
            mutate()
            session.flush()
    except IntegrityError as e:
        code = getattr(e.orig, "sqlstate", None)
        if code == "23P01":
            raise conflict_error(session, devices=devices, start=start, end=end, exclude_id=exclude_id, tz=tz) from None
        raise


#: First key of the two-key advisory locks that serialise writers per physical GPU, so the
#: application's locks cannot collide with another user of the same database.
GPU_LOCK_CLASS = 0x6770  # "gp"
_LOCK_GPUS = text("SELECT pg_advisory_xact_lock(:cls, s.k) FROM (SELECT unnest(CAST(:ids AS integer[])) AS k ORDER BY 1) AS s")


def lock_physical_gpus(session: Session, devices: Sequence[Device]) -> None:
    """Take PostgreSQL transaction-level advisory locks on the physical GPUs of ``devices``
    (a MIG slice locks its parent GPU), in ascending id order, held until commit.

    Concurrent inserts of overlapping rows into an exclusion constraint can each see the
    other's uncommitted row and wait for each other; PostgreSQL then aborts one with a
    deadlock. Writers that hold the lock of every GPU they write never have conflicting rows
    in flight together, and one global order keeps the locks themselves deadlock-free.
    A no-op on SQLite, whose writers are already serialised."""
    if session.get_bind().dialect.name != "postgresql":
        return
    ids = sorted({d.physical_id for d in devices})
    if not ids:
        return
    session.execute(_LOCK_GPUS, {"cls": GPU_LOCK_CLASS, "ids": ids})
