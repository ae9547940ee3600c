"""Booking (``/book``): choose a host and devices (or "any N devices" when automatic
placement is installed), a start and a length; see conflicts and the next free time
before submitting; the result shows the ``CUDA_VISIBLE_DEVICES`` line to copy.

The form is read into :class:`BookForm` (all text, so bad input becomes a message naming
the field, never a 422 from the framework), turned into the API's
:class:`~app.schemas.reservation.ReservationCreate`, and booked with the same service
the JSON API uses.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.datastructures import FormData, QueryParams

from app.i18n import lazy_gettext as _l
from app.api.deps import SessionDep, SettingsDep, WriteSessionDep
from app.config import Settings
from app.errors import AppError, Conflict, InvalidInput, ReservationConflict
from app.services import metrics as metrics_service
from app.models import Device, Host, utcnow
from app.schemas.reservation import ReservationCreate
from app.services import conflicts as conflict_service
from app.services import device_refs
from app.services import device_names as naming
from app.services import devices as device_service
from app.services import hosts as host_service
from app.services import reservations as reservation_service
from app.services.devices import DeviceView
from app.web import sessions as web_sessions
from app.web.deps import FormBody, FormViewer, PageViewer, Viewer, form_list
from app.web.idempotency import FormIdempotencyDep, new_form_key
from app.web.now import DEVICE_BADGES, device_label
from app.web.render import page
from app.web.routing import page_router

router = page_router()

MAX_LENGTH_HOURS = 24 * 366
# where service error fields land on this form
FIELD_ALIASES = {"end": "length", "duration": "length", "constraints": "count"}


def placement_available() -> bool:
    """True when automatic placement (``app.services.placement``) is installed."""
    return importlib.util.find_spec("app.services.placement") is not None


@dataclass
class BookForm:
    """The booking form's values, as text (what the user typed)."""

    mode: str = "devices"
    host: str = ""
    devices: list[str] = field(default_factory=list)
    count: str = ""
    when: str = "now"
    start: str = ""
    length: str = "1"
    note: str = ""
    fold: str = ""  # "0"/"1": which of two instants a repeated wall time (autumn DST night) means

    @classmethod
    def from_fields(cls, fields: QueryParams | FormData) -> "BookForm":
        """Read the form from query parameters (GET) or a form body (POST)."""
        def get(name: str, default: str) -> str:
            value = fields.get(name)
            return value.strip() if isinstance(value, str) else default

        return cls(
            mode=get("mode", "devices") or "devices",
            host=get("host", ""),
            devices=form_list(fields, "devices"),
            count=get("count", ""),
            when=get("when", "now") or "now",
            start=get("start", ""),
            length=get("length", "1"),
            note=get("note", ""),
            fold=get("fold", ""),
        )


def _hours(value: str) -> float:
    try:
        hours = float(value.replace(",", "."))
    except ValueError:
        raise InvalidInput(f"length: {value!r} is not a number of hours (e.g. 1.5)", field="length") from None
    if not 0 < hours <= MAX_LENGTH_HOURS:
        raise InvalidInput(f"length: must be more than 0 and at most {MAX_LENGTH_HOURS} hours", field="length")
    return hours


def to_create(form: BookForm, *, settings: Settings) -> ReservationCreate:
    """The API request the form stands for; raises InvalidInput naming the form field."""
    if form.mode not in ("devices", "count"):
        raise InvalidInput("mode: choose 'devices' or 'count'", field="mode")
    if form.when not in ("now", "at"):
        raise InvalidInput("when: choose 'now' or a start time", field="when")
    hours = _hours(form.length)
    if form.when == "now":
        start = "now"
    elif not form.start:
        raise InvalidInput("start: give a start date and time, or choose 'now'", field="start")
    else:
        start = form.start
    body: dict[str, Any] = {
        "start": start, "tz": settings.timezone, "duration": timedelta(seconds=round(hours * 3600)),
        "note": form.note or None, "fold": {"0": 0, "1": 1}.get(form.fold),
    }
    if form.mode == "count":
        if not placement_available():
            raise InvalidInput("count: automatic placement is not available; choose devices", field="count")
        try:
            count = int(form.count)
        except ValueError:
            raise InvalidInput(f"count: {form.count!r} is not a whole number of devices", field="count") from None
        body.update(count=count, host=form.host or None)
    else:
        if not form.host:
            raise InvalidInput("host: choose a host", field="host")
        if not form.devices:
            raise InvalidInput("devices: choose at least one device", field="devices")
        body.update(host=form.host, devices=form.devices)
    try:
        return ReservationCreate(**body)
    except ValidationError as e:
        first = e.errors()[0]
        name = str(first["loc"][0]) if first.get("loc") else "form"
        name = FIELD_ALIASES.get(name, name)
        raise InvalidInput(f"{name}: {first['msg']}", field=name) from None


@dataclass
class ConflictLine:
    """A conflicting reservation as the page names it."""

    id: int
    user: str
    devices: list[str]
    start: datetime
    end: datetime


@dataclass
class BookingCheck:
    """What the check shows: the conflicts in the chosen interval and the next free start."""

    start: datetime
    end: datetime
    devices: list[str]
    conflicts: list[ConflictLine]
    earliest_free: datetime | None
    free_href: str | None = None


def device_names(devices: list[Device]) -> dict[str, str]:
    """UUID → label (``GPU 0``, ``GPU 0 · MIG 4``: ``naming.device_label``) for the given devices."""
    by_id = {d.id: d for d in devices}
    return {d.uuid: naming.device_label(d, by_id.get(d.parent_id) if d.parent_id else None) for d in devices}


def conflict_lines(conflicts: list[dict[str, Any]], names: dict[str, str]) -> list[ConflictLine]:
    """Conflicts from a 409's ``conflicts`` member (each one's devices in the way), with device labels."""
    return [ConflictLine(int(c["id"]), str(c["user"]), [names.get(u, u) for u in c["devices"]],
                         datetime.fromisoformat(str(c["start"])).astimezone(UTC),
                         datetime.fromisoformat(str(c["end"])).astimezone(UTC))
            for c in conflicts]


def check_booking(session: Session, *, form: BookForm, settings: Settings, now: datetime) -> BookingCheck:
    """Conflicts of the chosen devices and interval, and the earliest start at which all are
    free for the chosen length (``find_conflicts`` / ``earliest_free_start``). Raises
    InvalidInput naming the field for bad input."""
    data = to_create(form, settings=settings)
    if data.count is not None:
        raise InvalidInput("count: placement picks the devices when you book; the check needs specific devices", field="count")
    interval = reservation_service.parse_interval(data, now=now)
    reservation_service.validate_interval(interval.start, interval.end, now=now, settings=settings)
    host = host_service.get_host(session, data.host or "")
    devices = device_refs.resolve_devices(session, host=host, refs=data.devices or [])
    conflicts = reservation_service.find_conflicts(session, devices=devices, start=interval.start, end=interval.end)
    free = conflict_service.earliest_free_start(
        session, devices=devices, after=max(interval.start, now), length=interval.end - interval.start
    )
    all_devices = list(session.scalars(select(Device).where(Device.host_id == host.id)))
    names = device_names(all_devices)
    refs = conflict_service.conflict_refs(devices, conflicts, interval.start, interval.end)  # what booking's 409 would say
    return BookingCheck(
        start=interval.start, end=interval.end, devices=[names.get(d.uuid, d.uuid) for d in devices],
        conflicts=conflict_lines(refs, names), earliest_free=free if conflicts else None,
    )


def default_host(session: Session, *, now: datetime) -> str | None:
    """The host the form offers first: the first by name whose agent reports (a stale one may
    be down, and its devices' state is unknown), else ``None``."""
    rows = session.execute(select(Host.name, Host.last_seen_at, Host.interval_seconds, Host.monitoring_status)
                           .order_by(Host.name)).all()
    return next((name for name, seen, interval, status in rows
                 if not device_service.agent_quiet(seen, interval, status, now)), None)


def form_context(
    session: Session, *, viewer: Viewer, form: BookForm, settings: Settings, now: datetime
) -> dict[str, Any]:
    """Hosts, the chosen host's devices with their state, and the form values for the template."""
    hosts, replay_hosts = host_service.host_names(session)
    if not form.host and hosts and form.mode != "count":
        form.host = default_host(session, now=now) or hosts[0]
    views: list[DeviceView] = device_service.device_views(session, now=now, host_names=[form.host]) if form.host in hosts else []
    by_id = {v.device.id: v for v in views}
    rows = [
        {"view": v, "label": device_label(v, by_id), "badge": DEVICE_BADGES.get(v.status, v.status)} for v in views
    ]
    default_start = now.astimezone(settings.tz).replace(second=0, microsecond=0) + timedelta(minutes=15 - now.astimezone(settings.tz).minute % 15)
    return {
        "viewer": viewer, "active": "book", "form": form, "hosts": hosts, "device_rows": rows,
        "replay_hosts": replay_hosts,
        "placement": placement_available(), "default_start": default_start.strftime("%Y-%m-%dT%H:%M"), "now": now,
        "idempotency_key": new_form_key(),
    }


def _error_fields(e: AppError) -> tuple[str | None, str]:
    field_name = FIELD_ALIASES.get(e.field or "", e.field)
    detail = e.detail
    if e.field in FIELD_ALIASES and detail.startswith(f"{e.field}:"):
        detail = f"{field_name}:{detail[len(e.field) + 1:]}"
    return field_name, detail


def wait_offer(form: BookForm) -> dict[str, Any] | None:
    """The "wait for it" form offered when the slot is taken (posted to ``/me/waitlist``):
    as many devices of the same host (any host in placement mode) from the same start for
    the same length, as hidden fields; None when the form names no devices."""
    count = form.count if form.mode == "count" else str(len(form.devices))
    if not count or count == "0":
        return None
    fields = [("count", count), ("host", form.host), ("when", form.when), ("start", form.start),
              ("length", form.length), ("note", form.note)]
    # what is waited for is worded by the template, in the reader's language
    return {"fields": fields, "count": count, "host": form.host, "length": form.length, "key": new_form_key()}


@router.get("/book")
def book_page(request: Request, viewer: PageViewer, session: SessionDep, settings: SettingsDep) -> Response:
    """The booking form, prefilled from the query (the timeline links here)."""
    form = BookForm.from_fields(request.query_params)
    ctx = form_context(session, viewer=viewer, form=form, settings=settings, now=utcnow())
    return page(request, "book.html", ctx, block="devices")


@router.get("/book/check")
def book_check(request: Request, viewer: PageViewer, session: SessionDep, settings: SettingsDep) -> Response:
    """Conflicts and the next free time for the values in the query (links; the form posts)."""
    return _check_response(request, viewer, session, settings, BookForm.from_fields(request.query_params))


@router.post("/book/check")
def book_check_posted(
    request: Request, viewer: PageViewer, session: SessionDep, settings: SettingsDep, form_body: FormBody
) -> Response:
    """The form's availability check (htmx: the ``check`` block). Posted, so the CSRF token
    travels in the body and the ``X-CSRF-Token`` header, never in a URL; checked like any
    form post although nothing is written."""
    given = request.headers.get(web_sessions.CSRF_HEADER) or form_body.get(web_sessions.CSRF_FIELD)
    if not web_sessions.csrf_matches(viewer.csrf_token, given if isinstance(given, str) else None):
        raise web_sessions.CsrfRefused("the form's security token is missing or out of date; reload the page",
                                       field=web_sessions.CSRF_FIELD)
    return _check_response(request, viewer, session, settings, BookForm.from_fields(form_body))


def _check_response(request: Request, viewer: Viewer, session: Session, settings: Settings, form: BookForm) -> Response:
    now = utcnow()
    check: BookingCheck | None = None
    check_error = check_field = check_note = None
    if form.mode == "count":
        check_note = _l("Placement picks the devices, and the earliest start at which enough are free, when you book.")
    elif form.devices:  # with no device chosen yet there is nothing to check
        try:
            check = check_booking(session, form=form, settings=settings, now=now)
        except AppError as e:
            check_field, check_error = _error_fields(e)
    if check is not None and check.earliest_free is not None:
        local = check.earliest_free.astimezone(settings.tz).strftime("%Y-%m-%dT%H:%M")
        params = QueryParams([("mode", "devices"), ("host", form.host), *[("devices", d) for d in form.devices],
                              ("when", "at"), ("start", local), ("length", form.length), ("note", form.note)])
        check.free_href = f"/book?{params}"
    ctx = form_context(session, viewer=viewer, form=form, settings=settings, now=now)
    ctx.update(check=check, check_error=check_error, error_field=check_field, check_note=check_note)
    return page(request, "book.html", ctx, block="check")


@router.post("/book")
def book(request: Request, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep, form_body: FormBody,
         idem: FormIdempotencyDep) -> Response:
    """Book the form's devices; 303 to the reservation (with its CUDA_VISIBLE_DEVICES line),
    or the form again with the error naming the field or the conflicting reservations. The
    form's ``idempotency_key`` makes a double click book once."""
    form = BookForm.from_fields(form_body)
    try:
        data = to_create(form, settings=settings)
        r = reservation_service.create_reservation(session, actor=viewer.user, data=data, settings=settings)
    except AppError as e:
        session.rollback()  # nothing of a refused booking is kept
        now = utcnow()
        ctx = form_context(session, viewer=viewer, form=form, settings=settings, now=now)
        error_field, error = _error_fields(e)
        conflicts: list[ConflictLine] = []
        free = None
        if isinstance(e, ReservationConflict):
            host_devices = list(session.scalars(select(Device).join(Host).where(Host.name == form.host))) if form.host else []
            conflicts = conflict_lines(e.extra.get("conflicts", []), device_names(host_devices))
            free_text = e.extra.get("earliest_free_start")
            free = datetime.fromisoformat(free_text) if free_text else None
            # counted like the API's 409s (gpuroster_conflicts_total); committed with the page's session
            metrics_service.record_conflict(
                session, path=request.url.path, conflicts=[c["id"] for c in e.extra.get("conflicts", [])], detail=e.detail
            )
            error = "the devices are already reserved in that interval"
            error_field = "devices"
        ctx.update(error=error, error_title=e.title, error_field=error_field, conflicts=conflicts, earliest_free=free,
                   fold_choices=e.extra.get("choices"), wait_offer=wait_offer(form) if isinstance(e, Conflict) else None)
        return page(request, "book.html", ctx, status=e.status)
    target = f"/me/reservations/{r.id}?booked=1"
    idem.done(303, None, target)
    return RedirectResponse(target, status_code=303)
