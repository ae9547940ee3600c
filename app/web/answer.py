"""The signed one-click answer links of check-in notices (``/answer/{token}``, see
:mod:`app.services.answer_links`): no sign-in needed, the token speaks for the holder of one
reservation, for one answer. Opening the link shows the reservation and one button; the
answer is given by the POST (link previews and mail scanners open links by themselves).
Signed-in holders answer on Now and My reservations instead."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Request
from fastapi.responses import Response

from app.api.deps import SessionDep, SettingsDep, WriteSessionDep
from app.models import utcnow
from app.services import answer_links, checkin
from app.services import reservations as reservation_service
from app.web.render import page
from app.web.routing import page_router

router = page_router()
Token = Annotated[str, Path(min_length=8, max_length=200)]


@router.get("/answer/{token}")
def answer_page(request: Request, token: Token, session: SessionDep, settings: SettingsDep) -> Response:
    """The reservation the link is about, what is asked, and the one button of the link's answer."""
    now = utcnow()
    rid, answer = answer_links.verify(settings, token, now=now)
    r = reservation_service.get_reservation(session, rid)
    ctx = {"viewer": None, "r": r, "answer": answer, "token": token, "now": now,
           "question": reservation_service.checkin_question(r, now),
           "state": reservation_service.reservation_state(r, now)}
    return page(request, "answer.html", ctx)


@router.post("/answer/{token}")
def answer(request: Request, token: Token, session: WriteSessionDep, settings: SettingsDep) -> Response:
    """Keep the reservation (the pending question answered) or release it now, as its holder."""
    now = utcnow()
    rid, what = answer_links.verify(settings, token, now=now)
    owner = reservation_service.get_reservation(session, rid).user
    if what == "keep":
        r = checkin.keep(session, actor=f"user:{owner.username}", actor_user=None, reservation_id=rid, now=now,
                         tz=settings.tz, load=reservation_service.load_locked)
        done = "Kept: it is left alone for the rest of its time."
    else:
        r = reservation_service.end_reservation(session, actor=owner, reservation_id=rid, now=now, tz=settings.tz)
        done = "Released: the GPUs are free for others. Thank you."
    ctx = {"viewer": None, "r": r, "answer": what, "token": token, "now": now, "done": done, "question": None,
           "state": reservation_service.reservation_state(r, now)}
    return page(request, "answer.html", ctx)
