"""Stream operations behind the rabbitmq-streams-style commands: super streams, status,
restart, offset reset, tracking, publishers and single-active-consumer groups.

Each raises the model's domain errors (or admin.BadRequest) with RabbitMQ's CLI texts, so the
API can pass them on and `leveret-streams` print them. They act on the copy of a stream that
this node holds. A stream's members are its replication's (`member_rows`): on one node, one
member, the writer, on this node; a replicated stream (cluster mode) adds the rows of its
other members, and `stream_members` asks the leader's node for a stream this node does not
hold.

Single-threaded: runs on the broker's event loop thread.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leveret.broker.access.admin import BadRequest, get_vhost
from leveret.broker.management import views
from leveret.broker.model import superstream
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.errors import NotFound
from leveret.broker.model.storage_env import STREAM_CHUNK_TYPES
from leveret.broker.model.stream import StreamQueue
from leveret.storage import (
    StorageError,
    inspect,
)

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.model.vhost import VHost

_EPOCHS: weakref.WeakKeyDictionary[StreamQueue, int] = weakref.WeakKeyDictionary()
_SIZE = re.compile(
    r"^([0-9]+)(kB|KB|MB|GB|kb|mb|gb|Kb|Mb|Gb|kiB|KiB|MiB|GiB|kib|mib|gib|KIB|MIB|GIB|k|K|m|M"
    r"|g|G)?$"
)
_SIZE_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3}
_ISO_DURATION = re.compile(
    r"^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$"
)


# -- RabbitMQ's value syntaxes --------------------------------------------------------------


def parse_size(value: object) -> int | None:
    """rabbit_resource_monitor_misc:parse_information_unit: 20gb, 500MB, 1GiB, 1024."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.match(str(value))
    if match is None:
        return None
    number, unit = int(match.group(1)), match.group(2)
    if unit is None:
        return number
    if unit.lower() in ("kb", "mb", "gb"):
        return number * {"k": 1000, "m": 1000**2, "g": 1000**3}[unit[0].lower()]
    return number * _SIZE_UNITS[unit[0].lower()]


def parse_iso_duration_s(value: str) -> int | None:
    """An ISO 8601 duration in seconds, with RabbitMQ's Y = 365 days and M = 30 days."""
    match = _ISO_DURATION.match(value)
    if match is None or value in ("P", "PT") or value.endswith("T"):
        return None
    y, mo, w, d, h, mi, s = (int(g or 0) for g in match.groups())
    return ((y * 365 + mo * 30 + w * 7 + d) * 86400) + h * 3600 + mi * 60 + s


# -- lookups --------------------------------------------------------------------------------


def stream_of(broker: Broker, vhost_name: str, name: str,
              refusal: str = "{name} is not a stream") -> Any:
    """The stream queue `name`; NotFound if there is none, BadRequest (the `refusal` text,
    with {what} = "a classic queue" and {name}) for a queue of another type."""
    vhost = broker.vhosts.get(vhost_name)
    queue = vhost.queues.get(name) if vhost is not None else None
    if queue is None:
        raise NotFound("The stream does not exist")
    if queue.type != "stream":
        raise BadRequest(refusal.format(what=f"a {queue.type} queue", name=name))
    return queue


def streams(vhost: VHost) -> list[Any]:
    return [q for q in vhost.queues.values() if q.type == "stream"]


# -- super streams ----------------------------------------------------------------------------

_OPTION_ARGS = {
    "max-length-bytes": "x-max-length-bytes",
    "max-age": "x-max-age",
    "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
    "initial-cluster-size": "x-initial-cluster-size",
    "queue-leader-locator": "x-queue-leader-locator",
    "leader-locator": "x-queue-leader-locator",
    "stream-filter-size-bytes": "x-stream-filter-size-bytes",
}


def stream_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """Super stream options (RabbitMQ's keys, with or without `x-`) as partition arguments."""
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        name = _OPTION_ARGS.get(key.removeprefix("x-"))
        if name is None:
            raise BadRequest(f"unknown super stream argument '{key}'")
        if name in ("x-max-age", "x-queue-leader-locator"):
            out[name] = str(value)
            continue
        number = parse_size(value)
        if number is None:
            raise BadRequest(f"Invalid value for {key}: {value!r}")
        out[name] = number
    return out


def add_super_stream(
    broker: Broker,
    vhost_name: str,
    name: str,
    *,
    partitions: int | None = None,
    binding_keys: list[str] | None = None,
    arguments: dict[str, Any] | None = None,
) -> list[str]:
    vhost = get_vhost(broker, vhost_name)
    if partitions is not None and binding_keys is not None:
        raise BadRequest("Specify partitions or binding keys, not both")
    return superstream.add(vhost, name, partitions=partitions, binding_keys=binding_keys,
                           arguments=stream_arguments(arguments or {}))


def delete_super_stream(broker: Broker, vhost_name: str, name: str) -> list[str]:
    vhost = get_vhost(broker, vhost_name)
    exchange = vhost.exchanges.get(name)
    if exchange is None or not superstream.is_super_stream(exchange.arguments):
        raise NotFound(f"The super stream {name} does not exist")
    return superstream.delete(vhost, name)


def super_stream_view(vhost: VHost, exchange: superstream.SuperStreamExchange) -> dict[str, Any]:
    partitions = []
    for index, (key, queue) in enumerate(exchange.partition_keys()):
        item: dict[str, Any] = {"name": queue.name, "binding_key": key, "partition_index": index,
                                "messages": queue.message_count}
        if queue.type == "stream":
            extras = views.stream_extras(queue, "")
            for field in ("first_offset", "last_offset", "committed_offset", "segments", "bytes"):
                item[field] = extras[field]
        partitions.append(item)
    return {"name": exchange.name, "vhost": vhost.name, "arguments": views.jsonable(
        exchange.arguments), "partitions": partitions}


def super_streams(vhost: VHost) -> list[dict[str, Any]]:
    return [
        super_stream_view(vhost, x)
        for x in vhost.exchanges.values()
        if isinstance(x, superstream.SuperStreamExchange)
    ]


# -- status, restart, offsets -----------------------------------------------------------------


def committed_chunk_id(stream: StreamQueue) -> int:
    """The first offset of the last committed chunk of records (-1 if none)."""
    committed = stream.log.committed_offset
    directory = Path(stream.log.directory)
    for segment in reversed(stream.log.summary()["segments"]):
        index = directory / segment["file"].replace(".segment", ".index")
        try:
            entries = list(inspect.dump_index(index))
        except (OSError, ValueError, StorageError):
            continue
        for entry in reversed(entries):
            if entry["chunk_type"] in STREAM_CHUNK_TYPES and entry["first_offset"] <= committed \
                    and entry["num_records"]:
                return int(entry["first_offset"])
    return -1


def tracking_rows(stream: StreamQueue) -> list[dict[str, Any]]:
    tracking = stream.log.tracking()
    rows = [{"type": "sequence", "reference": n.decode("utf-8", "replace"), "value": v}
            for n, v in tracking.publishers.items()]
    rows += [{"type": "offset", "reference": n.decode("utf-8", "replace"), "value": v}
             for n, v in tracking.consumers.items() if v >= 0]
    return rows


def status(stream: StreamQueue, node: str) -> dict[str, Any]:
    """stream_status: one row per member (here: the writer), and the tracking rows."""
    summary = stream.log.summary()
    readers = sum(1 for c in stream.consumers if c.state is not None and c.state.reader)
    local = {
        "role": "writer",
        "node": node,
        "epoch": _EPOCHS.get(stream, 1),
        "offset": summary["last_offset"],
        "committed_offset": summary["committed_offset"],
        "committed_chunk_id": committed_chunk_id(stream),
        "first_offset": summary["first_offset"],
        "readers": readers,
        "segments": len(summary["segments"]),
        "lag": 0,
    }
    # a replicated stream (broker/cluster/stream_replication.py): this node's row with its
    # role and the commit point, and the rows of the other members it knows; one node's: local
    return {
        "members": stream.replication.member_rows(local),
        "tracking": tracking_rows(stream),
    }


def restart(stream: StreamQueue, node: str) -> str:
    """restart_stream on one node: store offsets, close the log, reopen it (recovering it as at
    boot), and move every active consumer's reader to just after what it was last given."""
    stream.restart()
    _EPOCHS[stream] = _EPOCHS.get(stream, 1) + 1
    return node


def reset_offset(broker: Broker, vhost_name: str, stream_name: str, reference: str) -> None:
    if len(reference.encode("utf-8")) > 255:
        raise BadRequest("The reference is too long")
    stream = stream_of(broker, vhost_name, stream_name)
    name = reference.encode("utf-8")
    stored = stream.stored_offset(name)
    if stored is None or stored < 0:
        raise BadRequest("There is no stored offset for this reference, no need to reset")
    stream.reset_offset(name)


def publishers(stream: StreamQueue) -> list[dict[str, Any]]:
    """Named publishers (x-stream-publisher-name) and their last stored publishing id."""
    return [
        {"queue": {"name": stream.name, "vhost": stream.vhost.name}, "stream": stream.name,
         "vhost": stream.vhost.name, "reference": n.decode("utf-8", "replace"),
         "last_publishing_id": stream.last_publishing_id(n)}
        for n in stream.log.tracking().publishers
    ]


def stored_offsets(stream: StreamQueue) -> list[dict[str, Any]]:
    return [
        {"stream": stream.name, "vhost": stream.vhost.name,
         "reference": n.decode("utf-8", "replace"), "stored_offset": v}
        for n, v in stream.log.tracking().consumers.items() if v >= 0
    ]


def groups(stream: Any) -> list[dict[str, Any]]:
    """The stream's single-active-consumer groups and their members, in join order. A
    member's `offset_lag` is the committed offset minus its last delivered offset; the
    group's is its active member's (0 while none is active). `offset_lag_details` carries
    the lag's rate of change per second, which the rates middleware fills in."""
    out = []
    committed = stream.log.committed_offset
    for reference, members in stream.groups.groups.items():
        shown = [_member(m, committed) for m in members]
        out.append({
            "vhost": stream.vhost.name,
            "stream": stream.name,
            "reference": reference,
            "partition_index": stream.partition_index(),
            "consumers": len(members),
            "offset_lag": _group_lag(members, committed),
            "offset_lag_details": {"rate": 0.0},
            "members": shown,
        })
    return out


def group_lags(stream: StreamQueue) -> dict[str, int]:
    """Each single-active-consumer group's offset lag (its active member's), by reference."""
    committed = stream.log.committed_offset
    return {reference: _group_lag(members, committed)
            for reference, members in stream.groups.groups.items()}


def _lag(consumer: Consumer, committed: int) -> int:
    cursor = consumer.state
    return max(0, committed - cursor.delivered) if cursor is not None else 0


def _group_lag(members: Iterable[Consumer], committed: int) -> int:
    for member in members:
        if member.state is not None and member.state.active:
            return _lag(member, committed)
    return 0


def _member(consumer: Consumer, committed: int) -> dict[str, Any]:
    channel = consumer.sink
    session = getattr(channel, "session", None)
    cursor = consumer.state
    return {
        "subscription_id": consumer.tag,
        "connection_name": (views.connection_name(session) if session is not None
                            else getattr(channel, "connection_name", "")),
        "node": getattr(channel, "node", None) or (
            session.broker.config.node_name if session is not None else ""),
        "channel": getattr(channel, "number", 0),
        "state": "active" if cursor is not None and cursor.active else "inactive",
        "offset": max(0, cursor.delivered) if cursor is not None else 0,
        "offset_lag": _lag(consumer, committed),
    }
