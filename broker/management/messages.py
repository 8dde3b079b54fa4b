"""Taking messages from a queue for the management API's "get" (rabbitmqadmin's `get`).

`take(queue, count, ackmode, encoding)` takes up to `count` messages, shows each as RabbitMQ's
API does (payload as text, or base64 when it is not UTF-8 or when asked), then requeues, acks
or rejects them as `ackmode` says. Used by `/api/queues/{vhost}/{name}/get` on the queue's
holder (this node, or another node asked over the link: `cluster_views`).

It reads the model only; no HTTP. Runs on the broker's event loop.
"""

from __future__ import annotations

import base64
from typing import Any

from leveret.broker.management import views

ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
             "reject_requeue_false")


def take(queue: Any, count: int, ackmode: str, encoding: str) -> list[dict[str, Any]]:
    taken = []
    for _ in range(max(0, count)):
        entry = queue.get(no_ack=False)
        if entry is None:
            break
        taken.append(entry)
    out = [message_view(entry, encoding) for entry in taken]
    for i, item in enumerate(out):
        item["message_count"] = queue.message_count + len(taken) - i - 1
    if ackmode.endswith("requeue_true"):
        queue.requeue(taken)
    else:
        for entry in taken:
            (queue.ack if ackmode.startswith("ack") else queue.reject)(entry)
    return out


def message_view(entry: Any, encoding: str) -> dict[str, Any]:
    message = entry.message
    payload: bytes = bytes(message.body)
    try:
        if encoding == "base64":
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "base64 asked for")
        text, kind = payload.decode("utf-8"), "string"
    except UnicodeDecodeError:
        text, kind = base64.b64encode(payload).decode(), "base64"
    props = {k: views.jsonable(v) for k, v in dict(message.properties).items() if v is not None}
    return {
        "payload_bytes": len(payload),
        "redelivered": bool(entry.redelivered),
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "properties": props,
        "payload": text,
        "payload_encoding": kind,
    }
