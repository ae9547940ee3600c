"""Background rounds are told apart from requests (app.periodic.background_work), in the
threads they hand their database work to as well."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI

from app.periodic import background_work, repeat


def test_a_periodic_round_is_marked_in_its_worker_thread_and_the_caller_is_not() -> None:
    seen: list[str | None] = []

    async def main() -> str | None:
        task = asyncio.create_task(repeat(FastAPI(), what="the test round", period=3600,
                                          work=lambda app: seen.append(background_work())))
        while not seen:
            await asyncio.sleep(0.01)
        task.cancel()
        return background_work()

    assert asyncio.run(main()) is None
    assert seen == ["the test round"]


def _first_rounds(start_delay: float, first_delay: float, wait: float) -> list[float]:
    """Seconds after the lifespan began at which a periodic job (period one hour) ran within
    ``wait`` seconds, on an app whose settings ask ``start_delay`` seconds before a first round."""
    import time

    from app.config import Settings
    from app.periodic import run_periodically

    app = FastAPI()
    app.state.settings = Settings(background_start_delay_seconds=start_delay)
    ran: list[float] = []
    t0 = time.monotonic()
    run_periodically(app, name="test-job", what="the test round", period=3600, first_delay=first_delay,
                     work=lambda a: ran.append(time.monotonic() - t0))

    async def main() -> None:
        async with app.router.lifespan_context(app):
            await asyncio.sleep(wait)

    asyncio.run(main())
    return ran


def test_the_first_round_runs_at_start_unless_the_settings_ask_for_a_delay() -> None:
    assert len(_first_rounds(0, 0, wait=0.3)) == 1, "the default: a round as soon as the service starts"
    assert _first_rounds(3600, 0, wait=0.3) == [], "background_start_delay_seconds holds the first round back"
    late = _first_rounds(0.2, 0, wait=1.5)
    assert len(late) == 1 and late[0] >= 0.2, late
    assert _first_rounds(0, 3600, wait=0.3) == [], "a job's own first delay is kept when it is the longer one"
