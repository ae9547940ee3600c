"""My reservations (``/me/reservations``): upcoming, active and past; cancel, release now,
extend; and "My waitlist" (``app.web.waitlist`` adds and cancels entries). One
reservation's page (``/me/reservations/{id}``) shows the lines to copy into a shell
(``CUDA_VISIBLE_DEVICES`` by UUID, ``CUDA_DEVICE_ORDER``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.i18n import lazy_gettext as _l
from app.api.deps import SessionDep, SettingsDep, WriteSessionDep
from app.config import Settings
from app.errors import AppError, InvalidInput, ReservationConflict
from app.models import Device, Reservation, utcnow
from app.schemas.reservation import ReservationUpdate
from app.services import checkin, occupied
from app.services import reservations as reservation_service
from app.services import waitlist as waitlist_service
from app.web.book import conflict_lines, device_names
from app.web.deps import FormBody, FormViewer, PageViewer, Viewer, form_str
from app.timeutil import add_capped
from app.web.render import page
from app.web.routing import page_router

router = page_router()

PAST_DAYS = 30


@dataclass
class MyReservations:
    """The viewer's reservations by state (past: the last ``PAST_DAYS`` days, newest first)."""

    active: list[Reservation] = field(default_factory=list)
    upcoming: list[Reservation] = field(default_factory=list)
    past: list[Reservation] = field(default_factory=list)


def my_reservations(session: Session, *, viewer: Viewer, settings: Settings, now: datetime) -> MyReservations:
    """Active, upcoming and recent past reservations of the viewer."""
    flt = reservation_service.ReservationFilter(user=viewer.user.username, start=now - timedelta(days=PAST_DAYS))
    rows, _ = reservation_service.list_reservations(session, flt=flt, limit=settings.page_size_max, offset=0, now=now)
    out = MyReservations()
    for r in rows:
        state = reservation_service.reservation_state(r, now)
        {"active": out.active, "upcoming": out.upcoming, "pending": out.upcoming}.get(state, out.past).append(r)
    out.past.sort(key=lambda r: r.start_at, reverse=True)
    return out


def device_labels(session: Session, reservations: list[Reservation]) -> dict[str, str]:
    """UUID -> the device's name for people (``GPU 0 · MIG 4``) for the devices of
    ``reservations``; a MIG slice's name needs its whole GPU, fetched in one query."""
    devices = {i.device.id: i.device for r in reservations for i in r.items}
    missing = {d.parent_id for d in devices.values() if d.parent_id and d.parent_id not in devices}
    if missing:
        devices.update({d.id: d for d in session.scalars(select(Device).where(Device.id.in_(missing)))})
    return device_names(list(devices.values()))


def export_lines(r: Reservation) -> str:
    """The shell lines that pin a job to the reservation's devices by UUID."""
    return f"export CUDA_VISIBLE_DEVICES={reservation_service.cuda_visible_devices(r)}\nexport CUDA_DEVICE_ORDER=PCI_BUS_ID"


def list_page(request: Request, session: Session, viewer: Viewer, settings: Settings, *, status: int = 200,
              **extra: Any) -> Response:
    """The page (its ``reservations`` block for htmx), with ``extra`` in the template context
    (``notice``, ``error``, ``error_for``, ``conflicts``)."""
    now = utcnow()
    entries = [e for e in waitlist_service.list_entries(session, actor=viewer.user, username=viewer.user.username)
               if e.status == "waiting" or e.updated_at >= now - timedelta(days=PAST_DAYS)]
    mine = my_reservations(session, viewer=viewer, settings=settings, now=now)
    ctx = {
        "viewer": viewer, "active": "mine", "mine": mine,
        "occupied": occupied.warnings_for(session, mine.active + mine.upcoming),
        "labels": device_labels(session, [*mine.active, *mine.upcoming, *mine.past]),
        "now": now, "state_of": lambda r: reservation_service.reservation_state(r, now), "past_days": PAST_DAYS,
        "cuda": reservation_service.cuda_visible_devices, "refs": lambda r: reservation_service.to_read(r, now).devices,
        "one_hour": timedelta(hours=1), "later": add_capped, "waitlist": list(reversed(entries)),
        "wait_state": lambda e: waitlist_service.state(e, now),
        "wait_position": waitlist_service.positions(session, entries, now),
        "question_of": lambda r: reservation_service.checkin_question(r, now), **extra,
    }
    return page(request, "mine.html", ctx, block="reservations", status=status)


@router.get("/me/reservations")
def my_reservations_page(
    request: Request, viewer: PageViewer, session: SessionDep, settings: SettingsDep,
    done: Annotated[str | None, Query(max_length=32)] = None,
) -> Response:
    """The viewer's reservations with their actions."""
    notices = {"cancelled": _l("Reservation cancelled."), "released": _l("Devices released."), "extended": _l("Reservation changed."),
               "waiting": _l("Added to your waitlist: you are served in turn when devices are freed."),
               "wait-booked": _l("They were free already: booked for you (see Upcoming)."),
               "wait-notified": _l("They are free already: book them from your waitlist below."),
               "wait-cancelled": _l("Waitlist entry cancelled."),
               "kept": _l("Kept: it is left alone for the rest of its time.")}
    return list_page(request, session, viewer, settings, notice=notices.get(done or ""))


@router.get("/me/reservations/{reservation_id}")
def reservation_page(
    request: Request, reservation_id: int, viewer: PageViewer, session: SessionDep,
    booked: Annotated[str | None, Query(max_length=8)] = None,
) -> Response:
    """One reservation (anyone's: who holds what is public in the lab); the export lines to copy."""
    r = reservation_service.get_reservation(session, reservation_id)
    now = utcnow()
    ctx = {
        "viewer": viewer, "active": "mine", "r": r, "state": reservation_service.reservation_state(r, now),
        "exports": export_lines(r), "now": now, "can_change": viewer.user.is_admin or r.user_id == viewer.user.id,
        "notice": _l("Booked. Copy the lines below into the shell that starts your job.") if booked else None,
        "read": reservation_service.to_read(r, now), "labels": device_labels(session, [r]),
    }
    return page(request, "reservation.html", ctx)


def _failed(request: Request, session: Session, viewer: Viewer, settings: Settings, reservation_id: int, e: AppError) -> Response:
    session.rollback()  # a refused change leaves nothing behind
    conflicts = []
    if isinstance(e, ReservationConflict):
        mine = reservation_service.get_reservation(session, reservation_id)
        conflicts = conflict_lines(e.extra.get("conflicts", []), device_names([i.device for i in mine.items]))
    detail = "the devices are reserved by someone else in the added time" if conflicts else e.detail
    return list_page(request, session, viewer, settings, status=e.status, error=f"#{reservation_id}: {detail}",
                      error_title=e.title, error_for=reservation_id, conflicts=conflicts)


@router.post("/me/reservations/{reservation_id}/end")
def end_reservation(
    request: Request, reservation_id: int, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep
) -> Response:
    """Cancel an upcoming reservation or release an active one now (the row is kept)."""
    try:
        r = reservation_service.end_reservation(session, actor=viewer.user, reservation_id=reservation_id,
                                                tz=settings.tz)
    except AppError as e:
        return _failed(request, session, viewer, settings, reservation_id, e)
    return RedirectResponse(f"/me/reservations?done={r.status}", status_code=303)


@router.post("/me/reservations/{reservation_id}/extend")
def extend_reservation(
    request: Request, reservation_id: int, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep,
    form: FormBody,
) -> Response:
    """Move the end (``end``: wall time in the lab zone); conflicts are named on the page."""
    end = form_str(form, "end")
    try:
        if not end or len(end) > 64:
            raise InvalidInput("end: give the new end date and time", field="end")
        data = ReservationUpdate(end=end, tz=settings.timezone)
        reservation_service.update_reservation(
            session, actor=viewer.user, reservation_id=reservation_id, data=data, settings=settings
        )
    except AppError as e:
        return _failed(request, session, viewer, settings, reservation_id, e)
    return RedirectResponse("/me/reservations?done=extended", status_code=303)


@router.post("/me/reservations/{reservation_id}/keep")
def keep_reservation(
    request: Request, reservation_id: int, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep
) -> Response:
    """Answer "keep it" to the no-show warning or the "still using it?" question."""
    try:
        checkin.keep(session, actor=f"user:{viewer.user.username}", actor_user=viewer.user, reservation_id=reservation_id,
                     now=utcnow(), tz=settings.tz, load=reservation_service.load_locked)
    except AppError as e:
        return _failed(request, session, viewer, settings, reservation_id, e)
    return RedirectResponse("/me/reservations?done=kept", status_code=303)
