"""The stream protocol's consuming: Subscribe, Credit, Deliver, Unsubscribe, StoreOffset and
QueryOffset.

A subscription is a model Consumer of the stream queue, so it shares the queue's readers,
filters and single-active-consumer groups with AMQP 0.9.1 consumers. The subscription itself,
the consumer's sink and its Deliver pump (credit counts chunks, not messages), is
subscription.py's `Subscription`; this module handles the commands. Stored offsets are the
log's tracking records, the same ones 0.9.1 offset tracking writes.
Single-threaded, on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leveret.broker.model import stream_args as sargs
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.errors import BrokerError
from leveret.broker.model.sac import SUPER_STREAM_ARG
from leveret.broker.model.storage_env import STREAM_CHUNK_TYPES
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f
from leveret.broker.streamproto.streams import stream_of
from leveret.broker.streamproto.subscription import Subscription
from leveret.storage import OffsetSpec, StorageError

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession

_KINDS = {k.OFFSET_FIRST: "first", k.OFFSET_LAST: "last", k.OFFSET_NEXT: "next"}


def consumer_update_response(s: StreamSession, d: f.Decoder, _version: int) -> None:
    """The client's answer to ConsumerUpdate: the offset where the active member starts."""
    corr = d.u32()
    d.u16()  # response code; RabbitMQ only logs one that is not OK
    spec = None
    if d.remaining() >= 2:
        kind = d.i16()
        value = d.i64() if d.remaining() >= 8 else 0
        if kind in _KINDS:
            spec = sargs.StartSpec(_KINDS[kind])
        elif kind == k.OFFSET_OFFSET:
            spec = sargs.StartSpec("offset", max(0, value))
        elif kind == k.OFFSET_TIMESTAMP:
            spec = sargs.StartSpec("timestamp", value)
    sid = s.consumer_updates.pop(corr, None)
    sub = s.subscriptions.get(sid) if sid is not None else None
    if sub is not None:
        sub.update_answered(corr, spec)


def subscribe(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    sid = d.u8()
    name = d.string()
    kind = d.u16()
    value = 0
    if kind == k.OFFSET_OFFSET:
        value = d.u64()
    elif kind == k.OFFSET_TIMESTAMP:
        value = d.i64()
    credit = d.u16()
    properties = d.map() if d.remaining() else {}
    d.done()
    s.send(f.response(k.SUBSCRIBE, corr, _subscribe(s, sid, name, kind, value, credit,
                                                    properties)))
    sub = s.subscriptions.get(sid)
    if sub is not None and sub.consumer is not None and sub.consumer.state.active:
        sub.resume()


def consumer_arguments(kind: int, value: int, properties: dict[str, str]) -> dict[str, Any]:
    if kind in _KINDS:
        spec = sargs.StartSpec(_KINDS[kind])
    elif kind == k.OFFSET_OFFSET:
        spec = sargs.StartSpec("offset", value)
    else:
        spec = sargs.StartSpec("timestamp", value)
    arguments: dict[str, Any] = {"x-stream-offset": spec,
                                 "x-stream-automatic-offset-tracking": False}
    filters = [v for key, v in sorted(properties.items()) if key.startswith("filter.")]
    if filters:
        arguments["x-stream-filter"] = filters
        arguments["x-stream-match-unfiltered"] = properties.get("match-unfiltered") == "true"
    if properties.get("single-active-consumer") == "true":
        arguments["x-single-active-consumer"] = True
        if "super-stream" in properties:  # its partition index comes from that exchange
            arguments[SUPER_STREAM_ARG] = properties["super-stream"]
    return arguments


def _subscribe(s: StreamSession, sid: int, name: str, kind: int, value: int, credit: int,
               properties: dict[str, str]) -> int:
    if sid in s.subscriptions:
        return k.SUBSCRIPTION_ID_ALREADY_EXISTS
    if not s.allowed("read", name):
        return k.ACCESS_REFUSED
    queue = stream_of(s, name)
    if queue is None:
        return k.STREAM_DOES_NOT_EXIST
    if kind not in (*_KINDS, k.OFFSET_OFFSET, k.OFFSET_TIMESTAMP):
        return k.PRECONDITION_FAILED
    sac = properties.get("single-active-consumer") == "true"
    reference = properties.get("name")
    if sac and not reference:
        return k.PRECONDITION_FAILED
    sub = Subscription(s, sid, queue, credit, properties)
    tag = reference if sac and reference else f"stream.{s.id}.{sid}"
    consumer = Consumer(tag, queue, sub, prefetch=0,
                        arguments=consumer_arguments(kind, value, properties))
    sub.consumer = consumer
    s.subscriptions[sid] = sub
    try:
        queue.add_consumer(consumer)
    except (BrokerError, StorageError):
        s.subscriptions.pop(sid, None)
        return k.INTERNAL_ERROR
    return k.OK


def credit(s: StreamSession, d: f.Decoder, _version: int) -> None:
    sid = d.u8()
    amount = d.u16()
    d.done()
    sub = s.subscriptions.get(sid)
    if sub is None:  # only this error is answered (Credit has no correlation id)
        s.send(f.frame(k.CREDIT | k.RESPONSE, 1,
                       f.u16(k.SUBSCRIPTION_ID_DOES_NOT_EXIST) + f.u8(sid)))
        return
    sub.credit_left += amount
    sub.resume()


def unsubscribe(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    sid = d.u8()
    d.done()
    sub = s.subscriptions.pop(sid, None)
    if sub is None:
        s.send(f.response(k.UNSUBSCRIBE, corr, k.SUBSCRIPTION_ID_DOES_NOT_EXIST))
        return
    sub.cancel()
    s.send(f.response(k.UNSUBSCRIBE, corr, k.OK))


def query_offset(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    reference = d.string()
    name = d.string()
    d.done()
    queue = stream_of(s, name)
    if queue is None:
        s.send(f.response(k.QUERY_OFFSET, corr, k.STREAM_DOES_NOT_EXIST, f.u64(0)))
        return
    if not s.allowed("read", name):
        s.send(f.response(k.QUERY_OFFSET, corr, k.ACCESS_REFUSED, f.u64(0)))
        return
    stored = queue.stored_offset(reference.encode("utf-8")) if reference else None
    if stored is None or stored < 0:
        s.send(f.response(k.QUERY_OFFSET, corr, k.NO_OFFSET, f.u64(0)))
        return
    s.send(f.response(k.QUERY_OFFSET, corr, k.OK, f.u64(stored)))


def resolve_offset_spec(s: StreamSession, d: f.Decoder, _version: int) -> None:
    """The offset where a subscriber with this offset spec would start (RabbitMQ answers
    with osiris's resolution: type OFFSET and the offset; NO_OFFSET when there is none)."""
    corr = d.u32()
    name = d.string()
    kind = d.i16()
    value = 0
    if kind == k.OFFSET_OFFSET:
        value = d.u64()
    elif kind == k.OFFSET_TIMESTAMP:
        value = d.i64()
    if d.remaining():
        d.map()  # properties (chunk_selector): every chunk Leveret delivers is user data
    d.done()
    code, offset = _resolve(s, name, kind, value)
    s.send(f.response(k.RESOLVE_OFFSET_SPEC, corr, code, f.u16(k.OFFSET_OFFSET) + f.u64(offset)))


def _resolve(s: StreamSession, name: str, kind: int, value: int) -> tuple[int, int]:
    if not s.allowed("read", name):
        return k.ACCESS_REFUSED, 0
    queue = stream_of(s, name)
    if queue is None:
        return k.STREAM_DOES_NOT_EXIST, 0
    log_ = queue.log
    if kind in (k.OFFSET_FIRST, k.OFFSET_LAST) and log_.committed_offset < log_.first_offset:
        return k.NO_OFFSET, 0
    if kind == k.OFFSET_FIRST:
        start = OffsetSpec.first()
    elif kind == k.OFFSET_LAST:
        start = OffsetSpec.last()
    elif kind == k.OFFSET_NEXT:
        start = OffsetSpec.next()
    elif kind == k.OFFSET_OFFSET:
        start = OffsetSpec.offset(value)
    elif kind == k.OFFSET_TIMESTAMP:
        start = OffsetSpec.timestamp(value)
    else:
        return k.PRECONDITION_FAILED, 0
    try:
        reader = log_.reader(start, chunk_types=STREAM_CHUNK_TYPES)
    except StorageError:
        return k.NO_OFFSET, 0
    position = reader.position
    reader.close()
    return k.OK, position
