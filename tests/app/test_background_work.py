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
