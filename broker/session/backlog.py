"""A channel that waits for an asynchronous step, with its later frames kept in order.

In cluster mode some methods cannot be answered in the turn that reads them: a declaration is
an etcd transaction, and a queue held by another node answers over the node-to-node link. While
such a step runs, the channel's later methods, publishes and acks wait here, in arrival order,
and run once it ends; other channels of the connection go on. So a publish that follows a
declare on the same channel sees the declaration, as it would on one node.

`start_step` runs a step at once, as far as it goes without waiting (`process/eager.py`). A
step that never waits, a change to this node's own model,
so answers in the turn that read its method and raises its error there, as a synchronous
handler does; only a step that waits becomes a task that the channel's later frames wait for.
What such a step calls before it first waits runs outside that task: it must not enter a
timeout or anything else that belongs to the current task before it has waited once (the
cluster's topology port first hands itself to the event loop).

An error the step raises is answered as a synchronous handler's would be: a soft one closes the
channel, a hard one the connection, with the waiting method's class and method ids.

It knows the wire machine's guard and the session's close, nothing of the model or the cluster.
Single-threaded: runs on the event loop thread of its connection.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from leveret.amqp import constants as c
from leveret.amqp.connection import WireConnection
from leveret.amqp.errors import AMQPError
from leveret.broker.model.errors import BrokerError
from leveret.broker.process import eager, logs
from leveret.broker.session.errors import to_amqp

log = logs.get("leveret.connection")
PUBLISH_INDEX = (c.CLASS_BASIC << 16) | 40
ACK_INDEX = c.BASIC_ACK

Call = tuple[int, Callable[..., None], tuple[Any, ...]]  # (method index, handler, its arguments)


class Session(Protocol):
    """What a backlog needs of the connection (`connection.Session`): its name in the log, the
    wire machine's channel close, and the connection close."""

    @property
    def name(self) -> str: ...

    @property
    def wire(self) -> WireConnection: ...

    def close_with(self, error: AMQPError) -> None: ...


class Channel(Protocol):
    """What a backlog needs of its channel (`channel.Channel`): Protocols, so that this module
    does not import the channel, which imports it."""

    backlog: Backlog | None

    @property
    def number(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def session(self) -> Session: ...


class Backlog:
    """What waits behind one channel's running step, and the step itself."""

    __slots__ = ("calls", "task")

    def __init__(self) -> None:
        self.calls: deque[Call] = deque()
        self.task: asyncio.Task[None] | None = None


def run_step(channel: Channel, index: int, step: Coroutine[Any, Any, None]) -> None:
    """Run `step` for the method `index` of `channel`; the channel's later frames wait for it.

    Called from a handler, which then returns at once; the step sends the method's reply."""
    if channel.backlog is None:
        channel.backlog = Backlog()
    backlog = channel.backlog
    backlog.task = asyncio.get_running_loop().create_task(_run(channel, index, step, backlog))


def start_step(channel: Channel, index: int, step: Coroutine[Any, Any, None]) -> None:
    """Run `step` for the method `index` of `channel` at once, until it first waits
    (process/eager.py).

    A step that ends without waiting has answered in this turn; its error is raised here, to
    the handler's caller, as a synchronous handler's is. A step that waits goes on as
    `run_step`'s does, from where it waits, and the channel's later frames wait for it."""
    rest = eager.start(step)
    if rest is not None:
        run_step(channel, index, rest)


def defer(channel: Channel, index: int, handler: Callable[..., None], *args: Any) -> bool:
    """Keep a call for later if the channel is waiting; True if it was kept."""
    backlog = channel.backlog
    if backlog is None:
        return False
    backlog.calls.append((index, handler, args))
    return True


def cancel(channel: Channel) -> None:
    """The channel closed: its running step stops and what waited is dropped."""
    backlog, channel.backlog = channel.backlog, None
    if backlog is not None:
        backlog.calls.clear()
        task = backlog.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()


async def _run(channel: Channel, index: int, step: Coroutine[Any, Any, None],
               backlog: Backlog) -> None:
    try:
        await step
    except asyncio.CancelledError:
        return
    except (AMQPError, BrokerError) as error:
        fail(channel, index, error)
    except Exception:
        log.exception("a channel's step failed", connection=channel.session.name,
                      channel=channel.number)
        fail(channel, index, AMQPError(c.INTERNAL_ERROR, "internal error"))
    if channel.backlog is backlog:
        _release(channel, backlog)


def fail(channel: Channel, index: int, error: AMQPError | BrokerError) -> None:
    """Answer an error raised for method `index` of `channel` outside the wire's guard."""
    amqp = to_amqp(error) if isinstance(error, BrokerError) else error
    amqp.for_method(index >> 16, index & 0xFFFF)
    session = channel.session
    if channel.closed:
        return
    if amqp.hard:
        session.close_with(amqp)
    else:
        session.wire.close_channel(channel.number, amqp)


def _release(channel: Channel, backlog: Backlog) -> None:
    """Run what waited, in order, until it is done or a call starts another step."""
    channel.backlog = None
    calls = backlog.calls
    while calls and not channel.closed:
        index, handler, args = calls.popleft()
        try:
            handler(*args)
        except (AMQPError, BrokerError) as error:
            fail(channel, index, error)
        except Exception:
            log.exception("a waiting call failed", connection=channel.session.name,
                          channel=channel.number)
            fail(channel, index, AMQPError(c.INTERNAL_ERROR, "internal error"))
        if channel.backlog is not None:  # the call started a step: the rest waits for it
            channel.backlog.calls.extend(calls)
            return
