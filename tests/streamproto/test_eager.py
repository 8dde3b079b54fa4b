"""eager.start: a step that never waits ends before start returns; one that waits goes on as a
task, sees what it waited on (a result, an error, a timeout) as in any task."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from leveret.broker.streamproto import eager


def run_in_callback(body: Callable[[], None]) -> None:
    """Run `body()` from a loop callback (no current task), as a protocol's data_received
    is run, then let the loop go on until every step has ended."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def callback() -> None:
            try:
                body()
            finally:
                done.set_result(None)

        loop.call_soon(callback)
        await done
        for _ in range(50):
            if not eager._running:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())


def test_a_step_that_never_waits_ends_before_start_returns() -> None:
    seen: list[str] = []

    async def step() -> None:
        seen.append("ran")

    def body() -> None:
        eager.start(step())
        seen.append("after start")

    run_in_callback(body)
    assert seen == ["ran", "after start"]


def test_a_step_that_waits_goes_on_with_results_errors_and_timeouts() -> None:
    seen: list[object] = []

    async def step(future: asyncio.Future[int], failing: asyncio.Future[int]) -> None:
        assert asyncio.current_task() is not None
        seen.append(await future)
        try:
            await failing
        except ValueError as exc:
            seen.append(str(exc))
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(5)
        except TimeoutError:
            seen.append("timed out")
        await asyncio.sleep(0)
        seen.append("end")

    def body() -> None:
        loop = asyncio.get_running_loop()
        future, failing = loop.create_future(), loop.create_future()
        eager.start(step(future, failing))
        seen.append("after start")
        loop.call_later(0.01, future.set_result, 7)
        loop.call_later(0.02, failing.set_exception, ValueError("no"))

    run_in_callback(body)
    assert seen == ["after start", 7, "no", "timed out", "end"]


def test_started_from_a_task_it_runs_as_a_task_of_its_own() -> None:
    seen: list[str] = []

    async def step() -> None:
        seen.append("ran")

    async def main() -> None:
        eager.start(step())
        seen.append("after start")
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert seen == ["after start", "ran"]
