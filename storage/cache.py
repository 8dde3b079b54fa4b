"""A shared cache of recently read chunks, for readers of one log in one process.

Readers that follow each other through a log (ten consumers of one stream from `first`, say) would
each read, CRC-check and split the same chunks. Readers opened through one Log share this cache:
the first reader to reach a chunk checks it, the others take the result. An entry is `[body,
records]`: records stay None until a reader splits the chunk (readers that only want the chunk's
record bytes never do), and that reader fills them in for the others. Entries are keyed by segment
and file position, which never change once a chunk is written, and the cache holds at most
`max_bytes` of chunk bodies, least recently used first out. A body is bytes, or a view of a
mapped segment (Reader.read's `mapped`), which a reader that wants bytes swaps for a copy. It
knows nothing of filters or offsets.

Threading: used from one thread, like the Log that owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

DEFAULT_MAX_BYTES = 16 * 1024 * 1024


class ChunkCache:
    __slots__ = ("_entries", "bytes", "hits", "max_bytes", "misses")

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, int], list[Any]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, base: int, position: int) -> list[Any] | None:
        """The entry `[body, records or None]` of the chunk at this place, if cached."""
        entry = self._entries.get((base, position))
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end((base, position))
        self.hits += 1
        return entry

    def put(
        self, base: int, position: int, body: bytes | memoryview,
        records: list[Any] | None = None
    ) -> list[Any] | None:
        """Cache a checked chunk body; return its entry (None if it is too big to cache),
        whose records slot the caller may fill in later."""
        if len(body) > self.max_bytes:
            return None
        key = (base, position)
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        entry = self._entries[key] = [body, records]
        self.bytes += len(body)
        while self.bytes > self.max_bytes:
            _key, (old_body, _records) = self._entries.popitem(last=False)
            self.bytes -= len(old_body)
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
