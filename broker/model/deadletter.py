"""Dead-lettering: the x-death bookkeeping RabbitMQ adds to a message it dead-letters.

Given a message, the queue it leaves and the reason (rejected, expired, maxlen), build the
copy to republish: x-death (newest first, one entry per queue and reason, with a count),
x-first-death-* once, x-last-death-* every time, and the expiration moved to
original-expiration. Also RabbitMQ's cycle rule. Pure functions on the message interface.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from leveret.broker.model.message import InboundMessage


def routing_keys_of(message: InboundMessage) -> list[str]:
    """The routing key plus CC (not BCC), as dead-lettering republishes with."""
    return [message.routing_key, *string_list(message.headers.get("CC"))]


def string_list(value: object) -> list[str]:
    """The strings of a CC or BCC header (anything else in it is ignored). A longstr that is
    not UTF-8 cannot equal any name here; it is read with replacement characters, so that it
    can still match a `#` binding."""
    if not isinstance(value, list):
        return []
    return [
        v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        for v in value
        if isinstance(v, str | bytes)
    ]


def _deaths(headers: Mapping[str, Any]) -> list[Any]:
    """The x-death entries of a message; a publisher may have sent anything under that name,
    and what is not an array of tables is ignored, as RabbitMQ does."""
    deaths = headers.get("x-death")
    return [d for d in deaths if isinstance(d, dict)] if isinstance(deaths, list) else []


def dead_lettered_copy(
    message: InboundMessage, queue_name: str, reason: str, now_ms: int, dlx: str, dlrk: str | None
) -> InboundMessage:
    headers = dict(message.headers)
    deaths = _deaths(headers)
    now = datetime.datetime.fromtimestamp(now_ms // 1000, tz=datetime.UTC)
    existing = next(
        (d for d in deaths if d.get("queue") == queue_name and d.get("reason") == reason), None
    )
    if existing is not None:
        deaths.remove(existing)
        entry = dict(existing)
        count = entry.get("count")
        valid = isinstance(count, int) and not isinstance(count, bool)
        entry["count"] = count + 1 if valid and count is not None else 1
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
    for death in _deaths(message.headers):
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == target_queue:
            return True
    return False
