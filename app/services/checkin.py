"""Check-in by evidence and idle holders: the rules, the evidence, the holder's answers.

A reservation is *checked in* once one of its holder's processes (a container attributed to
the holder counts: the agent reports it under the owner's Unix name) runs on one of its
devices, or on a MIG slice of a whole GPU it holds. Ingest marks that with one set-based
UPDATE (:func:`mark_checked_in`), only on reservations not yet checked in.

The periodic sweep (:mod:`app.services.checkin_sweep`) warns and releases no-shows and asks
idle holders "still using it?". It acts only on *trusted* evidence (:func:`trusted`): a host
whose agent is stale, down, degraded or suspect, or a device whose process data is anything
but ``ok``, never causes a warning or a release.

The holder answers ``keep`` (:func:`keep`) or releases (the ordinary release; the slot-freed
listener :func:`_note_consent` records that it followed the question) on the web, through a
signed link in the notice (:mod:`app.services.answer_links`) or with ``gpuroster keep ID`` /
``gpuroster release ID``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, bindparam, exists, or_, select, update
from sqlalchemy.orm import Session

from app.errors import Conflict, Forbidden
from app.models import Device, DeviceProcess, DeviceTelemetry, Finding, Host, Reservation, ReservationDevice, User
from app.models.states import FindingKind, FindingState, HostStatus
from app.services import lifecycle, slot_freed
from app.services.devices import host_status
from app.services.reservations import checkin_question
from app.services.limits import resolve_limits
from app.services.audit import record_audit

# Used where a rule sets the feature on but leaves these unset (minutes; the silence policy).
DEFAULTS = {"checkin_min_booking_minutes": 60, "checkin_grace_minutes": 15, "idle_after_minutes": 60,
            "idle_grace_minutes": 30, "idle_silence": "nothing"}


@dataclass(frozen=True)
class CheckinRules:
    """One holder's resolved settings. ``checkin_minutes`` ``None``: no check-in required;
    ``idle_below_percent`` ``None``: nobody is asked about idle devices. Minutes, percent."""

    checkin_minutes: int | None
    min_booking_minutes: int
    checkin_grace_minutes: int
    idle_below_percent: int | None
    idle_after_minutes: int
    idle_grace_minutes: int
    idle_silence: str

    def needs_checkin(self, r: Reservation) -> bool:
        """Whether ``r`` must check in: the window is set and the booking is not shorter than the minimum."""
        return (self.checkin_minutes is not None and r.kind == "booking"
                and r.end_at - r.start_at >= timedelta(minutes=self.min_booking_minutes))


def rules_for(session: Session, user: User) -> CheckinRules:
    """``user``'s check-in and idle settings, resolved like every rule (user > group > default)."""
    lim = {k: v.value for k, v in resolve_limits(session, user).items()}

    def get(name: str):
        return lim.get(name) if lim.get(name) is not None else DEFAULTS[name]

    return CheckinRules(
        checkin_minutes=lim.get("checkin_minutes"), min_booking_minutes=get("checkin_min_booking_minutes"),
        checkin_grace_minutes=get("checkin_grace_minutes"), idle_below_percent=lim.get("idle_below_percent"),
        idle_after_minutes=get("idle_after_minutes"), idle_grace_minutes=get("idle_grace_minutes"),
        idle_silence=get("idle_silence"),
    )


# ---------------------------------------------------------------------------- evidence (ingest)

_r, _rd, _p, _u, _d = (Reservation.__table__, ReservationDevice.__table__, DeviceProcess.__table__, User.__table__,
                       Device.__table__)
# One statement per snapshot with processes, built once (its compiled form is cached): the
# host's live bookings not yet checked in that have a process of their holder (by Unix name, or
# by uid for a uid the agent could not name) on one of their devices or a MIG slice of one.
_MARK = (
    update(_r)
    .where(
        _r.c.host_id == bindparam("host_"), _r.c.status == "confirmed", _r.c.kind == "booking",
        _r.c.checked_in_at.is_(None), _r.c.start_at <= bindparam("at_"), _r.c.end_at > bindparam("at_"),
        exists(
            select(_p.c.id)
            .join(_d, _d.c.id == _p.c.device_id)
            .join(_rd, or_(_rd.c.device_id == _p.c.device_id, _rd.c.device_id == _d.c.parent_id))
            .join(_u, _u.c.id == _r.c.user_id)
            .where(_p.c.host_id == bindparam("host_"), _rd.c.reservation_id == _r.c.id, _rd.c.active.is_(True),
                   _rd.c.end_at > bindparam("at_"),
                   or_(_p.c.unix_user == _u.c.unix_name,
                       and_(_p.c.owner_status == "uid_only", _u.c.unix_uid.is_not(None), _p.c.uid == _u.c.unix_uid)))
        ),
    )
    .values(checked_in_at=bindparam("at_", type_=_r.c.checked_in_at.type))
    .execution_options(synchronize_session=False)
)


def mark_checked_in(session: Session, marks: list[tuple[int, datetime]]) -> None:
    """For each ``(host id, at)`` of ``marks``: mark checked in, as of ``at`` (UTC), every live
    booking of the host whose holder has a process on its devices in the stored process list
    (one executemany for a batch of snapshots). Call after the hosts' processes are stored,
    only for fresh (not stale) snapshots."""
    if marks:
        session.execute(_MARK, [{"host_": host_id, "at_": at} for host_id, at in marks])


# ---------------------------------------------------------------------------- trust


def trusted(host: Host, telemetry: Sequence[DeviceTelemetry | None], now: datetime) -> str | None:
    """Why the evidence of ``host`` about devices with ``telemetry`` cannot be acted on at
    ``now``, or ``None`` when it can: the agent reports on time with monitoring ``ok``, the
    snapshot is neither stale nor suspect, and every device is healthy with a process list
    that agrees with its memory (``process_data == "ok"``)."""
    status, _age = host_status(host, now)
    if status != HostStatus.OK:
        return f"agent of {host.name} is {status}"
    if host.stale or host.suspect:
        return f"agent of {host.name} reports {'stale' if host.stale else 'suspect'} data"
    for t in telemetry:
        if t is None:
            return "a device has not reported"
        if t.health != "ok":
            return f"a device reports health {t.health}"
        if t.processes_status != "ok":
            return f"a device's process list is {t.processes_status}"
        if t.process_data != "ok":
            return f"a device's process data is {t.process_data}"
    return None


# ---------------------------------------------------------------------------- findings


def record(session: Session, r: Reservation, kind: FindingKind, state: FindingState, *, now: datetime,
           message: str | None = None) -> Finding:
    """The service's finding of ``kind`` about ``r`` (one per reservation and kind, key
    ``reservation:<id>:<kind>``), created or moved to ``state``; admins see it with the agents'."""
    key = f"reservation:{r.id}:{kind.value}"
    f = session.scalar(select(Finding).where(Finding.host_id == r.host_id, Finding.key == key))
    if f is None:
        f = Finding(host_id=r.host_id, key=key, kind=kind.value, first_seen_at=now, reservation_id=r.id,
                    device_id=min((i.device_id for i in r.items), default=None), holder=r.user.username,
                    unix_user=r.user.unix_name)
        session.add(f)
    f.state = state.value
    f.last_seen_at = now
    f.resolved_at = now if state in (FindingState.RESOLVED, FindingState.TERMINATED) else None
    if message:
        f.message = message[:2048]
    return f


def close(session: Session, r: Reservation, kind: FindingKind, state: FindingState, *, now: datetime,
          message: str | None = None) -> None:
    """Move ``r``'s live finding of ``kind`` (if any) to ``state`` (resolved or terminated)."""
    f = session.scalar(select(Finding).where(Finding.host_id == r.host_id,
                                             Finding.key == f"reservation:{r.id}:{kind.value}",
                                             Finding.state.in_(("open", "notified"))))
    if f is not None:
        record(session, r, kind, state, now=now, message=message)


# ---------------------------------------------------------------------------- answers


def asked(session: Session, *, user_id: int, now: datetime) -> list[Reservation]:
    """The user's active bookings with a pending question at ``now`` (warned without check-in
    nor keep, or asked about idle devices without keep), loaded for pages, by start."""
    from app.services.conflicts import loaded_options

    q = select(Reservation).where(
        Reservation.user_id == user_id, Reservation.status == "confirmed", Reservation.start_at <= now,
        Reservation.end_at > now,
        or_(and_(Reservation.checkin_warned_at.is_not(None), Reservation.checked_in_at.is_(None),
                 Reservation.checkin_kept_at.is_(None)),
            and_(Reservation.idle_asked_at.is_not(None), Reservation.idle_kept_at.is_(None))),
    )
    return list(session.scalars(q.options(*loaded_options()).order_by(Reservation.start_at, Reservation.id)))


def keep(session: Session, *, actor: str, actor_user: User | None, reservation_id: int, now: datetime, tz,
         load) -> Reservation:
    """The holder's "keep it": the no-show warning or the idle question of an active
    reservation is answered, and it is left alone for the rest of its time. Under the row
    lock. ``actor_user`` (``None`` for a signed link, which speaks for the holder) must be
    the holder or an admin. Raises NotFound, Forbidden, HistoryImmutable (409, no longer
    active) and Conflict (409, nothing was asked)."""
    def locked(s: Session, rid: int) -> Reservation:
        r = load(s, rid)
        if actor_user is not None and not actor_user.is_admin and r.user_id != actor_user.id:
            raise Forbidden(f"reservation {r.id} belongs to {r.user.username}; only they or an admin may keep it")
        return r

    r, _p, _after = lifecycle.begin(session, reservation_id=reservation_id, action=lifecycle.Action.EDIT, now=now,
                                    tz=tz, load=locked)
    question = checkin_question(r, now)
    if question is None:
        raise Conflict(f"reservation {r.id}: nothing to answer (no no-show warning or idle question is pending)",
                       field="id")
    if question == "checkin":
        r.checkin_kept_at = now
        close(session, r, FindingKind.NO_SHOW, FindingState.RESOLVED, now=now, message="holder answered keep")
    else:
        r.idle_kept_at = now
        close(session, r, FindingKind.IDLE_HOLDER, FindingState.RESOLVED, now=now, message="holder answered keep")
    r.updated_at = now
    record_audit(session, actor=actor, action="reservation.keep", target=f"reservation:{r.id}",
                 detail={"question": question})
    session.flush()
    return r


def _note_consent(session: Session, r: Reservation) -> None:
    """Slot-freed listener: a reservation released while its holder was asked "still using
    it?" (and had not answered keep) was released with consent; the question's finding ends."""
    if r.status != "released" or r.auto_release is not None or r.idle_asked_at is None or r.idle_kept_at is not None:
        return
    r.auto_release = "idle_consent"
    close(session, r, FindingKind.IDLE_HOLDER, FindingState.RESOLVED, now=r.end_at, message="holder released it")


slot_freed.subscribe(_note_consent)


__all__ = ["DEFAULTS", "CheckinRules", "asked", "close", "keep", "mark_checked_in", "record", "rules_for",
           "trusted"]
