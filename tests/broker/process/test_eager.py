"""process/eager.py: a step that never waits ends before `start_task` returns, and its error is
the caller's; one that waits goes on as a task and sees what it waited on (a result, an error,
a timeout, a cancellation) as in any task."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from leveret.broker.process import eager


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
        eager.start_task(step())
        seen.append("after start")

    run_in_callback(body)
    assert seen == ["ran", "after start"]


def test_a_step_that_waits_goes_on_with_results_errors_and_timeouts() -> None:
    seen: list[object] = []

    async def step(future: asyncio.Future[int], failing: asyncio.Future[int]) -> None:
        seen.append(await future)
        assert asyncio.current_task() is not None  # the rest runs in a task
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
        eager.start_task(step(future, failing))
        seen.append("after start")
        loop.call_later(0.01, future.set_result, 7)
        loop.call_later(0.02, failing.set_exception, ValueError("no"))

    run_in_callback(body)
    assert seen == ["after start", 7, "no", "timed out", "end"]


def test_started_from_a_task_it_is_eager_too() -> None:
    seen: list[str] = []

    async def step() -> None:
        seen.append("ran")

    async def main() -> None:
        eager.start_task(step())
        seen.append("after start")

    asyncio.run(main())
    assert seen == ["ran", "after start"]


def test_an_error_before_the_first_wait_is_the_callers() -> None:
    async def step() -> None:
        raise ValueError("refused")

    def body() -> None:
        with pytest.raises(ValueError, match="refused"):
            eager.start_task(step())

    run_in_callback(body)


def test_a_step_cancelled_while_it_waits_sees_the_cancellation() -> None:
    seen: list[str] = []

    async def step() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        eager.start_task(step())
        (task,) = eager._running
        await asyncio.sleep(0)  # the task takes over the wait
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert seen == ["cancelled"]
