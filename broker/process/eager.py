"""Start an asynchronous step now: what it does before it first waits happens in the caller's
turn, as Python 3.12's eager tasks do (Python 3.11 has no eager task factory).

The fronts answer topology methods through the topology port, which is asynchronous (in a
cluster: an etcd transaction, then every node applies it) but never waits on one node. Started
with `start`, such a step ends in the turn that read its method: its reply keeps its place
among the connection's replies, and an error it raises is raised to the caller, as a
synchronous handler's is. A step that waits is handed back as the rest of itself, a coroutine
that one task awaits (the AMQP channel's backlog, or `start_task`'s own task); that task waits
for what the step waits for and passes it every result, error and cancellation.

What a step runs before its first wait runs outside any task: it must not enter a timeout or
anything else that belongs to the current task before it has waited once (the cluster's
topology port first hands itself to the event loop).

Must not know: the fronts, the topology, the cluster. Single-threaded, on the event loop.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any

Step = Coroutine[Any, Any, None]
_running: set[asyncio.Task[None]] = set()  # start_task's steps that wait, kept until they end


def start(step: Step) -> Step | None:
    """Run `step` now, until it first waits: None if it ended (an error it raised is raised
    here), else the rest of it, for one task to await."""
    try:
        awaited = step.send(None)
    except StopIteration:
        return None
    return _resumed(step, awaited)


def start_task(step: Step) -> None:
    """`start`, and the rest, if any, in a task of its own."""
    rest = start(step)
    if rest is not None:
        task = asyncio.get_running_loop().create_task(rest)
        _running.add(task)
        task.add_done_callback(_running.discard)


async def _resumed(step: Step, awaited: object) -> None:
    await _go_on(step, awaited)


@types.coroutine
def _go_on(step: Step, awaited: object) -> Generator[Any, Any, None]:
    """Drive a started `step` in the task that awaits this: the task waits for what the step
    waits for (`awaited`, which the step yielded), and hands the step what it is sent or
    thrown (a result, an error, a cancellation), until the step ends."""
    while True:
        try:
            sent = yield awaited
        except GeneratorExit:
            step.close()
            raise
        except BaseException as error:  # noqa: BLE001 - the step's to handle, or to raise
            try:
                awaited = step.throw(error)
            except StopIteration:
                return
        else:
            try:
                awaited = step.send(sent)
            except StopIteration:
                return
