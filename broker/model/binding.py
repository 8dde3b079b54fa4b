"""Bindings and the argument-table helpers they need (equality, RabbitMQ's value printing).

A binding links a source exchange to a destination (a queue or an exchange) with a routing key
and an arguments table. Pure data; no routing logic, no I/O.
"""

from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass, field
from typing import Any


def freeze(value: Any) -> Any:
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


@dataclass(eq=False)
class Binding:
    source: Any  # Exchange
    destination: Any  # Queue or Exchange
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[Any, str, Any]:
        return (self.destination, self.routing_key, freeze(self.arguments))


def amqp_type_name(value: Any) -> str:
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


def describe(value: Any) -> str:
    """RabbitMQ's `the value '<V>' of type '<T>'` (or `none`) in inequivalence texts."""
    if value is _MISSING:
        return "none"
    shown = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if isinstance(shown, bool):
        shown = str(shown).lower()
    return f"the value '{shown}' of type '{amqp_type_name(value)}'"


_MISSING = object()
MISSING = _MISSING


def equivalent(a: Any, b: Any) -> bool:
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
