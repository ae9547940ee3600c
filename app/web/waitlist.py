"""Waitlist forms: "wait for it" (offered on the Book page when the slot is taken, posted
to ``/me/waitlist``) and cancelling an entry from "My waitlist" on My reservations.

The form is read as text, so bad input becomes a message naming the field on My
reservations (with the form's status), never a 422 from the framework; the entry is made
and served once with the same services as ``POST /api/v1/waitlist``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from starlette.datastructures import FormData

from app.api.deps import SettingsDep, WriteSessionDep
from app.config import Settings
from app.errors import AppError, InvalidInput
from app.models import utcnow
from app.services import waitlist as waitlist_service
from app.services import waitlist_serving
from app.timeutil import parse_instant
from app.web.deps import FormBody, FormViewer, form_str
from app.web.idempotency import FormIdempotencyDep
from app.web.mine import list_page
from app.web.routing import page_router

router = page_router()

MAX_HOURS = 24 * 366


def _hours(form: FormData, name: str, default: str) -> timedelta:
    text = form_str(form, name, default) or default
    try:
        hours = float(text.replace(",", "."))
    except ValueError:
        raise InvalidInput(f"{name}: {text!r} is not a number of hours (e.g. 1.5)", field=name) from None
    if not 0 < hours <= MAX_HOURS:
        raise InvalidInput(f"{name}: must be more than 0 and at most {MAX_HOURS} hours", field=name)
    return timedelta(seconds=round(hours * 3600))


def request_from_form(form: FormData, *, settings: Settings, now: datetime) -> waitlist_service.WaitRequest:
    """The waitlist request of the "wait for it" form: ``count``, ``host`` (optional),
    ``when`` (``now``/``at``) and ``start`` (wall time in the lab's zone), ``length`` and
    ``within`` in hours, ``book`` (``1`` books, else tells), ``note``. Raises InvalidInput
    naming the field."""
    try:
        count = int(form_str(form, "count"))
    except ValueError:
        raise InvalidInput(f"count: {form_str(form, 'count')!r} is not a whole number of devices", field="count") from None
    if not 1 <= count <= 64:
        raise InvalidInput("count: between 1 and 64 devices", field="count")
    start = now
    if form_str(form, "when", "now") == "at":
        text = form_str(form, "start")
        if not text or len(text) > 64:
            raise InvalidInput("start: give a start date and time, or choose 'now'", field="start")
        start = max(parse_instant(text, tz=settings.timezone, field="start", now=now), now)
    host = form_str(form, "host") or None
    note = form_str(form, "note")[:1024] or None
    within = _hours(form, "within", "24")
    if start > now + waitlist_service.MAX_WINDOW:
        raise InvalidInput(f"start: at most {waitlist_service.MAX_WINDOW.days} days ahead", field="start")
    return waitlist_service.WaitRequest(count=count, length=_hours(form, "length", "1"), start=start,
                                        end=start + within, book=form_str(form, "book") == "1",
                                        host=host if host and len(host) <= 128 else None, note=note)


@router.post("/me/waitlist")
def wait_for_it(request: Request, viewer: FormViewer, session: WriteSessionDep, settings: SettingsDep, form: FormBody,
                idem: FormIdempotencyDep) -> Response:
    """Add a waitlist entry and serve it once; 303 to My reservations (its waitlist section),
    or that page with the error naming the field. The form's ``idempotency_key`` makes a
    double click add one entry."""
    now = utcnow()
    try:
        req = request_from_form(form, settings=settings, now=now)
        e = waitlist_service.create_entry(session, actor=viewer.user, req=req, settings=settings, now=now)
        waitlist_serving.serve(session, settings=settings, now=now, only=[e.id])
    except AppError as err:
        session.rollback()  # nothing of a refused entry is kept
        return list_page(request, session, viewer, settings, status=err.status, error=f"waitlist: {err.detail}",
                         error_title=err.title)
    done = {"booked": "wait-booked", "notified": "wait-notified"}.get(str(e.status), "waiting")
    target = f"/me/reservations?done={done}#waitlist"
    idem.done(303, None, target)
    return RedirectResponse(target, status_code=303)


@router.post("/me/waitlist/{entry_id}/cancel")
def cancel_entry(request: Request, entry_id: int, viewer: FormViewer, session: WriteSessionDep,
                 settings: SettingsDep) -> Response:
    """Withdraw a waiting entry (one's own; admins: anyone's)."""
    try:
        waitlist_service.cancel_entry(session, actor=viewer.user, entry_id=entry_id, settings=settings)
    except AppError as err:
        session.rollback()
        return list_page(request, session, viewer, settings, status=err.status, error=f"waitlist: {err.detail}",
                         error_title=err.title)
    return RedirectResponse("/me/reservations?done=wait-cancelled#waitlist", status_code=303)


__all__ = ["request_from_form", "router"]
