"""The record of one violation (:class:`Judgement`) and the primitives every judging rule
shares: the finding key, UTC normalisation, the half-open activity test and entitlement.
Pure: no I/O, no clock. :mod:`agent.policy` (processes) and :mod:`agent.idle` (idle
reservations) build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from agent.schema import FindingKind, ReservationEntry


@dataclass(frozen=True, slots=True)
class Judgement:
    """One violation at one instant, before any debouncing.

    ``pid``/``create_time``/process fields are ``None`` for ``idle`` (which is about a
    reservation, not a process). ``reservation_id``/``holder``: for ``foreign`` the
    reservation and unix name of the rightful holder now; for ``overrun`` the owner's ended
    reservation (``holder`` ``None``: nobody holds the device now); for ``idle`` the idle
    reservation and its holder; for ``unreserved`` both ``None``.
    """

    kind: FindingKind
    device_uuid: str
    reason: str
    pid: int | None = None
    create_time: float | None = None
    unix_user: str | None = None
    uid: int | None = None
    command: str | None = None
    name: str | None = None
    container_id: str | None = None
    reservation_id: int | None = None
    holder: str | None = None
    reservation_end: datetime | None = None
    identity: str | None = None
    container_name: str | None = None
    container_image: str | None = None

    @property
    def key(self) -> str:
        """The stable finding key ``uuid:pid:identity:kind`` (idle: ``uuid:-:r<id>:idle``)."""
        if self.kind == "idle":
            return f"{self.device_uuid}:-:r{self.reservation_id}:idle"
        return finding_key(self.device_uuid, self.pid, self.create_time, self.kind, identity=self.identity)


def finding_key(
    device_uuid: str, pid: int | None, create_time: float | None, kind: str, *, identity: str | None = None
) -> str:
    """Return ``uuid:pid:identity:kind``, ``identity`` being ``<start ticks>@<boot id>``, which
    no clock step moves. Without it (replayed processes) ``create_time`` with 2 decimals
    (psutil's 10 ms resolution) stands in; ``-`` for ``None``."""
    if identity:
        ct = identity
    else:
        ct = "-" if create_time is None else f"{create_time:.2f}"
    return f"{device_uuid}:{pid if pid is not None else '-'}:{ct}:{kind}"


def as_utc(value: datetime) -> datetime:
    """Return ``value`` as an aware UTC datetime; a naive value is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def is_active(reservation: ReservationEntry, now: datetime) -> bool:
    """True when ``now`` lies in the half-open ``[start, end)`` of ``reservation``."""
    t = as_utc(now)
    return as_utc(reservation.start) <= t < as_utc(reservation.end)


def entitled(reservation: ReservationEntry, unix_user: str | None, uid: int | None = None) -> bool:
    """True when ``unix_user`` (or, for a host process, its ``uid``) holds ``reservation`` or
    is shared into it."""
    if uid is not None and (uid == reservation.unix_uid or uid in reservation.shared_uids):
        return True
    return unix_user is not None and (unix_user == reservation.unix_name or unix_user in reservation.shared_with)
