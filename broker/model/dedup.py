"""LavinMQ-style message deduplication for exchanges and queues.

With `x-message-deduplication: true`, an exchange or queue keeps an in-memory cache of the
values of one message header (`x-deduplication-header` names it; default
`x-deduplication-header`). A message whose value is in the cache is a duplicate: an exchange
does not route it, a queue does not store it; a publisher in confirm mode still gets its ack.
A message without the header bypasses deduplication. The cache holds at most `x-cache-size`
entries and evicts the least recently used; `x-cache-ttl` (ms) expires entries, and a
per-message `x-cache-ttl` header overrides it. Each entry costs a fixed amount of memory: the
key is a 16-byte digest of the header's type and value, never the value itself.

Single-threaded; the clock is injected.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from leveret.broker.model.binding import amqp_type_name, freeze
from leveret.broker.model.errors import PreconditionFailed

DEFAULT_HEADER = "x-deduplication-header"
DEFAULT_CACHE_SIZE = 128
ARGUMENTS = ("x-message-deduplication", "x-cache-size", "x-cache-ttl", "x-deduplication-header")


def _int_arg(arguments: dict[str, Any], key: str, rs: str) -> int | None:
    value = arguments.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PreconditionFailed(
            f"invalid arg '{key}' for {rs}: must be a non-negative integer, got {value!r}")
    return value


def from_arguments(arguments: dict[str, Any], rs: str,
                   clock: Callable[[], int]) -> DedupCache | None:
    """The cache an exchange's or queue's arguments ask for, or None; raises on bad values."""
    enabled = arguments.get("x-message-deduplication")
    if enabled is not None and not isinstance(enabled, bool):
        raise PreconditionFailed(
            f"invalid arg 'x-message-deduplication' for {rs}: must be a boolean, got "
            f"{amqp_type_name(enabled)}")
    size = _int_arg(arguments, "x-cache-size", rs)
    ttl = _int_arg(arguments, "x-cache-ttl", rs)
    header = arguments.get("x-deduplication-header", DEFAULT_HEADER)
    if isinstance(header, bytes):
        header = header.decode("utf-8", "replace")
    if not isinstance(header, str) or not header:
        raise PreconditionFailed(
            f"invalid arg 'x-deduplication-header' for {rs}: must be a non-empty string")
    if not enabled:
        return None
    return DedupCache(DEFAULT_CACHE_SIZE if size is None else max(1, size), ttl or None, header,
                      clock)


def _digest(value: object) -> bytes:
    return hashlib.blake2b(repr((amqp_type_name(value), freeze(value))).encode(),
                           digest_size=16).digest()


class DedupCache:
    __slots__ = ("clock", "duplicates", "entries", "header", "size", "ttl_ms")

    def __init__(self, size: int, ttl_ms: int | None, header: str,
                 clock: Callable[[], int]) -> None:
        self.size = size
        self.ttl_ms = ttl_ms
        self.header = header
        self.clock = clock
        self.entries: OrderedDict[bytes, float] = OrderedDict()
        self.duplicates = 0

    def seen(self, headers: Mapping[str, Any]) -> bool:
        """True if this message is a duplicate; otherwise remember it and return False."""
        if self.header not in headers:
            return False
        key = _digest(headers[self.header])
        now = self.clock()
        expires = self.entries.get(key)
        if expires is not None:
            if expires > now:
                self.entries.move_to_end(key)
                self.duplicates += 1
                return True
            del self.entries[key]
        ttl = headers.get("x-cache-ttl")
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
            ttl = self.ttl_ms
        self.entries[key] = now + ttl if ttl else float("inf")
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return False
