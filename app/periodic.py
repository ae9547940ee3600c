"""Work the service repeats while it runs: the history pruner, the expiry of unapproved
pending reservations, the waitlist round and the check-in sweep.

Each runs as one asyncio task inside the app's lifespan (started after the engine exists,
cancelled before it is disposed). Its work is synchronous database code, so every round runs
in the thread pool; a round that fails is logged and retried after the period, never fatal to
the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TypeVar

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

log = logging.getLogger(__name__)
T = TypeVar("T")

# Set for the life of each background task; the threads it hands work to inherit it (both
# asyncio.to_thread and Starlette's thread pool copy the caller's context).
_BACKGROUND: ContextVar[str | None] = ContextVar("gpuroster_background_work", default=None)


def background_work() -> str | None:
    """What background work the calling code runs for (``"the waitlist round"``, ...), or
    ``None`` when it serves a request. Background rounds run at their own times, so whoever
    attributes database work to requests (the statement-count tests) tells them apart here."""
    return _BACKGROUND.get()


def mark_background(what: str) -> None:
    """Mark the current asyncio task, and the threads it hands work to, as background work
    ``what``; call it first thing in the task."""
    _BACKGROUND.set(what)


async def repeat(app: FastAPI, *, what: str, work: Callable[[FastAPI], T], period: float, first_delay: float = 0.0,
                 report: Callable[[T], None] | None = None) -> None:
    """Run ``work(app)`` in the thread pool after ``first_delay`` seconds, then every
    ``period`` seconds until cancelled; ``report(result)`` logs what a round did. ``what``
    names the work in the log line of a failed round."""
    mark_background(what)
    await asyncio.sleep(first_delay)
    while True:
        try:
            result = await run_in_threadpool(work, app)
            if report is not None:
                report(result)
        except Exception:  # noqa: BLE001 - a failed round is retried next period, never fatal
            log.exception("%s failed; retrying in %.0f s", what, period)
        await asyncio.sleep(period)


def run_periodically(app: FastAPI, *, name: str, what: str, work: Callable[[FastAPI], T], period: float,
                     first_delay: float = 0.0, report: Callable[[T], None] | None = None,
                     on_start: Callable[[FastAPI], None] | None = None) -> None:
    """Wrap ``app``'s lifespan so that :func:`repeat` runs as the task ``name`` while the app
    runs. ``on_start(app)`` runs first, once the app's state (engine, settings) exists. The
    first round waits ``first_delay`` seconds, or the settings' ``background_start_delay_seconds``
    where that is longer."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI):
        async with inner(a) as state:
            if on_start is not None:
                on_start(a)
            delay = max(first_delay, a.state.settings.background_start_delay_seconds)
            task = asyncio.create_task(repeat(a, what=what, work=work, period=period, first_delay=delay,
                                              report=report), name=name)
            try:
                yield state
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app.router.lifespan_context = lifespan


__all__ = ["background_work", "mark_background", "repeat", "run_periodically"]
