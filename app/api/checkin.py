"""``POST /api/v1/reservations/{id}/keep`` (the holder's "keep it" to a no-show warning or an
idle question) and the periodic check-in sweep in the lifespan (see
:mod:`app.services.checkin` and :mod:`app.services.checkin_sweep`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from starlette.concurrency import run_in_threadpool

from app.api.deps import RowId, SettingsDep, WriteSessionDep, WriteUser
from app.models import utcnow
from app.schemas.reservation import ReservationRead
from app.services import checkin, checkin_sweep
from app.services import reservations as reservation_service

router = APIRouter(tags=["reservations"])
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


async def _sweep_loop(app: FastAPI, period: float) -> None:
    while True:
        try:
            out = await run_in_threadpool(sweep_once, app)
            if out.warned or out.released or out.asked or out.idle_released:
                log.info("check-in sweep: warned %s, released %s, asked %s, idle released %s",
                         out.warned, out.released, out.asked, out.idle_released)
        except Exception:  # noqa: BLE001 - retried next period
            log.exception("check-in sweep failed; retrying in %.0f s", period)
        await asyncio.sleep(period)


def install_sweep(app: FastAPI, *, period: float = SWEEP_PERIOD_S) -> None:
    """Run the check-in sweep every ``period`` seconds inside the app's lifespan."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI):
        async with inner(a) as state:
            task = asyncio.create_task(_sweep_loop(a, period), name="gpuroster-checkin-sweep")
            try:
                yield state
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app.router.lifespan_context = lifespan


__all__ = ["install_sweep", "router", "sweep_once"]
