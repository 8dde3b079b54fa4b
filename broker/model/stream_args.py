"""Stream arguments: declaration checks, x-stream-offset and filter parsing, as RabbitMQ does.

Declaring a stream checks the stream-only limits after the generic argument validators
(args.py) and the flags of a durable-only type (queue_kind.py) have run; consuming parses
`x-stream-offset` (first, last, next, an integer offset, an AMQP timestamp, or an interval such
as `1h`), `x-stream-filter` and `x-stream-match-unfiltered`; publishing checks
`x-stream-publisher-name`. Pure functions that raise domain errors with RabbitMQ's texts.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leveret.broker.model import args as qargs
from leveret.broker.model.errors import NotImplementedFeature, PreconditionFailed

MAX_SEGMENT_SIZE_BYTES = 3_000_000_000
DEFAULT_SEGMENT_SIZE_BYTES = 500_000_000
DEFAULT_FILTER_SIZE_BYTES = 16


def check_declaration(rs: str, *, arguments: dict[str, Any]) -> None:
    """RabbitMQ's stream-only declare checks, in its order (after the generic validators and
    the checks of a durable-only type's flags, queue_kind.DeclareRules)."""
    segment = arguments.get("x-stream-max-segment-size-bytes")
    if isinstance(segment, int) and segment > MAX_SEGMENT_SIZE_BYTES:
        raise PreconditionFailed("Exceeded max value for x-stream-max-segment-size-bytes")
    size = arguments.get("x-stream-filter-size-bytes")
    if size is not None:
        if not qargs.is_int(size):
            raise PreconditionFailed("Invalid type for x-stream-filter-size-bytes")
        if not 16 <= size <= 255:
            raise PreconditionFailed("Invalid value for x-stream-filter-size-bytes")


@dataclass(frozen=True)
class StartSpec:
    """Where a consumer starts: kind is first, last, next, offset or timestamp."""

    kind: str
    value: int = 0


def _erlang_repr(value: object) -> str:
    if isinstance(value, str | bytes):
        return f'{{longstr,<<"{qargs.text(value)}">>}}'
    if isinstance(value, bool):
        return f"{{bool,{str(value).lower()}}}"
    if isinstance(value, float):
        return f"{{double,{value}}}"
    return f"{{{qargs.erlang_type(value)},{value!r}}}"


def parse_offset(value: object, now_ms: int, rs: str) -> StartSpec:
    """x-stream-offset, as rabbit_stream_queue:parse_offset_arg reads it."""
    if isinstance(value, bool):
        raise _bad_offset(value, rs)
    if isinstance(value, int):
        return StartSpec("offset", value)
    if isinstance(value, datetime.datetime):
        return StartSpec("timestamp", int(value.timestamp()) * 1000)
    if isinstance(value, str | bytes):
        word = qargs.text(value)
        if word in ("first", "last", "next"):
            return StartSpec(word)
        interval = qargs.parse_max_age(word)
        if interval is None:
            raise _bad_offset(value, rs)
        return StartSpec("timestamp", now_ms - interval)
    raise _bad_offset(value, rs)


def _bad_offset(value: object, rs: str) -> PreconditionFailed:
    term = f"{{invalid_stream_offset_arg,{_erlang_repr(value)}}}"
    return PreconditionFailed(f"invalid arg 'x-stream-offset' for {rs}: {term}")


@dataclass(frozen=True)
class FilterSpec:
    values: frozenset[bytes]
    match_unfiltered: bool


def parse_filter(arguments: dict[str, Any]) -> FilterSpec | None:
    """x-stream-filter (a string or an array of strings) and x-stream-match-unfiltered.

    Other types mean no filtering, as RabbitMQ reads them."""
    raw = arguments.get("x-stream-filter")
    if isinstance(raw, str | bytes):
        values = [raw]
    elif isinstance(raw, list):
        values = [v for v in raw if isinstance(v, str | bytes)]
    else:
        return None
    unfiltered = arguments.get("x-stream-match-unfiltered") is True
    return FilterSpec(
        frozenset(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values),
        unfiltered,
    )


def filter_value(headers: Mapping[str, Any]) -> bytes | None:
    """A message's x-stream-filter-value: a valid UTF-8 string without NUL, else none."""
    value = headers.get("x-stream-filter-value")
    if isinstance(value, str) and "\x00" not in value:
        return value.encode("utf-8")
    return None


def check_consumer(rs: str, *, no_ack: bool, prefetch: int, global_prefetch: int) -> None:
    """RabbitMQ's stream consume preconditions, in its order (after argument checks)."""
    if prefetch == 0:
        raise PreconditionFailed(f"consumer prefetch count is not set for stream {rs}")
    if no_ack:
        raise NotImplementedFeature(f"automatic acknowledgement not supported by stream {rs}")
    if global_prefetch:
        raise NotImplementedFeature(f"{rs} does not support global qos")


END_OFFSET = "x-leveret-end-offset"  # deliver offsets below it, then basic.cancel


def end_offset(arguments: dict[str, Any]) -> int | None:
    """The consumer's x-leveret-end-offset (checked by check_extension_args), or None."""
    end = arguments.get(END_OFFSET)
    return end if type(end) is int else None


def check_extension_args(arguments: dict[str, Any], rs: str) -> None:
    """Leveret's own consumer arguments (RabbitMQ has them only in its stream protocol): a
    value of the wrong type is refused rather than read as "off"."""
    tracking = arguments.get("x-stream-automatic-offset-tracking")
    if "x-stream-automatic-offset-tracking" in arguments and not (
        isinstance(tracking, bool)
        or (qargs.is_str(tracking) and qargs.text(tracking) in ("true", "false"))
    ):
        raise PreconditionFailed(
            f"invalid arg 'x-stream-automatic-offset-tracking' for {rs}: "
            f"{{unacceptable_type,{qargs.erlang_type(tracking)}}}"
        )
    if END_OFFSET in arguments:
        end = arguments[END_OFFSET]
        if type(end) is not int or end < 0:
            raise PreconditionFailed(
                f"invalid arg '{END_OFFSET}' for {rs}: "
                + (f"{{value_negative,{end}}}" if type(end) is int
                   else f"{{unacceptable_type,{qargs.erlang_type(end)}}}")
            )
    sac = arguments.get("x-single-active-consumer")
    if "x-single-active-consumer" in arguments and not isinstance(sac, bool):
        raise PreconditionFailed(
            f"invalid arg 'x-single-active-consumer' for {rs}: "
            f"{{unacceptable_type,{qargs.erlang_type(sac)}}}"
        )


def tracking_enabled(tag: str, arguments: dict[str, Any]) -> bool:
    """LavinMQ's convention: a client-chosen tag without x-stream-offset tracks its offset;
    x-stream-automatic-offset-tracking turns it on or off explicitly."""
    explicit = arguments.get("x-stream-automatic-offset-tracking")
    if isinstance(explicit, bool):
        return explicit
    if isinstance(explicit, str | bytes) and qargs.text(explicit) in ("true", "false"):
        return qargs.text(explicit) == "true"
    return not tag.startswith("amq.ctag-") and "x-stream-offset" not in arguments


PUBLISHER_NAME = (str, bytes)  # what an x-stream-publisher-name may be


def publisher_key(publisher: object) -> bytes:
    """A publisher name as stored (UTF-8, at most 255 bytes), or PreconditionFailed."""
    if not isinstance(publisher, PUBLISHER_NAME):
        raise PreconditionFailed("x-stream-publisher-name must be a string")
    name = publisher.encode("utf-8") if isinstance(publisher, str) else bytes(publisher)
    if len(name) > 255:
        raise PreconditionFailed("x-stream-publisher-name is longer than 255 bytes")
    return name


def publisher_header(name: bytes) -> str | bytes:
    """A stored publisher name as the header that names it decodes (as pamqp: str if UTF-8)."""
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        return name


def stored_publishers(publishers: dict[str | bytes, int]) -> dict[bytes, int]:
    """Last publishing ids by header value, as the log stores them (by publisher_key)."""
    return {publisher_key(name): last for name, last in publishers.items()}
