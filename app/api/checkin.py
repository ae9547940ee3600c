"""``POST /api/v1/reservations/{id}/keep`` (the holder's "keep it" to a no-show warning or an
idle question) and the periodic check-in sweep in the lifespan (see
:mod:`app.services.checkin` and :mod:`app.services.checkin_sweep`)."""

from __future__ import annotations

import logging

from fastapi import FastAPI

from app.routes import api_router
from app.api.deps import RowId, SettingsDep, WriteSessionDep, WriteUser
from app.models import utcnow
from app.periodic import run_periodically
from app.schemas.reservation import ReservationRead
from app.services import checkin, checkin_sweep
from app.services import reservations as reservation_service

router = api_router(tags=["reservations"])
log = logging.getLogger(__name__)
SWEEP_PERIOD_S = 60.0  # how often no-shows and idle holders are looked at (settings are in minutes)


@router.post("/reservations/{reservation_id}/keep", response_model=ReservationRead,
             responses={403: {}, 404: {}, 409: {"description": "no longer active, or nothing was asked"}})
def keep(reservation_id: RowId, user: WriteUser, session: WriteSessionDep, settings: SettingsDep) -> ReservationRead:
    """Answer "keep it" to the pending no-show warning or "still using it?" question of an
    active reservation (its holder or an admin): it is left alone for the rest of its time."""
    now = utcnow()
    r = checkin.keep(session, actor=f"user:{user.username}", actor_user=user, reservation_id=reservation_id, now=now,
                     tz=settings.tz, load=reservation_service.load_locked)
    return reservation_service.to_read(r, now)


def sweep_once(app: FastAPI) -> checkin_sweep.SweepResult:
    """One check-in sweep at the current time in its own transaction."""
    from app.db import run_in_transaction

    settings = app.state.settings
    return run_in_transaction(app.state.session_factory,
                              lambda s: checkin_sweep.sweep(s, now=utcnow(), settings=settings))


def _report(out: checkin_sweep.SweepResult) -> None:
    if out.warned or out.released or out.asked or out.idle_released:
        log.info("check-in sweep: warned %s, released %s, asked %s, idle released %s",
                 out.warned, out.released, out.asked, out.idle_released)


def install_sweep(app: FastAPI, *, period: float = SWEEP_PERIOD_S) -> None:
    """Run the check-in sweep every ``period`` seconds inside the app's lifespan."""
    run_periodically(app, name="gpuroster-checkin-sweep", what="check-in sweep", work=sweep_once, period=period,
                     report=_report)


__all__ = ["install_sweep", "router", "sweep_once"]
