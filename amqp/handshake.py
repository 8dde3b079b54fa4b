"""The connection handshake of AMQP 0.9.1: its states, its rules, and what a session answers.

The protocol header check, the one method each handshake state accepts, RabbitMQ's names for
the states (as its error texts say them), the negotiation of tune-ok's limits, and `Handler`,
the interface through which `WireConnection` calls the broker's session. No I/O and no state
of its own: `connection.WireConnection` drives it.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from pamqp import commands

from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError


class State(enum.Enum):
    AWAIT_HEADER = "await-header"
    AWAIT_START_OK = "await-start-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# RabbitMQ's names for the states, as its "unexpected method in connection state ..." says them.
RABBIT_STATE = {
    State.AWAIT_START_OK: "starting",
    State.AWAIT_TUNE_OK: "tuning",
    State.AWAIT_OPEN: "opening",
    State.OPEN: "running",
}


class Handler(Protocol):
    """What the session implements; the machine calls it as frames arrive."""

    def on_start_ok(
        self, mechanism: str, response: bytes, client_properties: dict[str, Any]
    ) -> None: ...
    def on_tune_ok(self, channel_max: int, frame_max: int, heartbeat: int) -> None: ...
    def on_open(self, virtual_host: str) -> None: ...
    def on_channel_open(self, channel: int) -> None: ...
    def on_channel_closed(self, channel: int) -> None: ...
    def on_method(self, channel: int, method: Any) -> None: ...
    def on_publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        immediate: bool,
        header: bytes,
        body: bytes,
    ) -> None: ...
    def on_ack(self, channel: int, delivery_tag: int, multiple: bool) -> None: ...
    def on_close(self, code: int, text: str) -> None: ...
    def on_closed(self) -> None: ...


class BadProtocolHeader(Exception):
    """The client did not speak AMQP 0-9-1: `reply` goes back, then the socket closes."""

    def __init__(self, reply: bytes) -> None:
        super().__init__("bad protocol header")
        self.reply = reply


# The one connection method each handshake state accepts (connection.close aside).
HANDSHAKE_METHODS = {
    State.AWAIT_START_OK: commands.Connection.StartOk,
    State.AWAIT_TUNE_OK: commands.Connection.TuneOk,
    State.AWAIT_OPEN: commands.Connection.Open,
}


def check_protocol_header(data: bytes) -> None:
    """Accept AMQP 0-9-1 (and 1-1-0-9, as RabbitMQ does); answer anything else with the
    0-9-1 header, the one protocol spoken here."""
    if data in (c.PROTOCOL_HEADER, c.PROTOCOL_HEADER_0_9):
        return
    raise BadProtocolHeader(c.PROTOCOL_HEADER)


def check_limit(field: str, value: int, minimum: int, maximum: int) -> None:
    """RabbitMQ's validate_negotiated_integer_value, with its texts (530, as connection.tune)."""
    if value != 0 and value < minimum:
        relation, bound_name, bound = "lower", "minimum", minimum
    elif maximum != 0 and (value == 0 or value > maximum):
        relation, bound_name, bound = "higher", "maximum", maximum
    else:
        return
    detail = " (no limit)" if field == "channel_max" and value == 0 else ""
    raise AMQPError(
        c.NOT_ALLOWED,
        f"negotiated {field} = {value}{detail} is {relation} than the {bound_name} "
        f"allowed value ({bound})",
        10,
        30,
    )
