"""``/api/v1/boosts``: quota boosts, asked by members and decided by admins and group
managers (see :mod:`app.services.boosts`)."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Annotated
from zoneinfo import ZoneInfo

from fastapi import Query, Response

from app.routes import api_router
from app.api.deps import CurrentUser, RowId, SessionDep, SettingsDep, WriteSessionDep, WriteUser
from app.api.idempotency import IdempotencyDep
from app.models import QuotaBoost, utcnow
from app.schemas.boosts import BoostCreate, BoostDecision, BoostRead
from app.services import boosts as svc
from app.services.quotas import lab_midnight
from app.timeutil import parse_instant

router = api_router(tags=["boosts"])
DECIDE = {403: {"description": "not an admin nor a manager of the member's group (or your own boost)"},
          404: {}, 409: {"description": "already decided (names by whom) or past its end"}}


def boost_read(b: QuotaBoost, now: datetime) -> BoostRead:
    """The API form of a boost, its state evaluated at ``now``."""
    return BoostRead(id=b.id, user=b.user.username, limit=b.limit_name, value=b.value, unit=svc.unit(b.limit_name),
                     reason=b.reason, end=b.ends_at, state=svc.state(b, now),  # type: ignore[arg-type]
                     decided_by=b.decided_by.username if b.decided_by else None, decided_at=b.decided_at,
                     decision_reason=b.decision_reason, created_at=b.created_at)


def parse_end(value: str, *, tz: str | None, lab_tz: ZoneInfo, now: datetime) -> datetime:
    """A boost's end: a date (``2026-12-18``: through that lab day, so 00:00 of the next) or an
    instant as :func:`app.timeutil.parse_instant` reads it. Raises InvalidInput naming ``end``."""
    text = value.strip()
    if len(text) == 10:
        try:
            day = date.fromisoformat(text)
        except ValueError:
            day = None
        if day is not None:
            return lab_midnight(day + timedelta(days=1), ZoneInfo(tz) if tz else lab_tz)
    return parse_instant(text, tz=tz, field="end", now=now)


@router.post("/boosts", status_code=201, response_model=BoostRead, responses={422: {}})
def ask(data: BoostCreate, user: WriteUser, session: WriteSessionDep, settings: SettingsDep, response: Response,
        idem: IdempotencyDep) -> BoostRead:
    """Ask for a temporary raise of one of your limits until ``end`` (a date means through that
    lab day); an admin or a manager of your group decides, and you are told. With an
    ``Idempotency-Key`` header, a retry within 24 h gets the first answer and asks nothing more."""
    now = utcnow()
    end = parse_end(data.end, tz=data.tz, lab_tz=settings.tz, now=now)
    b = svc.ask(session, user=user, limit_name=data.limit, value=data.value, reason=data.reason, ends_at=end, now=now)
    out = boost_read(b, now)
    response.headers["Location"] = f"/api/v1/boosts/{b.id}"
    idem.done(201, out, response.headers["Location"])
    return out


@router.get("/boosts", response_model=list[BoostRead])
def list_boosts(user: CurrentUser, session: SessionDep,
                state: Annotated[str | None, Query(max_length=16, description="pending, active, expired, denied")] = None,
                ) -> list[BoostRead]:
    """Your boosts and those you may decide (admins: all; group managers: their groups'), newest first."""
    now = utcnow()
    return [boost_read(b, now) for b in svc.visible(session, actor=user, state_filter=state or None, now=now)]


@router.post("/boosts/{boost_id}/approve", response_model=BoostRead, responses=DECIDE)
def approve(boost_id: RowId, user: WriteUser, session: WriteSessionDep, settings: SettingsDep,
            data: BoostDecision | None = None) -> BoostRead:
    """Approve a pending boost: it applies at once, until its end; the member is told."""
    now = utcnow()
    b = svc.decide(session, actor=user, boost_id=boost_id, approve=True, reason=data.reason if data else None,
                   settings=settings, now=now)
    return boost_read(b, now)


@router.post("/boosts/{boost_id}/deny", response_model=BoostRead, responses=DECIDE)
def deny(boost_id: RowId, user: WriteUser, session: WriteSessionDep, settings: SettingsDep,
         data: BoostDecision | None = None) -> BoostRead:
    """Deny a pending boost; the member is told, with the reason."""
    now = utcnow()
    b = svc.decide(session, actor=user, boost_id=boost_id, approve=False, reason=data.reason if data else None,
                   settings=settings, now=now)
    return boost_read(b, now)


__all__ = ["boost_read", "parse_end", "router"]
