"""Declaring streams and super streams over AMQP, for jobs that set up what they use.

`declare_stream(uri, name)` declares a durable `x-queue-type: stream` queue;
`declare_super_stream(uri, name, partitions)` builds what `leveret-streams add_super_stream
NAME --partitions N` builds, over AMQP instead of the management API: a durable direct
exchange with `x-super-stream: true` and the streams `NAME-0` .. `NAME-(N-1)` bound to it with
the binding keys "0" .. "N-1". Both are idempotent: declaring what exists with the same
arguments changes nothing.

Blocking; opens and closes its own connection.
"""

from __future__ import annotations

import time
from typing import Any

from pamqp import commands

from leveret.spark.endpoint import Endpoint
from leveret.spark.errors import LeveretConnectionError
from leveret.spark.wire import Connection

STREAM = {"x-queue-type": "stream"}


def connect(uri: str, wait_s: float = 0.0) -> Connection:
    """A connection to `uri`, retrying for up to `wait_s` while the broker is not up yet."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return Connection(Endpoint.parse(uri))
        except LeveretConnectionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1.0)


def declare_stream(uri: str, name: str, arguments: dict[str, Any] | None = None,
                   wait_s: float = 0.0) -> None:
    conn = connect(uri, wait_s)
    try:
        conn.channel().call(commands.Queue.Declare(queue=name, durable=True,
                                                   arguments={**STREAM, **(arguments or {})}),
                            commands.Queue.DeclareOk)
    finally:
        conn.close()


def declare_super_stream(uri: str, name: str, partitions: int,
                         arguments: dict[str, Any] | None = None,
                         wait_s: float = 0.0) -> list[str]:
    """The super stream `name` with `partitions` partition streams; returns their names."""
    conn = connect(uri, wait_s)
    try:
        ch = conn.channel()
        ch.call(commands.Exchange.Declare(exchange=name, exchange_type="direct", durable=True,
                                          arguments={"x-super-stream": True}),
                commands.Exchange.DeclareOk)
        names = []
        for index in range(partitions):
            stream = f"{name}-{index}"
            ch.call(commands.Queue.Declare(queue=stream, durable=True,
                                           arguments={**STREAM, **(arguments or {})}),
                    commands.Queue.DeclareOk)
            ch.call(commands.Queue.Bind(queue=stream, exchange=name, routing_key=str(index),
                                        arguments={"x-stream-partition-order": index}),
                    commands.Queue.BindOk)
            names.append(stream)
        return names
    finally:
        conn.close()
