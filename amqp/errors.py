"""Reply-code errors of the AMQP 0.9.1 wire.

An AMQPError carries the reply code, the explanation and the failing method's class and method
ids. Whether it closes the channel (soft) or the connection (hard) follows from the code, as in
RabbitMQ, except that any error on channel 0 closes the connection. The reply text on the wire
is "<NAME> - <explanation>"; a longer one than 255 bytes is cut to 252 bytes and "...", as
RabbitMQ's rabbit_binary_generator does.

Frame-level explanations quote the offending payload the way RabbitMQ's reader prints it with
Erlang's ~p (`type 1, all octets = <<0,20,0,10>>: unknown_frame`); `erlang_binary` and
`frame_explanation` build those texts.

It knows nothing of the broker model; the session maps domain errors to these.
"""

from __future__ import annotations

import struct

from leveret.amqp import constants as c


class AMQPError(Exception):
    """An error that the peer is told about with channel.close or connection.close."""

    at = 0  # for a run of publishes (Handler.on_publish_run): the index of the one that failed

    def __init__(self, code: int, explanation: str, class_id: int = 0, method_id: int = 0):
        super().__init__(explanation)
        self.code = code
        self.explanation = explanation
        self.class_id = class_id
        self.method_id = method_id

    @property
    def hard(self) -> bool:
        return self.code not in c.SOFT_ERRORS

    @property
    def reply_text(self) -> str:
        text = f"{c.REPLY_NAMES.get(self.code, 'UNKNOWN')} - {self.explanation}"
        encoded = text.encode("utf-8")
        if len(encoded) <= 255:
            return text
        return encoded[:252].decode("utf-8", "ignore") + "..."

    def for_method(self, class_id: int, method_id: int) -> AMQPError:
        """Stamp the failing method onto an error raised without one."""
        if not self.class_id and not self.method_id:
            self.class_id, self.method_id = class_id, method_id
        return self

    def __repr__(self) -> str:
        return f"AMQPError({self.code}, {self.explanation!r}, {self.class_id}, {self.method_id})"


# What pamqp (and our own walks over its formats) raise on bytes that do not decode.
DECODE_ERRORS = (
    ValueError, struct.error, UnicodeDecodeError, RecursionError, IndexError, TypeError,
    OverflowError,
)


def frame_error(explanation: str) -> AMQPError:
    return AMQPError(c.FRAME_ERROR, explanation)


def unexpected_frame(explanation: str) -> AMQPError:
    return AMQPError(c.UNEXPECTED_FRAME, explanation)


def channel_error(explanation: str) -> AMQPError:
    return AMQPError(c.CHANNEL_ERROR, explanation)


def command_invalid(explanation: str) -> AMQPError:
    return AMQPError(c.COMMAND_INVALID, explanation)


def not_implemented(explanation: str) -> AMQPError:
    return AMQPError(c.NOT_IMPLEMENTED, explanation)


def not_allowed(explanation: str) -> AMQPError:
    return AMQPError(c.NOT_ALLOWED, explanation)


def precondition_failed(explanation: str) -> AMQPError:
    return AMQPError(c.PRECONDITION_FAILED, explanation)


# -- RabbitMQ's texts for frame-level errors ---------------------------------------------------

_ESCAPES = {
    8: "\\b",
    9: "\\t",
    10: "\\n",
    11: "\\v",
    12: "\\f",
    13: "\\r",
    27: "\\e",
    34: '\\"',
    92: "\\\\",
}
_LINE_LENGTH = 80  # where Erlang's ~p starts to break a term over lines


def erlang_binary(data: bytes) -> str:
    """A binary as Erlang's ~p prints it: `<<"text">>` when every byte is printable ASCII,
    `<<1,2,3>>` otherwise. (Erlang would also print Latin-1 letters as text; here they count
    as unprintable, so that the reply text stays valid UTF-8.)"""
    if data and all(32 <= b < 127 or b in _ESCAPES for b in data):
        return '<<"' + "".join(_ESCAPES.get(b) or chr(b) for b in data) + '">>'
    return erlang_bytes(data)


def erlang_bytes(data: bytes) -> str:
    """A binary as Erlang's ~w prints it: always the list of byte values."""
    return "<<" + ",".join(map(str, data)) + ">>"


def erlang_tuple(column: int, *elements: object) -> str:
    """A tuple as ~p prints it at `column`: on one line if it fits in 80 columns, otherwise
    one element a line, aligned after the brace."""
    parts = [str(e) for e in elements]
    one_line = "{" + ",".join(parts) + "}"
    if column + len(one_line) <= _LINE_LENGTH:
        return one_line
    return "{" + (",\n" + " " * (column + 1)).join(parts) + "}"


def octets(payload: bytes) -> str:
    """RabbitMQ's payload snippet: the whole payload up to 16 bytes, else the first 16."""
    if len(payload) <= 16:
        return f"all octets = {erlang_binary(payload)}"
    return f"first 16 octets = {erlang_binary(payload[:16])}"


def frame_explanation(frame_type: int, payload: bytes, *reason: object) -> str:
    """`type T, all octets = <<...>>` with `: reason` (a ~p term) when a reason is given.

    A reason of one element is an atom such as unknown_frame; more make a tuple such as
    {frame_too_large,Size,Max}."""
    head = f"type {frame_type}, {octets(payload)}"
    if not reason:
        return head
    head += ": "
    if len(reason) == 1:
        return head + str(reason[0])
    return head + erlang_tuple(len(head), *reason)
