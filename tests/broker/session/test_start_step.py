"""`backlog.start_step`: a channel's step runs at once until it first waits (session/backlog.py).

On one node the topology port never waits, so a handler's step ends in the turn that read its
method, and its error is the handler's; a step that waits (etcd, another node) goes on in a
task that the channel's later frames wait for, as `run_step`'s do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from leveret.amqp.errors import AMQPError
from leveret.broker.model.errors import NotFound
from leveret.broker.session import backlog

INDEX = (50 << 16) | 10  # queue.declare


class Wire:
    def __init__(self) -> None:
        self.closed: list[tuple[int, AMQPError]] = []

    def close_channel(self, number: int, error: AMQPError) -> None:
        self.closed.append((number, error))


class Session:
    name = "test"

    def __init__(self) -> None:
        self.wire: Any = Wire()

    def close_with(self, error: AMQPError) -> None:
        raise AssertionError(f"no connection error expected: {error}")


class Channel:
    number = 1
    closed = False

    def __init__(self) -> None:
        self.backlog: backlog.Backlog | None = None
        self.session = Session()


async def test_a_step_that_never_waits_ends_in_this_turn() -> None:
    channel, done = Channel(), []

    async def local_port() -> None:  # as LocalTopology's methods: a coroutine that never waits
        done.append("declared")

    async def step() -> None:
        await local_port()
        done.append("replied")

    backlog.start_step(channel, INDEX, step())
    assert done == ["declared", "replied"]
    assert channel.backlog is None  # nothing waits behind it


async def test_its_error_is_raised_to_the_handler() -> None:
    async def step() -> None:
        raise NotFound("no queue 'q' in vhost '/'")

    with pytest.raises(NotFound, match="no queue 'q'"):
        backlog.start_step(Channel(), INDEX, step())


async def test_a_step_that_waits_goes_on_in_the_task_the_channel_waits_for() -> None:
    channel, seen = Channel(), []
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def step() -> None:
        seen.append("before")
        await asyncio.sleep(0)  # as the cluster's port does before touching etcd
        async with asyncio.timeout(5):  # belongs to the task that goes on with the step
            seen.append(await answer)
        seen.append(asyncio.current_task() is task)

    backlog.start_step(channel, INDEX, step())
    assert seen == ["before"]
    assert channel.backlog is not None and channel.backlog.task is not None
    task = channel.backlog.task
    assert backlog.defer(channel, INDEX, seen.append, "later frame")
    await asyncio.sleep(0.01)
    answer.set_result("etcd answered")
    await task
    assert seen == ["before", "etcd answered", True, "later frame"]
    assert channel.backlog is None


async def test_an_error_after_waiting_closes_the_channel_for_that_method() -> None:
    channel = Channel()

    async def step() -> None:
        await asyncio.sleep(0)
        raise NotFound("no exchange 'x' in vhost '/'")

    backlog.start_step(channel, INDEX, step())
    assert channel.backlog is not None and channel.backlog.task is not None
    await channel.backlog.task
    [(number, error)] = channel.session.wire.closed
    assert (number, error.code) == (1, 404)
    assert error.reply_text == "NOT_FOUND - no exchange 'x' in vhost '/'"
    assert (error.class_id, error.method_id) == (50, 10)


async def test_a_closing_channel_cancels_the_step_where_it_waits() -> None:
    channel, seen = Channel(), []
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def step() -> None:
        try:
            await never
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    backlog.start_step(channel, INDEX, step())
    assert channel.backlog is not None and channel.backlog.task is not None
    task = channel.backlog.task
    await asyncio.sleep(0)
    backlog.cancel(channel)
    await asyncio.gather(task, return_exceptions=True)
    assert seen == ["cancelled"] and never.cancelled()
