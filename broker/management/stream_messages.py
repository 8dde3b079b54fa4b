"""Reading a stream's messages at an offset for the management API (the web UI's "read").

`GET /api/leveret/streams/{vhost}/{name}/messages?offset=N&count=M` answers up to `count`
(1 to 100, default 10) committed messages from offset `offset` (default: the stream's first),
each as the queue "get" shows a message (`messages.message_view`) plus its `offset`, with the
stream's `first_offset`, `last_offset` and `committed_offset`. Reading moves no consumer and
stores no offset: it opens its own storage reader and closes it. It needs the `read`
permission on the stream, as a queue's get does. In a cluster, only the node that holds the
stream can read it (400 naming that node otherwise).

Knows the model's stream queue (its `log`) and the storage reader; no AMQP. Runs on the
broker's event loop thread; a read is bounded by `count`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiohttp import web

from leveret.amqp.stored import decode_record
from leveret.broker.management import messages, streamops
from leveret.broker.management.http import (
    ApiError,
    bad_request,
    broker_of,
    ok,
    vhost_for_write,
)
from leveret.broker.management.nodes import nodes_of
from leveret.broker.model.errors import NotFound
from leveret.broker.model.storage_env import STREAM_CHUNK_TYPES
from leveret.storage import OffsetSpec, StorageError

MAX_COUNT = 100


def _number(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f"{name} must be a number") from None


def read(stream: Any, offset: int, count: int) -> list[dict[str, Any]]:
    """Up to `count` committed messages of `stream` from `offset`, as the API shows them."""
    log = stream.log
    reader = log.reader(OffsetSpec.offset(max(offset, log.first_offset)),
                        chunk_types=STREAM_CHUNK_TYPES)
    out: list[dict[str, Any]] = []
    try:
        while len(out) < count:
            chunk = reader.read()
            if chunk is None:
                break
            first = chunk.first_offset
            records = stream.records_of(chunk)
            offsets = chunk.offsets if chunk.offsets is not None else range(
                first, first + len(records))
            for at, record in zip(offsets, records, strict=True):
                if at < offset:
                    continue
                entry = SimpleNamespace(message=decode_record(bytes(record)), redelivered=False)
                view = messages.message_view(entry, "auto")
                out.append({"offset": at, **view})
                if len(out) >= count:
                    break
    finally:
        reader.close()
    return out


async def stream_messages(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    name = request.match_info["name"]
    broker = broker_of(request)
    try:
        stream = streamops.stream_of(broker, vhost.name, name)
    except NotFound as exc:
        raise ApiError(404, "not_found", exc.text) from None
    check("read", "queue", name)
    nodes = nodes_of(request)
    if nodes.is_remote(stream) or getattr(stream, "log", None) is None:
        node = nodes.node_of(stream)
        raise bad_request(f"stream '{name}' is held by node {node}: read it through that "
                          "node's management API")
    offset = _number(request, "offset", stream.log.first_offset)
    count = _number(request, "count", 10)
    if offset < 0:
        raise bad_request("offset must be 0 or more")
    if not 1 <= count <= MAX_COUNT:
        raise bad_request(f"count must be between 1 and {MAX_COUNT}")
    try:
        items = read(stream, offset, count)
    except StorageError as exc:
        raise ApiError(500, "internal_server_error", f"cannot read the stream: {exc}") from None
    log = stream.log
    return ok({
        "name": name,
        "vhost": vhost.name,
        "first_offset": log.first_offset,
        "last_offset": log.last_offset,
        "committed_offset": log.committed_offset,
        "messages": items,
    })


def setup(app: web.Application) -> None:
    app.router.add_get("/api/leveret/streams/{vhost}/{name}/messages", stream_messages)
