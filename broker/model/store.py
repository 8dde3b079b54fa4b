"""Where a classic queue keeps its ready messages: FIFO, or one FIFO per priority.

The stores hold QueuedMessage entries in delivery order and count their body bytes. A
requeued entry goes back to its original place (by sequence number), as in RabbitMQ. A
durable store (leveret.broker.durable) wraps these and adds the disk. No I/O here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol

from leveret.broker.model.message import QueuedMessage


class MessageStore(Protocol):
    """What a classic queue asks of the store of its ready messages (these two, and the
    durable queue's PagedStore)."""

    @property
    def bytes(self) -> int: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[QueuedMessage]: ...
    def push(self, entry: QueuedMessage) -> None: ...
    def peek(self) -> QueuedMessage | None: ...
    def pop(self) -> QueuedMessage | None: ...
    def requeue(self, entry: QueuedMessage) -> None: ...
    def clear(self) -> list[QueuedMessage]: ...


class MemoryStore:
    """Ready messages of a classic queue, in order."""

    __slots__ = ("_entries", "bytes")

    def __init__(self) -> None:
        self._entries: deque[QueuedMessage] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[QueuedMessage]:
        return iter(self._entries)

    def push(self, entry: QueuedMessage) -> None:
        self._entries.append(entry)
        self.bytes += len(entry.message.body)

    def extend(self, entries: list[QueuedMessage], size: int) -> None:
        """Push entries whose bodies come to `size` bytes in all."""
        self._entries.extend(entries)
        self.bytes += size

    def peek(self) -> QueuedMessage | None:
        return self._entries[0] if self._entries else None

    def pop(self) -> QueuedMessage | None:
        if not self._entries:
            return None
        entry = self._entries.popleft()
        self.bytes -= len(entry.message.body)
        return entry

    def requeue(self, entry: QueuedMessage) -> None:
        """Put an entry back where its sequence number says it belongs."""
        entries = self._entries
        self.bytes += len(entry.message.body)
        if not entries or entries[0].seq > entry.seq:
            entries.appendleft(entry)
            return
        if entries[-1].seq < entry.seq:
            entries.append(entry)
            return
        for index, other in enumerate(entries):
            if other.seq > entry.seq:
                entries.insert(index, entry)
                return
        entries.append(entry)

    def clear(self) -> list[QueuedMessage]:
        entries = list(self._entries)
        self._entries.clear()
        self.bytes = 0
        return entries


class PriorityStore:
    """Ready messages of a queue with x-max-priority: highest priority first, FIFO within."""

    __slots__ = ("_levels", "max_priority")

    def __init__(self, max_priority: int) -> None:
        self.max_priority = max_priority
        self._levels = [MemoryStore() for _ in range(max_priority + 1)]

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels)

    def __iter__(self) -> Iterator[QueuedMessage]:
        for level in reversed(self._levels):
            yield from level

    @property
    def bytes(self) -> int:
        return sum(level.bytes for level in self._levels)

    def _level(self, entry: QueuedMessage) -> MemoryStore:
        return self._levels[min(entry.priority, self.max_priority)]

    def push(self, entry: QueuedMessage) -> None:
        self._level(entry).push(entry)

    def _top(self) -> MemoryStore | None:
        for level in reversed(self._levels):
            if len(level):
                return level
        return None

    def peek(self) -> QueuedMessage | None:
        top = self._top()
        return top.peek() if top else None

    def pop(self) -> QueuedMessage | None:
        top = self._top()
        return top.pop() if top else None

    def requeue(self, entry: QueuedMessage) -> None:
        self._level(entry).requeue(entry)

    def clear(self) -> list[QueuedMessage]:
        out: list[QueuedMessage] = []
        for level in reversed(self._levels):
            out += level.clear()
        return out


class LeveledStore:
    """A quorum queue's ready messages (RabbitMQ 4.3's rabbit_fifo): requeued ones first, in
    their order, then strict priorities over a store per level: the highest level with a
    message goes first, FIFO within a level. The default level's store is given (a paged
    store, as most messages carry no priority); the other levels are kept in memory, made when
    first used."""

    __slots__ = ("_levels", "_order", "default", "default_level", "returns", "top")

    def __init__(self, default_level: int, default: MessageStore, top: int) -> None:
        self.default_level = default_level
        self.default = default
        self.top = top
        self.returns = MemoryStore()  # requeued messages: served before every level
        self._levels: dict[int, MessageStore] = {default_level: default}
        self._order = [default_level]  # the levels made so far, highest first

    def paged(self, priority: int) -> MessageStore:
        """The store of a priority's level (made if it is new)."""
        level = min(priority, self.top)
        store = self._levels.get(level)
        if store is None:
            store = self._levels[level] = MemoryStore()
            self._order = sorted(self._levels, reverse=True)
        return store

    def __len__(self) -> int:
        if len(self._order) == 1:  # the usual case: no message with a priority of its own
            return len(self.returns) + len(self.default)
        return len(self.returns) + sum(len(store) for store in self._levels.values())

    def __iter__(self) -> Iterator[QueuedMessage]:
        yield from self.returns
        for level in self._order:
            yield from self._levels[level]

    def stores(self) -> list[MessageStore]:
        """Each store in the order messages leave: the requeued ones', then each level's,
        highest first."""
        return [self.returns, *(self._levels[level] for level in self._order)]

    @property
    def bytes(self) -> int:
        return self.returns.bytes + sum(store.bytes for store in self._levels.values())

    def push(self, entry: QueuedMessage) -> None:
        self.paged(entry.priority).push(entry)

    def _top(self) -> MessageStore | None:
        if len(self.returns):
            return self.returns
        for level in self._order:
            store = self._levels[level]
            if len(store):
                return store
        return None

    def peek(self) -> QueuedMessage | None:
        top = self._top()
        return top.peek() if top is not None else None

    def pop(self) -> QueuedMessage | None:
        top = self._top()
        return top.pop() if top is not None else None

    def requeue(self, entry: QueuedMessage) -> None:
        self.returns.requeue(entry)

    def clear(self) -> list[QueuedMessage]:
        out: list[QueuedMessage] = self.returns.clear()
        for level in self._order:
            out += self._levels[level].clear()
        return out
