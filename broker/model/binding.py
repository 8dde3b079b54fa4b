"""Bindings and the argument-table helpers they need (equality, RabbitMQ's value printing).

A binding links a source exchange to a destination (a queue or an exchange) with a routing key
and an arguments table. Pure data; no routing logic, no I/O.
"""

from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass, field
from typing import Any


def freeze(value: object) -> object:
    """A hashable form of an AMQP field value, keeping int and float apart."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("A", tuple(freeze(v) for v in value))
    if isinstance(value, bool):
        return ("t", value)
    if isinstance(value, float):
        return ("f", value)
    if isinstance(value, bytearray):
        return ("x", bytes(value))
    return value


# what tells two bindings of one source apart: destination, routing key, frozen arguments
BindingKey = tuple[object, str, object]


@dataclass(eq=False)
class Binding:
    source: Any  # Exchange
    destination: Any  # Queue or Exchange
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> BindingKey:
        return (self.destination, self.routing_key, freeze(self.arguments))


def amqp_type_name(value: object) -> str:
    """The AMQP 0.9.1 type RabbitMQ would print for a decoded field value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, bytearray):
        return "binary"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__


def wire_type_name(value: object) -> str:
    """The type RabbitMQ prints for a decoded value; ints are named as pika encodes them.

    The decoded value has lost its wire type, so an int in the signed 32-bit range is shown
    as `signedint` (what pika sends) and a larger one as `long`.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    return amqp_type_name(value)


def erlang_term(value: object) -> str:
    """A decoded field value as Erlang's `~p` prints it (`true`, `1`, `<<"s">>`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | bytes | bytearray):
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return '<<"' + raw.decode("utf-8", "replace") + '">>'
    if value is None:
        return "undefined"
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(v) for v in value) + "]"
    return str(value)


def _plain(value: object) -> str:
    """Erlang's `~s` for a binary, `~p` for any other term."""
    if isinstance(value, str | bytes | bytearray):
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return raw.decode("utf-8", "replace")
    return erlang_term(value)


def describe(value: object) -> str:
    """RabbitMQ's `the value '<V>' of type '<T>'` (or `none`) in inequivalence texts."""
    if value is _MISSING:
        return "none"
    return f"the value '{_plain(value)}' of type '{wire_type_name(value)}'"


def describe_pair(received: object, current: object) -> tuple[str, str]:
    """Both sides of `received X but current is Y`, as rabbit_misc:assert_args_equivalence.

    When both tables hold the key, RabbitMQ prints the bare values (`'2000'`); when one side
    lacks it, it prints `none` and `the value '...' of type '...'` for the other.
    """
    if received is _MISSING or current is _MISSING:
        return describe(received), describe(current)
    return f"'{_plain(received)}'", f"'{_plain(current)}'"


_MISSING = object()
MISSING = _MISSING


def equivalent(a: object, b: object) -> bool:
    """Argument equivalence: integer types are equal by value; other types must match."""
    if a is _MISSING or b is _MISSING:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, str | bytes) and isinstance(b, str | bytes):
        return _as_bytes(a) == _as_bytes(b)
    return type(a) is type(b) and freeze(a) == freeze(b)


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value
