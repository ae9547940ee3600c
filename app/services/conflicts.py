"""What a booking must pass before it is written: the devices it names exist and are
healthy, and none is reserved by another live reservation for an overlapping ``[start, end)``
(a whole GPU and its MIG slices exclude each other); then the guarded write, whose
exclusion-constraint violation (PostgreSQL) becomes a 409 naming the conflicts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import and_, or_, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload, selectinload

from app.errors import Conflict, InvalidInput, NotFound, ReservationConflict
from app.models import Device, DeviceQuarantine, DeviceTelemetry, Host, Reservation, ReservationDevice, ReservationShare
from app.schemas.reservation import ConflictRef
from app.services.quarantined import refuse_quarantined
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


def resolve_devices(session: Session, *, host: Host, refs: Sequence[str | int]) -> list[Device]:
    """Map UUIDs or indices of ``host`` to devices (index = whole GPUs only, MIG by UUID).

    Raises InvalidInput naming the reference for unknown, duplicate or retired devices.
    """
    devices = list(session.scalars(select(Device).where(Device.host_id == host.id, _refs_clause(refs))))
    return _match_refs(session, host, refs, devices)


def _refs_clause(refs: Sequence[str | int]):
    """SQL predicate for the non-retired devices that ``refs`` (UUIDs or whole-GPU indices) may name."""
    texts = [str(r).strip() for r in refs]
    indices = [int(t) for t in texts if t.isdigit() and int(t) < 2**31]
    return and_(
        Device.retired_at.is_(None),
        or_(Device.uuid.in_(texts), and_(Device.parent_id.is_(None), Device.index.in_(indices))),
    )


def _match_refs(session: Session, host: Host, refs: Sequence[str | int], devices: Sequence[Device]) -> list[Device]:
    """``refs`` mapped onto ``devices`` of ``host``; raises InvalidInput as
    :func:`resolve_devices` does (reading the host's devices only to hint at a MIG slice's
    UUID when a reference is unknown)."""
    by_uuid = {d.uuid: d for d in devices}
    by_index = {d.index: d for d in devices if d.parent_id is None and d.index is not None}
    out: list[Device] = []
    for ref in refs:
        text = str(ref).strip()
        dev = by_uuid.get(text)
        if dev is None and (isinstance(ref, int) or text.isdigit()):
            dev = by_index.get(int(text))
        if dev is None:
            raise InvalidInput(f"devices: {text!r} is not a device of host {host.name!r}{_slice_hint(session, host, text)}",
                               field="devices")
        if dev in out:
            raise InvalidInput(f"devices: {text!r} is listed twice", field="devices")
        out.append(dev)
    ids = {d.id for d in out}
    for d in out:
        if d.parent_id is not None and d.parent_id in ids:
            raise InvalidInput(
                f"devices: MIG instance {d.uuid} is part of a whole GPU also requested; ask for one or the other",
                field="devices",
            )
    return out


def resolve_bookable_devices(session: Session, *, host_name: str, refs: Sequence[str | int], tz: ZoneInfo = UTC_ZONE,
                             allow_quarantined: bool = False) -> tuple[Host, list[Device]]:
    """The host named ``host_name`` and its devices named by ``refs``, refused when reported
    lost or quarantined (a MIG instance too when its GPU is), read in one statement (host,
    devices, their health and open quarantines joined). ``allow_quarantined``: an admin's
    maintenance may hold a quarantined device (to repair it).

    Raises NotFound (404, field ``host``), InvalidInput (422, field ``devices``) as
    :func:`resolve_devices`, Conflict (409, field ``devices``) as :func:`check_health`.
    """
    quarantine = and_(or_(DeviceQuarantine.device_id == Device.id, DeviceQuarantine.device_id == Device.parent_id),
                      DeviceQuarantine.cleared_at.is_(None))
    rows = session.execute(
        select(Host, Device, DeviceTelemetry.health, DeviceQuarantine)
        .select_from(Host)
        .outerjoin(Device, and_(Device.host_id == Host.id, _refs_clause(refs)))
        .outerjoin(DeviceTelemetry, DeviceTelemetry.device_id == Device.id)
        .outerjoin(DeviceQuarantine, quarantine)
        .where(Host.name == host_name)
    ).all()
    if not rows:
        raise NotFound(f"host {host_name!r} not found", field="host")
    host = rows[0][0]
    listed = list({d.id: d for _h, d, _health, _q in rows if d is not None}.values())
    devices = _match_refs(session, host, refs, listed)
    lost = {d.id for _h, d, health, _q in rows if d is not None and health == "lost"}
    if lost:
        names = ", ".join(d.uuid for d in devices if d.id in lost)
        raise Conflict(f"devices: {names} reported lost by the host agent; not bookable until it is back", field="devices")
    held = {d.id: q for _h, d, _health, q in rows if d is not None and q is not None}
    if held and not allow_quarantined:
        parts = [f"{d.uuid} is quarantined since {fmt_local(held[d.id].started_at, tz)}: {held[d.id].reason}"
                 for d in devices if d.id in held]
        raise Conflict("devices: " + "; ".join(parts) + "; not bookable until the quarantine is cleared", field="devices")
    return host, devices
def _slice_hint(session: Session, host: Host, text: str) -> str:
    """For a MIG slice named the way people read it (``GPU 0 · MIG 4``, ``0/4``), the UUID to
    book it by: a slice is booked by its MIG UUID only, which survives re-indexing."""
    want = text.lower().replace("gpu", "").replace("mig", "/").replace("·", "").replace(" ", "")
    want = want.replace("//", "/")
    devices = list(session.scalars(select(Device).where(Device.host_id == host.id, Device.retired_at.is_(None))))
    by_id = {d.id: d for d in devices}
    for d in devices:
        parent = by_id.get(d.parent_id) if d.parent_id else None
        if parent is not None and f"{parent.index}/{d.gpu_instance_id}" == want:
            return f"; book a MIG slice by its UUID: {d.uuid}"
    return ""


def check_health(session: Session, devices: Iterable[Device], *, tz: ZoneInfo = UTC_ZONE) -> None:
    """Raise Conflict (409, field ``devices``) when any of ``devices`` is reported lost or is
    quarantined (:func:`app.services.quarantined.refuse_quarantined`)."""
    devices = list(devices)
    ids = [d.id for d in devices]
    lost = session.execute(
        select(Device.uuid, DeviceTelemetry.error)
        .join(DeviceTelemetry, DeviceTelemetry.device_id == Device.id)
        .where(Device.id.in_(ids), DeviceTelemetry.health == "lost")
    ).all()
    if lost:
        names = ", ".join(u for u, _ in lost)
        raise Conflict(f"devices: {names} reported lost by the host agent; not bookable until it is back", field="devices")
    refuse_quarantined(session, devices, tz=tz)


# ---------------------------------------------------------------------------- conflicts


def _overlap_clause(devices: Sequence[Device], start: datetime, end: datetime):
    """SQL predicate for active reservation_devices rows that exclude ``devices`` in ``[start, end)``."""
    per_device = []
    for d in devices:
        kind = 1 if d.parent_id else 0
        per_device.append(
            or_(
                ReservationDevice.device_id == d.id,
                and_(ReservationDevice.physical_id == d.physical_id, ReservationDevice.slice_kind != kind),
            )
        )
    return and_(
        ReservationDevice.active.is_(True),
        ReservationDevice.start_at < end,
        ReservationDevice.end_at > start,
        or_(*per_device),
    )


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

    The same rule as the booking check (``_overlap_clause``): a whole-GPU reservation holds
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
    q = select(ReservationDevice.reservation_id).where(_overlap_clause(devices, start, end))
    if exclude_id is not None:
        q = q.where(ReservationDevice.reservation_id != exclude_id)
    ids = set(session.scalars(q))
    if not ids:
        return []
    return list(session.scalars(select(Reservation).where(Reservation.id.in_(ids)).options(*loaded_options()).order_by(Reservation.start_at)))


def earliest_free_start(
    session: Session, *, devices: Sequence[Device], after: datetime, length: timedelta, exclude_id: int | None = None
) -> datetime:
    """The earliest instant ``t >= after`` at which all ``devices`` are free for ``[t, t + length)``."""
    q = select(ReservationDevice.start_at, ReservationDevice.end_at).where(
        _overlap_clause(devices, after, MAX_INSTANT)
    )
    if exclude_id is not None:
        q = q.where(ReservationDevice.reservation_id != exclude_id)
    busy = sorted(session.execute(q).all())
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
    tz: ZoneInfo = UTC_ZONE,
) -> ReservationConflict:
    """A 409 naming each conflicting reservation and the earliest free start: the message in
    the lab's zone ``tz``; ``conflicts`` and ``earliest_free_start`` as ISO 8601 UTC."""
    conflicts = find_conflicts(session, devices=devices, start=start, end=end, exclude_id=exclude_id)
    free = earliest_free_start(session, devices=devices, after=start, length=end - start, exclude_id=exclude_id)
    refs = [
        ConflictRef(
            id=c.id, user=c.user.username, devices=[d.uuid for d in devices_sorted(c)], start=c.start_at, end=c.end_at
        ).model_dump(mode="json")
        for c in conflicts
    ]
    what = "; ".join(
        f"#{c.id} by {c.user.username} on {', '.join(d.uuid for d in devices_sorted(c))} "
        f"[{fmt_local(c.start_at, tz)}, {fmt_local(c.end_at, tz)})" for c in conflicts
    ) or "a reservation committed concurrently"
    return ReservationConflict(
        f"requested devices are reserved: {what}; all free from {fmt_local(free, tz)}",
        conflicts=refs,
        earliest_free_start=free.isoformat(),
    )


def insert_items(session: Session, r: Reservation, devices: Sequence[Device]) -> None:
    for d in devices:
        r.items.append(
            ReservationDevice(
                device=d,
                physical_id=d.physical_id,
                slice_kind=1 if d.parent_id else 0,
                start_at=r.start_at,
                end_at=r.end_at,
                active=True,
            )
        )


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
    session.execute(
        text("SELECT pg_advisory_xact_lock(:cls, s.k) FROM (SELECT unnest(CAST(:ids AS integer[])) AS k ORDER BY 1) AS s"),
        {"cls": GPU_LOCK_CLASS, "ids": ids},
    )
