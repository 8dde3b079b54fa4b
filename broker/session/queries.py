"""Stream queries over AMQP 0.9.1: a basic.get on a reserved `amq.leveret.` name.

RabbitMQ answers these only over its stream protocol or its HTTP API. Leveret answers them to
any AMQP client through basic.get on a queue name nobody can declare (names starting with
`amq.` are reserved):

    amq.leveret.publisher-id?stream=<stream>&publisher=<name>
    amq.leveret.consumer-offset?stream=<stream>&consumer=<name>
    amq.leveret.stream-offsets?stream=<stream>
    amq.leveret.partitions?superstream=<exchange>

(URL query syntax, so any characters can be passed percent-encoded.) The reply is a
basic.get-ok whose body is a small JSON document; the first two also carry their value in a
header as a long (`x-stream-publishing-id`, `x-stream-offset`). A publisher nobody knows has
id 0, as RabbitMQ's QueryPublisherSequence answers; an offset nobody stored gives get-empty.
stream-offsets gives the first, last and committed offsets and the next offset; partitions
gives a super stream's partition streams in partition order, with their binding keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from pamqp import commands

from leveret.amqp.content import Message
from leveret.broker.model.errors import NotFound, PreconditionFailed
from leveret.broker.model.superstream import SuperStreamExchange

if TYPE_CHECKING:
    from leveret.broker.model.vhost import VHost

PREFIX = "amq.leveret."
Check = Callable[[str, str, str], None]  # the channel's permission check


class Answered:
    """Stands in for a queue in the channel's unacked map: settling an answer does nothing."""

    name = ""
    redelivers = False
    stats_ack = 0  # a channel counts each queue's acks (management rates): these go nowhere

    def ack(self, entry: object, consumer: object = None) -> None: ...
    def ack_many(self, entries: list[object], consumer: object = None) -> None: ...
    def reject(self, entry: object, consumer: object = None) -> None: ...
    def requeue(self, entries: list[object], delivery_failed: bool = True) -> None: ...
    def dispatch(self) -> None: ...
    def consumer_timeout(self, arguments: object) -> None:
        return None  # an answer is never given back


ANSWERED = Answered()


def is_query(name: str) -> bool:
    return name.startswith(PREFIX)


def answer(vhost: VHost, name: str, check: Check) -> Message | None:
    parts = urlsplit(name)
    kind = parts.path[len(PREFIX):]
    params = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    handler = _QUERIES.get(kind)
    if handler is None:
        raise NotFound(f"no queue '{name}' in vhost '{vhost.name}'")
    return handler(vhost, name, params, check)


def _stream(vhost: VHost, name: str, params: dict[str, str], check: Check) -> Any:
    stream_name = params.get("stream")
    if stream_name is None:
        raise NotFound(f"no queue '{name}' in vhost '{vhost.name}'")
    check("read", "queue", stream_name)
    stream = vhost.queue(stream_name)
    if stream.type != "stream":
        raise PreconditionFailed(f"{stream.resource} is not a stream")
    return stream


def _publisher_id(vhost: VHost, name: str, params: dict[str, str], check: Check) -> Message:
    stream = _stream(vhost, name, params, check)
    publisher = params.get("publisher", "")
    value = stream.last_publishing_id(publisher.encode("utf-8"))
    return _reply(name, {"stream": stream.name, "publisher": publisher, "publishing_id": value},
                  "x-stream-publishing-id", value)


def _consumer_offset(vhost: VHost, name: str, params: dict[str, str],
                     check: Check) -> Message | None:
    stream = _stream(vhost, name, params, check)
    consumer = params.get("consumer", "")
    offset = stream.stored_offset(consumer.encode("utf-8"))
    if offset is None or offset < 0:
        return None
    return _reply(name, {"stream": stream.name, "consumer": consumer, "offset": offset},
                  "x-stream-offset", offset)


def _stream_offsets(vhost: VHost, name: str, params: dict[str, str], check: Check) -> Message:
    log = _stream(vhost, name, params, check).log
    return _reply(name, {
        "stream": params["stream"], "first": log.first_offset, "last": log.last_offset,
        "committed": log.committed_offset, "next": log.next_offset,
    })


def _partitions(vhost: VHost, name: str, params: dict[str, str], check: Check) -> Message:
    exchange_name = params.get("superstream", "")
    check("read", "exchange", exchange_name)
    exchange = vhost.exchange(exchange_name)
    if not isinstance(exchange, SuperStreamExchange):
        raise PreconditionFailed(f"{vhost.rs('exchange', exchange_name)} is not a super stream")
    return _reply(name, {"superstream": exchange_name, "partitions": [
        {"stream": queue.name, "binding_key": key} for key, queue in exchange.partition_keys()
    ]})


_QUERIES: dict[str, Callable[..., Message | None]] = {
    "publisher-id": _publisher_id,
    "consumer-offset": _consumer_offset,
    "stream-offsets": _stream_offsets,
    "partitions": _partitions,
}


def _reply(name: str, document: dict[str, Any], header: str | None = None,
           value: int | None = None) -> Message:
    headers: dict[str, Any] | None = {header: value} if header is not None else None
    props = commands.Basic.Properties(content_type="application/json", headers=headers)
    return Message.build("", name, json.dumps(document).encode(), props)
