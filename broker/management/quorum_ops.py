"""Quorum queue operations behind `leveret-queues` (RabbitMQ's `rabbitmq-queues`) and the
management API's quorum fields: quorum_status rows in RabbitMQ's columns, peek, the
quorum-critical check, the rebalance of leaders, and a quorum queue's view fields.

How RabbitMQ's Raft figures map onto Leveret's replication (docs/QUORUM-QUEUES.md, "Operating
quorum queues"): a member's log is the replicated log, its offsets the Raft indexes (0-based:
-1 is "none"); `Raft State` is the member's role (leader, or follower for a replica;
`noconnection` for a member whose node is not reached, `noproc` for one the leader does not
know, as RabbitMQ shows a member it cannot ask); every
member counts in the quorum, so `Membership` is `voter`; `Last Log Index` is the log's next
offset - 1 (a replica's: what the leader has from its acknowledgements), `Last Written` what
the log has written and synced by its fsync policy (a replica's: what it acknowledged), `Commit
Index` the commit point (what a majority holds), `Last Applied` the same (the leader serves
what is committed; a replica applies its log when it takes over), `Snapshot Index` the last
offset the member's last snapshot covers (broker/model/snapshot.py: a snapshot covers the
offsets below its S, so S - 1; -1 before any snapshot; blank for a replica, which takes none
of its own), `Term` the epoch (etcd's leadership key; on one node the log's).

It reads the model and the replication's member rows; no HTTP, no links, no etcd.
Single-threaded: runs on the broker's event loop.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from leveret.broker.model.durable import PagedStore
from leveret.broker.model.store import LeveledStore

COLUMNS = ["Node Name", "Raft State", "Membership", "Last Log Index", "Last Written",
           "Last Applied", "Commit Index", "Snapshot Index", "Term"]
TYPE_MODULES = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue",
                "stream": "rabbit_stream_queue"}
DEFAULT_DELIVERY_LIMIT = 20
PAYLOAD_MAX = 64  # peek shows the first 64 bytes of the body, as RabbitMQ does
# the AMQP 0-9-1 basic properties in RabbitMQ's order (the 'P_basic' record's fields); pamqp's
# name where it differs
BASIC_PROPERTIES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                    "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                    ("type", "message_type"), "user_id", "app_id", "cluster_id")


class Refused(Exception):
    """A refused operation: RabbitMQ's text, the HTTP status, and RabbitMQ's reason word."""

    def __init__(self, text: str, status: int = 400, reason: str = "") -> None:
        super().__init__(text)
        self.text = text
        self.status = status
        self.reason = reason


def not_found_text(vhost: str, name: str) -> str:
    return f"queue '{name}' was not found in virtual host '{vhost}'"


def printable(vhost: str, name: str, queue_type: str) -> dict[str, str]:
    """A queue as RabbitMQ's health checks list it (amqqueue:to_printable)."""
    return {"readable_name": f"queue '{name}' in vhost '{vhost}'", "name": name,
            "virtual_host": vhost, "type": TYPE_MODULES.get(queue_type, queue_type)}


# -- quorum_status ------------------------------------------------------------------------------


def local_row(queue: Any, node: str) -> dict[str, Any]:
    """This node's member row, in the replication's member-row keys (`member_rows`)."""
    log = queue.log
    tail_epoch = log.tail[0] if log.next_offset else log.epoch
    return {"role": "writer", "node": node, "epoch": max(tail_epoch, log.epoch),
            "offset": log.next_offset - 1, "committed_offset": log.committed_offset,
            "written": log.committed_offset, "first_offset": log.first_offset, "lag": 0,
            "snapshot_index": snapshot_index(queue)}


def snapshot_index(queue: Any) -> int:
    """The last offset the queue's last snapshot covers (its S - 1); -1 before any."""
    covers = getattr(queue, "snapshot_covers", None)
    return covers - 1 if isinstance(covers, int) else -1


def member_rows(queue: Any, node: str) -> list[dict[str, Any]]:
    """Every member's row as this node knows them (the leader knows each replica's)."""
    return list(queue.replication.member_rows(local_row(queue, node)))


def status_rows(rows: list[dict[str, Any]], members: Sequence[str],
                running: set[str]) -> list[dict[str, Any]]:
    """RabbitMQ's quorum_status rows, one per member (sorted by node, as RabbitMQ sorts)."""
    by_node = {str(row.get("node")): row for row in rows}
    out: list[dict[str, Any]] = []
    for node in sorted(set(members) | set(by_node)):
        row = by_node.get(node)
        if row is None or node not in running:  # (RabbitMQ's erpc reasons)
            out.append({"Node Name": node,
                        "Raft State": "noconnection" if node not in running else "noproc",
                        **{c: "" for c in COLUMNS[2:]}})
            continue
        last = _index(row.get("offset"))
        commit = _index(row.get("committed_offset"))
        out.append({
            "Node Name": node,
            "Raft State": "follower" if row.get("role") == "replica" else "leader",
            "Membership": "voter",
            "Last Log Index": last,
            "Last Written": _index(row.get("written", row.get("offset"))),
            "Last Applied": commit,
            "Commit Index": commit,
            "Snapshot Index": _index(row.get("snapshot_index")),
            "Term": row.get("epoch") if row.get("epoch") is not None else "",
        })
    return out


def _index(value: object) -> int | str:
    return value if isinstance(value, int) else ""


# -- peek ---------------------------------------------------------------------------------------


def ready(queue: Any) -> Iterator[Any]:
    """The queue's ready messages in delivery order (the requeued ones, then strict
    priorities, FIFO in each), read without taking them: a paged level's tail comes from the
    log."""
    store = queue.messages
    levels = store.stores() if isinstance(store, LeveledStore) else [store]
    for level in levels:
        yield from level
        if isinstance(level, PagedStore):
            yield from queue.tail_of(level)


def peek(queue: Any, position: int) -> list[tuple[str, Any]] | None:
    """The message at `position` (1: the next one to be delivered), as RabbitMQ's peek shows
    it; None if there is no message there."""
    for i, entry in enumerate(ready(queue), 1):
        if i == position:
            counts = getattr(queue, "recovered_counts", {}).get(entry.store_ref)
            return message_fields(entry, counts[0] if counts else entry.delivery_count)
    return None


def message_fields(entry: Any, delivery_count: int) -> list[tuple[str, Any]]:
    """RabbitMQ's peek rows (rabbit_basic:peek_fmt_message): the properties that are set,
    last first, then the routing keys, the exchange and the payload's first 64 bytes, then
    each header as `header.NAME`, with `x-delivery-count` last."""
    message = entry.message
    props = message.properties
    headers = dict(getattr(props, "headers", None) or {})
    headers.pop("x-delivery-count", None)
    headers["x-delivery-count"] = delivery_count
    payload = bytes(message.body)[:PAYLOAD_MAX].decode("utf-8", "replace")
    rows: list[tuple[str, Any]] = []
    for field in BASIC_PROPERTIES:
        name, attribute = field if isinstance(field, tuple) else (field, field)
        if name == "headers":
            continue
        value = getattr(props, attribute, None)
        if value is not None and not (name == "cluster_id" and value == ""):  # (pamqp's unset)
            rows.insert(0, (name, _plain(value)))
    return [*rows, ("routing_keys", [message.routing_key]), ("exchange", message.exchange),
            ("payload (max 64 bytes)", payload),
            *((f"header.{key}", _plain(value)) for key, value in headers.items())]


def _plain(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return int(value.replace(tzinfo=value.tzinfo or datetime.UTC).timestamp())
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# -- the quorum-critical check ------------------------------------------------------------------


def critical(node: str, placed: list[tuple[str, str, str, tuple[str, ...]]],
             running: set[str]) -> list[dict[str, str]]:
    """The replicated queues (vhost, name, type, members) with a member on `node` that would
    lose their quorum if it stopped: at most a bare majority of their members is up
    (rabbit_quorum_queue:filter_quorum_critical), a one-member queue on `node` included."""
    out = []
    for vhost, name, queue_type, members in placed:
        if node not in members:
            continue
        up = sum(1 for m in members if m in running)
        if up <= len(members) // 2 + 1:
            out.append(printable(vhost, name, queue_type))
    return out


# -- rebalance ----------------------------------------------------------------------------------

COUNT_COLUMNS = {"quorum": "Number of quorum queues", "stream": "Number of streams"}


async def rebalance(queues: list[tuple[Any, str, str, tuple[str, ...], int]],
                    running: set[str],
                    transfer: Callable[[Any, str], Awaitable[str | None]]
                    ) -> list[dict[str, Any]]:
    """RabbitMQ's rebalance (rabbit_amqqueue:rebalance): `queues` are (handle, type, leader,
    members, length); while a node leads more than its share (the queues over the running
    nodes, rounded up), its shortest queue not yet tried moves to the member leading the
    fewest (`transfer`: the new leader, or None if it did not move). The rows: each node with
    its count per type."""
    by_node: dict[str, list[list[Any]]] = {}
    for handle, queue_type, leader, members, length in queues:
        by_node.setdefault(leader, []).append([length, handle, False, queue_type, members])
    for entries in by_node.values():
        entries.sort(key=lambda e: e[0])
    share = math.ceil(len(queues) / max(1, len(running))) if queues else 0
    moved = True
    while moved:
        moved = False
        for node in sorted(by_node):
            entries = by_node[node]
            if len(entries) <= share or entries[0][2]:
                continue
            entry = entries.pop(0)
            entry[2] = True
            candidates = [m for m in entry[4] if m != node and m in running]
            destination = min(candidates, key=lambda m: (len(by_node.get(m, [])), m),
                              default=None)
            new_leader = await transfer(entry[1], destination) if destination else None
            by_node.setdefault(new_leader or node, []).append(entry)
            moved = True
            break
    rows = []
    for node in sorted(by_node):
        row: dict[str, Any] = {"Node name": node}
        for queue_type, column in COUNT_COLUMNS.items():
            count = sum(1 for e in by_node[node] if e[3] == queue_type)
            if count:
                row[column] = count
        rows.append(row)
    return rows


# -- a quorum queue's fields in the management API ----------------------------------------------


def delivery_limit(queue: Any) -> int | str:
    """The delivery limit the queue applies (its argument and policy resolved as RabbitMQ 4.3
    resolves them: broker/model/quorum.py); "unlimited" when it has none, as RabbitMQ 4.3."""
    limit = getattr(queue, "delivery_limit", DEFAULT_DELIVERY_LIMIT)
    return limit if isinstance(limit, int) else "unlimited"


def quorum_extras(queue: Any, node: str, members: Sequence[str] | None,
                  online: Sequence[str] | None) -> dict[str, Any]:
    """rabbit_quorum_queue:format/2's fields: `node` and `leader` the leader, `members`
    sorted, `online` the members whose node runs, `state` running, minority (no majority
    online) or down (none, or not the leader); the delivery limit (RabbitMQ 4.x's); the dead
    letters held until their targets confirm them (at-least-once: `messages_dlx`,
    `message_bytes_dlx`); `messages_ram` and `message_bytes_ram` 0, as RabbitMQ 4.x reports."""
    listed = sorted(members) if members else [node]
    up = sorted(m for m in (online if online is not None else listed) if m in listed)
    if len(up) < len(listed) // 2 + 1:
        state = "down" if not up else "minority"
    else:
        state = "running" if node in up else "down"
    extras: dict[str, Any] = {"leader": node, "members": listed, "online": up, "state": state,
                              "messages_dlx": len(getattr(queue, "dead_letters", ())),
                              "message_bytes_dlx": int(getattr(queue, "dead_letters_bytes", 0)),
                              "messages_ram": 0, "message_bytes_ram": 0}
    if hasattr(queue, "delivery_limit"):
        extras["delivery_limit"] = delivery_limit(queue)
    if hasattr(queue, "delayed_retry"):  # RabbitMQ 4.3's
        extras["delayed_retry"] = str(queue.delayed_retry or "disabled")
        extras["messages_delayed"] = len(queue.retrying)
        if queue.retrying:
            extras["next_delayed_at"] = min(at for at, _seq, _entry in queue.retrying)
    return extras
