"""Dead-lettering: the x-death bookkeeping RabbitMQ adds to a message it dead-letters.

Given a message, the queue it leaves and the reason (rejected, expired, maxlen), build the
copy to republish: x-death (newest first, one entry per queue and reason, with a count),
x-first-death-* once, x-last-death-* every time, and the expiration moved to
original-expiration. Also RabbitMQ's cycle rule. Pure functions on the message interface.
"""

from __future__ import annotations

import datetime
from typing import Any

from leveret.broker.model.message import InboundMessage


def routing_keys_of(message: InboundMessage) -> list[str]:
    """The routing key plus CC (not BCC), as dead-lettering republishes with."""
    keys = [message.routing_key]
    cc = message.headers.get("CC")
    if isinstance(cc, list):
        keys += [
            k.decode() if isinstance(k, bytes) else k for k in cc if isinstance(k, str | bytes)
        ]
    return keys


def dead_lettered_copy(
    message: InboundMessage, queue_name: str, reason: str, now_ms: int, dlx: str, dlrk: str | None
) -> InboundMessage:
    headers = dict(message.headers)
    deaths: list[Any] = [d for d in headers.get("x-death", []) if isinstance(d, dict)]
    now = datetime.datetime.fromtimestamp(now_ms // 1000, tz=datetime.UTC)
    existing = next(
        (d for d in deaths if d.get("queue") == queue_name and d.get("reason") == reason), None
    )
    if existing is not None:
        deaths.remove(existing)
        entry = dict(existing)
        entry["count"] = int(entry.get("count", 0)) + 1
    else:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": queue_name,
            "time": now,
            "exchange": message.exchange,
            "routing-keys": routing_keys_of(message),
        }
        if message.expiration is not None:
            entry["original-expiration"] = message.expiration
    headers["x-death"] = [entry, *deaths]
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", queue_name)
    headers.setdefault("x-first-death-exchange", message.exchange)
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue_name
    headers["x-last-death-exchange"] = message.exchange
    if dlrk is not None:
        headers.pop("CC", None)  # the copy goes to the dead-letter routing key only
    return message.replace(
        exchange=dlx,
        routing_key=dlrk if dlrk is not None else message.routing_key,
        headers=headers,
        expiration=None,
    )


def is_cycle(message: InboundMessage, target_queue: str, reason: str) -> bool:
    """RabbitMQ drops a dead letter that would come back to a queue it died in, unless a
    `rejected` death lies on the way (a client took part in the cycle)."""
    if reason == "rejected":
        return False
    for death in message.headers.get("x-death", []):
        if not isinstance(death, dict):
            continue
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == target_queue:
            return True
    return False
