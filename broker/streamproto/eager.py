"""Start an asynchronous step now: a step that never waits ends in the turn that read its
command, so its reply keeps its place among the connection's replies.

A stream-protocol command that changes the topology calls the topology port, which is
asynchronous (in a cluster: an etcd txn, then every node applies it) but never waits on one
node. `start(step)` runs the step at once, up to its first real wait, as Python 3.12's eager
tasks do (`asyncio.eager_task_factory`); on one node it has answered before the next command of
the same read is handled, as a synchronous handler would. A step that waits goes on as a task
from where it stopped, and answers when it ends. The task is made first and the eager part runs
as that task (asyncio.timeout and aiohttp ask for the current task), so a wait that times out
or a cancellation reaches the step as it would in any task.

Must not know: the stream protocol, the topology, the cluster. Single-threaded, on the event loop.
"""

from __future__ import annotations

import asyncio
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Coroutine
from typing import Any

Step = Coroutine[Any, Any, None]
_running: set[asyncio.Task[None]] = set()  # the steps that wait, kept until they end


def start(step: Step) -> None:
    """Run `step` now until it waits; then on as a task. An error it raises before its first
    wait is the caller's, as a synchronous handler's would be."""
    loop = asyncio.get_running_loop()
    if asyncio.current_task(loop) is not None:  # called from a task: it cannot be entered
        _keep(loop.create_task(step))
        return
    runner = _Runner(step)
    task = loop.create_task(runner.run())
    _keep(task)
    _enter_task(loop, task)
    try:
        runner.resume(None)
    finally:
        _leave_task(loop, task)


def _keep(task: asyncio.Task[None]) -> None:
    _running.add(task)
    task.add_done_callback(_running.discard)


class _Runner:
    """Drives a step as its task would: waits on what the step waits on, then resumes it."""

    def __init__(self, step: Step) -> None:
        self.step = step
        # what the step waits on: an asyncio future, or None (a bare yield: asyncio.sleep(0))
        self.waiting: asyncio.Future[object] | None = None
        self.done = False

    def resume(self, error: BaseException | None) -> None:
        try:
            self.waiting = (self.step.send(None) if error is None
                            else self.step.throw(error))
        except StopIteration:
            self.done = True
        except BaseException:
            self.done = True
            raise

    async def run(self) -> None:
        while not self.done:
            waiting = self.waiting
            try:
                if waiting is None:
                    await asyncio.sleep(0)
                else:  # until it is done; its result or error is the step's to read
                    await asyncio.wait([waiting])
            except asyncio.CancelledError as cancelled:  # this task was cancelled
                if waiting is not None and not waiting.done():
                    waiting.cancel()
                self.resume(cancelled)
                continue
            self.resume(None)

