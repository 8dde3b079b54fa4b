"""Validation of queue and consumer x-arguments, as RabbitMQ checks them.

Each validator returns None or RabbitMQ's error term as text (the `~p` of an Erlang term, such
as `{value_negative,-1}`); `check_queue_args` raises PreconditionFailed with RabbitMQ's reply
text. RabbitMQ's catalogue of queue types (the keys each one takes, its module's name) also
lives here, so that a key of another type is refused with "invalid arg ... of queue type ...",
whichever types Leveret implements; the queue kinds (queue_kind.py) read their entries.
Pure functions; no I/O.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

from leveret.broker.model.binding import wire_type_name
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.fields import FieldTable, FieldValue

MAX_EXPIRY_MS = 315_360_000_000  # ten years, RabbitMQ's cap for TTLs and x-expires
MAX_PRIORITY = 255
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders", "min-masters")
MASTER_LOCATORS = ("min-masters", "client-local", "random")

Validator = Callable[[FieldValue, FieldTable], str | None]


def erlang_type(value: object) -> str:
    """The AMQP type name RabbitMQ prints; ints are shown as pika encodes them."""
    return wire_type_name(value)


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_str(value: object) -> TypeGuard[str | bytes]:
    return isinstance(value, str | bytes)


def text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def check_int(value: FieldValue, _args: FieldTable) -> str | None:
    if is_int(value):
        return None
    return f'"expected integer, got {erlang_type(value)}"'


def check_non_neg_int(value: FieldValue, args: FieldTable) -> str | None:
    error = check_int(value, args)
    if error is None and is_int(value) and value < 0:
        return f"{{value_negative,{value}}}"
    return error


def check_expiry(value: int) -> str | None:
    if value < 0:
        return f"{{value_negative,{value}}}"
    if value > MAX_EXPIRY_MS:
        return f"{{value_too_large,{value}}}"
    return None


def check_expires(value: FieldValue, args: FieldTable) -> str | None:
    if not is_int(value):
        return check_int(value, args)
    if value == 0:
        return "{value_zero,0}"
    return check_expiry(value)


def check_message_ttl(value: FieldValue, args: FieldTable) -> str | None:
    if not is_int(value):
        return check_int(value, args)
    return check_expiry(value)


def check_max_priority(value: FieldValue, args: FieldTable) -> str | None:
    error = check_non_neg_int(value, args)
    if error is None and is_int(value) and value > MAX_PRIORITY:
        return f"{{max_value_exceeded,{value}}}"
    return error


def check_bool(value: FieldValue, _args: FieldTable) -> str | None:
    if isinstance(value, bool):
        return None
    return f"{{unacceptable_type,{erlang_type(value)}}}"


def check_positive_int(value: FieldValue, args: FieldTable) -> str | None:
    error = check_non_neg_int(value, args)
    if error is None and is_int(value) and value == 0:
        return "{value_zero,0}"
    return error


def check_dlx(value: FieldValue, _args: FieldTable) -> str | None:
    return None if is_str(value) else f"{{unacceptable_type,{erlang_type(value)}}}"


def check_dlrk(value: FieldValue, args: FieldTable) -> str | None:
    if not is_str(value):
        return f"{{unacceptable_type,{erlang_type(value)}}}"
    if "x-dead-letter-exchange" not in args:
        return "routing_key_but_no_dlx_defined"
    return None


def _one_of(choices: tuple[str, ...], error: str) -> Validator:
    def check(value: FieldValue, _args: FieldTable) -> str | None:
        if not is_str(value):
            return f"{{unacceptable_type,{erlang_type(value)}}}"
        return None if text(value) in choices else error

    return check


check_overflow = _one_of(OVERFLOW_MODES, "invalid_overflow")
check_leader_locator = _one_of(LEADER_LOCATORS, "invalid_queue_locator_arg")
# RabbitMQ 3.10 does not validate x-queue-master-locator at declaration and fails later with
# 541 INTERNAL_ERROR; Leveret refuses a value it would not know with 406 instead.
check_master_locator = _one_of(MASTER_LOCATORS, "invalid_queue_master_locator")
check_dlx_strategy = _one_of(("at-most-once", "at-least-once"), "invalid_dlx_strategy")


def check_queue_mode(value: FieldValue, _args: FieldTable) -> str | None:
    if not is_str(value):
        return f"{{unacceptable_type,{erlang_type(value)}}}"
    if text(value) in ("default", "lazy"):
        return None
    return f"\"unsupported queue mode '{text(value)}'\""


def check_queue_version(value: FieldValue, args: FieldTable) -> str | None:
    error = check_non_neg_int(value, args)
    if error is None and is_int(value) and value not in (1, 2):
        return f"\"unsupported queue version '{value}'\""
    return error


_MAX_AGE = re.compile(r"^([0-9]*)(.*)$", re.DOTALL)
_UNIT_MS = {
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "D": 86_400_000,
    "M": 30 * 86_400_000,
    "Y": 365 * 86_400_000,
}


def parse_max_age(value: str) -> int | None:
    """`10D`, `1Y`, `5s` -> milliseconds; None if invalid (RabbitMQ's check_max_age)."""
    match = _MAX_AGE.match(value)
    if not match or not match.group(1):
        return None
    number, unit = int(match.group(1)), match.group(2)
    if number <= 0 or unit not in _UNIT_MS:
        return None
    return number * _UNIT_MS[unit]


def check_max_age(value: FieldValue, _args: FieldTable) -> str | None:
    if not is_str(value):
        return f"{{unacceptable_type,{erlang_type(value)}}}"
    return None if parse_max_age(text(value)) is not None else "invalid_max_age"


# RabbitMQ's declare_args(), in its order (4.3's: x-consumer-timeout and
# x-consumer-disconnected-timeout are checked after x-single-active-consumer). x-delivery-limit
# has no validator in RabbitMQ 3.10 or 4.3: any value is accepted when a quorum queue is declared.
DECLARE_VALIDATORS: dict[str, Validator] = {
    "x-expires": check_expires,
    "x-message-ttl": check_message_ttl,
    "x-dead-letter-exchange": check_dlx,
    "x-dead-letter-routing-key": check_dlrk,
    "x-dead-letter-strategy": check_dlx_strategy,
    "x-max-length": check_non_neg_int,
    "x-max-length-bytes": check_non_neg_int,
    "x-max-in-memory-length": check_non_neg_int,
    "x-max-in-memory-bytes": check_non_neg_int,
    "x-max-priority": check_max_priority,
    "x-overflow": check_overflow,
    "x-queue-mode": check_queue_mode,
    "x-queue-version": check_queue_version,
    "x-single-active-consumer": check_bool,
    "x-consumer-timeout": check_non_neg_int,
    "x-consumer-disconnected-timeout": check_non_neg_int,
    "x-quorum-initial-group-size": check_positive_int,
    "x-max-age": check_max_age,
    "x-stream-max-segment-size-bytes": check_non_neg_int,
    "x-stream-filter-size-bytes": check_non_neg_int,
    "x-initial-cluster-size": check_positive_int,
    "x-queue-leader-locator": check_leader_locator,
    "x-queue-master-locator": check_master_locator,
}

# The `queue_arguments` capability of each queue type.
QUEUE_TYPE_ARGS: dict[str, tuple[str, ...]] = {
    "classic": (
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-type",
        "x-queue-master-locator",
        "x-queue-leader-locator",
    ),
    "quorum": (
        "x-expires",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
        "x-consumer-timeout",
        "x-delayed-retry-type",
        "x-delayed-retry-min",
        "x-delayed-retry-max",
        # RabbitMQ 4.3 also takes x-consumer-disconnected-timeout: not implemented here, so
        # refused (ALL_TYPED_ARGS; docs/QUORUM-QUEUES.md)
    ),
    "stream": (
        "x-queue-type",
        "x-max-length-bytes",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-stream-filter-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    ),
}
QUEUE_TYPE_MODULES = {
    "classic": "rabbit_classic_queue",
    "quorum": "rabbit_quorum_queue",
    "stream": "rabbit_stream_queue",
}
# Every key some type of RabbitMQ 4.3 takes: refused for the types that do not take it. Those
# no type takes here are keys of quorum queues that Leveret does not implement (RabbitMQ 4.3
# takes the first; x-member-placement-tag is newer).
ALL_TYPED_ARGS = frozenset(k for keys in QUEUE_TYPE_ARGS.values() for k in keys) | {
    "x-consumer-disconnected-timeout",
    "x-member-placement-tag",
}

CONSUME_TYPE_ARGS: dict[str, tuple[str, ...]] = {
    "classic": ("x-priority", "x-cancel-on-ha-failover"),
    "quorum": ("x-priority", "x-cancel-on-ha-failover", "x-consumer-timeout"),
    "stream": (
        "x-stream-offset",
        "x-stream-filter",
        "x-stream-match-unfiltered",
        "x-stream-automatic-offset-tracking",
        "x-single-active-consumer",
    ),
}
# The consumer keys RabbitMQ knows; Leveret's own stream extensions are not among them, so a
# classic queue ignores them as RabbitMQ ignores any unknown key.
ALL_CONSUME_ARGS = frozenset(
    {
        "x-priority",
        "x-cancel-on-ha-failover",
        "x-stream-offset",
        "x-stream-filter",
        "x-stream-match-unfiltered",
    }
)


def queue_type_of(arguments: dict[str, Any], resource_text: str) -> str:
    value = arguments.get("x-queue-type", "classic")
    if not is_str(value):
        raise PreconditionFailed(
            f"invalid arg 'x-queue-type' for {resource_text}: "
            f"{{unacceptable_type,{erlang_type(value)}}}"
        )
    name = text(value)
    if name not in QUEUE_TYPE_ARGS:
        raise PreconditionFailed(
            f"invalid arg 'x-queue-type' for {resource_text}: \"unsupported queue type '{name}'\""
        )
    return name


MAX_NESTING = 100


def check_nesting(arguments: dict[str, Any], resource_text: str) -> None:
    """Refuse an arguments table nested deeper than MAX_NESTING tables and arrays. RabbitMQ
    has no such limit, but every layer that keeps or compares arguments (the metadata store,
    equivalence checks, binding keys) walks them recursively, and no real use nests them."""
    stack = [(value, 1) for value in arguments.values()]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Iterable[FieldValue] = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_NESTING:
            raise PreconditionFailed(
                f"arguments for {resource_text} are nested more than {MAX_NESTING} levels deep"
            )
        stack.extend((child, depth + 1) for child in children)


def check_queue_args(arguments: dict[str, Any], queue_type: str, resource_text: str) -> None:
    """RabbitMQ's check_declare_arguments: typed validators, then keys of other types."""
    allowed = QUEUE_TYPE_ARGS[queue_type]
    for key, validator in DECLARE_VALIDATORS.items():
        if key in allowed and key in arguments:
            error = validator(arguments[key], arguments)
            if error is not None:
                raise PreconditionFailed(f"invalid arg '{key}' for {resource_text}: {error}")
    for key in arguments:
        if key in ALL_TYPED_ARGS and key not in allowed:
            raise PreconditionFailed(
                f"invalid arg '{key}' for {resource_text} of queue type "
                f"{QUEUE_TYPE_MODULES[queue_type]}"
            )


def check_consume_args(arguments: dict[str, Any], queue_type: str, resource_text: str) -> None:
    check_nesting(arguments, resource_text)
    allowed = CONSUME_TYPE_ARGS[queue_type]
    for key, validator in (("x-priority", check_int), ("x-cancel-on-ha-failover", check_bool)):
        if key in allowed and key in arguments:
            error = validator(arguments[key], arguments)
            if error is not None:
                raise PreconditionFailed(f"invalid arg '{key}' for {resource_text}: {error}")
    for key in arguments:
        if key in ALL_CONSUME_ARGS and key not in allowed:
            raise PreconditionFailed(
                f"invalid arg '{key}' for {resource_text} of queue type "
                f"{QUEUE_TYPE_MODULES[queue_type]}"
            )


def parse_expiration(value: str) -> int:
    """A per-message `expiration` property, as RabbitMQ parses it; raises PreconditionFailed."""
    stripped = value
    digits = re.match(r"^[+-]?[0-9]+", stripped)  # Erlang's string:to_integer takes a sign
    if digits is None:
        raise PreconditionFailed(f"invalid expiration '{value}': no_integer")
    if digits.end() != len(stripped):
        raise PreconditionFailed(
            f"invalid expiration '{value}': {{leftover_string,\"{stripped[digits.end() :]}\"}}"
        )
    number = int(digits.group(0))
    error = check_expiry(number)
    if error is not None:
        raise PreconditionFailed(f"invalid expiration '{value}': {error}")
    return number


def timestamp_ms(value: datetime.datetime) -> int:
    return int(value.timestamp() * 1000)
