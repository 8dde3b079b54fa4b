"""Exactly once across a delayed log's leader change: a target queue takes each routed copy
of a held message once.

A delayed exchange's leader stamps each copy it routes with an id, `<log storage_id>:<held
offset>` (header `ID_HEADER`); the offset is the same on every member of the log, so a new
leader that routes again what the old one routed but had not committed as ROUTED stamps the
same id. A target queue keeps, per exchange log, the ids it took (`TakenIds`) and drops a copy
whose id it has: a duplicate can only come for what was routed after the last ROUTED record a
majority holds, which is the newest routed copies; so each log keeps the last `WINDOW` ids a
queue took (routing is in due order, not offset order: a window of ids, not a high-water mark).

The header is the broker's: `take` removes it from the copy the queue keeps, so a consumer
never sees it. Where the ids are kept beyond memory (docs/DELAYED-MESSAGES.md): a durable
classic or quorum queue writes TAKEN records (`pack_taken`) with the copies, a stream puts
them in the tracking trailer of the chunk holding the copy; a restart or a new leader reads
them back. A non-durable classic queue keeps them in memory only.

It must not know the cluster, AMQP or the storage engine.
Threading: single-threaded, on the event loop.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable

from leveret.broker.model.message import InboundMessage

ID_HEADER = "x-leveret-delayed-id"
MARK = ID_HEADER.encode()  # callers look for it in the header bytes first (cheap)
WINDOW = 100_000  # ids kept per (queue, exchange log): many turns of routing (2,000 a turn)


class TakenIds:
    """The ids of delayed copies one queue took, per exchange log, the newest WINDOW each."""

    def __init__(self) -> None:
        self._logs: dict[str, OrderedDict[int, None]] = {}

    def seen(self, log_id: str, offset: int) -> bool:
        """Whether the copy was taken already; if not, it is now."""
        taken = self._logs.get(log_id)
        if taken is None:
            taken = self._logs[log_id] = OrderedDict()
        if offset in taken:
            return True
        taken[offset] = None
        if len(taken) > WINDOW:
            taken.popitem(last=False)
        return False

    def forget(self, log_id: str, offset: int) -> None:
        """A copy taken was refused after all (the queue's write failed): it may come again."""
        taken = self._logs.get(log_id)
        if taken is not None:
            taken.pop(offset, None)


def parse(message: InboundMessage) -> tuple[str, int] | None:
    """The id a routed delayed copy carries, or None (a cheap look at the header bytes
    first: most messages are not delayed copies)."""
    if MARK not in message.header:
        return None
    value = message.headers.get(ID_HEADER)
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str):
        return None
    log_id, _, offset = value.rpartition(":")
    return (log_id, int(offset)) if log_id and offset.isdigit() else None


def take(ids: TakenIds, message: InboundMessage,
         took: Callable[[str, int], None] | None = None) -> InboundMessage | None:
    """The message a queue keeps: itself, or without the id header if it is a delayed copy
    not taken yet (`took` is told its id); None: a copy this queue already took (drop it)."""
    found = parse(message)
    if found is None:
        return message
    if ids.seen(*found):
        return None
    if took is not None:
        took(*found)
    headers = dict(message.headers)
    del headers[ID_HEADER]
    return message.replace(headers=headers)


_TAKEN = struct.Struct(">QH")  # offset, length of the log id that follows


def pack_taken(log_id: str, offset: int) -> bytes:
    """A record of a copy taken (durable classic and quorum queues keep them in their log:
    durable.py's TAKEN chunks)."""
    raw = log_id.encode()
    return _TAKEN.pack(offset, len(raw)) + raw


def unpack_taken(record: bytes) -> tuple[str, int]:
    offset, size = _TAKEN.unpack_from(record, 0)
    return bytes(record[_TAKEN.size:_TAKEN.size + size]).decode(), int(offset)
