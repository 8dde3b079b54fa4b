"""Stream tracking queries over AMQP 0.9.1: a basic.get on a reserved `amq.leveret.` name.

RabbitMQ answers "last publishing id of publisher P" and "stored offset of consumer C" only
over its stream protocol. Leveret answers them to any AMQP client through basic.get on a
queue name nobody can declare (names starting with `amq.` are reserved):

    amq.leveret.publisher-id?stream=<stream>&publisher=<name>
    amq.leveret.consumer-offset?stream=<stream>&consumer=<name>

(URL query syntax, so any characters can be passed percent-encoded.) The reply is a
basic.get-ok whose body is a small JSON document and whose headers carry the value as a long
(`x-stream-publishing-id`, or `x-stream-offset`); a publisher nobody knows has id 0, as
RabbitMQ's QueryPublisherSequence answers; an offset nobody stored gives get-empty.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pamqp import commands

from leveret.amqp.content import Message
from leveret.broker.model.errors import NotFound, PreconditionFailed

PREFIX = "amq.leveret."


class Answered:
    """Stands in for a queue in the channel's unacked map: settling an answer does nothing."""

    name = ""
    redelivers = False

    def ack(self, entry: Any, consumer: Any = None) -> None: ...
    def reject(self, entry: Any, consumer: Any = None) -> None: ...
    def requeue(self, entries: list[Any]) -> None: ...
    def dispatch(self) -> None: ...


ANSWERED = Answered()


def is_query(name: str) -> bool:
    return name.startswith(PREFIX)


def answer(vhost: Any, name: str, check: Any) -> Message | None:
    parts = urlsplit(name)
    kind = parts.path[len(PREFIX):]
    params = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    stream_name = params.get("stream")
    if kind not in ("publisher-id", "consumer-offset") or stream_name is None:
        raise NotFound(f"no queue '{name}' in vhost '{vhost.name}'")
    check("read", "queue", stream_name)
    stream = vhost.queue(stream_name)
    if stream.type != "stream":
        raise PreconditionFailed(f"{stream.resource} is not a stream")
    if kind == "publisher-id":
        publisher = params.get("publisher", "")
        value = stream.last_publishing_id(publisher.encode("utf-8"))
        return _reply(name, "x-stream-publishing-id",
                      {"stream": stream_name, "publisher": publisher, "publishing_id": value})
    consumer = params.get("consumer", "")
    offset = stream.stored_offset(consumer.encode("utf-8"))
    if offset is None or offset < 0:
        return None
    return _reply(name, "x-stream-offset",
                  {"stream": stream_name, "consumer": consumer, "offset": offset})


def _reply(name: str, header: str, document: dict[str, Any]) -> Message:
    value = document.get("publishing_id", document.get("offset"))
    props = commands.Basic.Properties(content_type="application/json", headers={header: value})
    return Message.build("", name, json.dumps(document).encode(), props)
