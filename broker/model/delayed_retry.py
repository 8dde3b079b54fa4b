"""Delayed retry of a quorum queue's returned messages, as RabbitMQ 4.3 has it.

`x-delayed-retry-type` (`disabled`, `all`, `failed`, `returned`), `x-delayed-retry-min` and
`x-delayed-retry-max` (milliseconds), or the policy keys `delayed-retry-type`, `-min` and
`-max`: a returned message that the type covers becomes available again only after
`min(min * delivery_count, max)` ms (a delivery count of 0 counts as 1). `failed` covers a
failed delivery (basic.reject with requeue, a consumer's channel closed), `returned` the other
returns (basic.nack with requeue, basic.recover, a consumer timeout), `all` both.

Resolution (rabbit_quorum_queue:get_delayed_retry_config/1): the policy's type wins over the
argument; min and max are the lower of the argument and the policy; a type other than the
three, or no valid min, is `disabled`; a missing or invalid max is min. The arguments are not
checked at declaration (RabbitMQ's declare_args have no validator for them); the policy keys
are, with RabbitMQ's texts (`policy_errors`).

It must not know queues, AMQP or the log: the quorum queue (quorum.py) holds the messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leveret.broker.model.binding import erlang_term

TYPES = ("all", "failed", "returned")


@dataclass(frozen=True)
class DelayedRetry:
    type: str  # all, failed or returned
    min_ms: int
    max_ms: int

    def delays(self, delivery_failed: bool) -> bool:
        """Whether a return of this kind waits before the message is ready again."""
        return self.type == "all" or (self.type == "failed") == delivery_failed

    def ready_at(self, now_ms: int, delivery_count: int) -> int:
        return now_ms + min(self.min_ms * max(1, delivery_count), self.max_ms)

    def __str__(self) -> str:
        """As the management API shows it (rabbit_quorum_queue:fmt_delayed_retry/1)."""
        return f"{self.type} (min: {self.min_ms}ms, max: {self.max_ms}ms)"


def _text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _positive(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _lower(argument: object, policy: object) -> object:
    """`fun min/2` over what is set (an invalid value is then refused by the caller)."""
    if argument is None:
        return policy
    if policy is None:
        return argument
    both = (_positive(argument), _positive(policy))
    if None in both:
        return argument if both[0] is None else policy  # Erlang orders numbers first
    return min(both)  # type: ignore[type-var]


def resolve(arguments: dict[str, Any], policy: dict[str, Any]) -> DelayedRetry | None:
    """The queue's delayed retry from its arguments and its policy's definition; None when
    it is disabled."""
    kind = _text(policy.get("delayed-retry-type"))
    if kind is None:
        kind = _text(arguments.get("x-delayed-retry-type"))
    if kind not in TYPES:
        return None
    low = _positive(_lower(arguments.get("x-delayed-retry-min"),
                           policy.get("delayed-retry-min")))
    if low is None:
        return None
    high = _positive(_lower(arguments.get("x-delayed-retry-max"),
                            policy.get("delayed-retry-max")))
    return DelayedRetry(kind, low, high if high is not None else low)


def policy_errors(definition: dict[str, Any]) -> str | None:
    """RabbitMQ's validation text for a policy's delayed-retry keys, or None if they are fine
    (rabbit_quorum_queue:validate_policy/1)."""
    kind = definition.get("delayed-retry-type")
    low = definition.get("delayed-retry-min")
    high = definition.get("delayed-retry-max")
    if kind is not None and _text(kind) not in (*TYPES, "disabled"):
        return (f"{erlang_term(kind)} is not a valid delayed retry type. Must be one of: "
                "all, failed, returned, disabled")
    for key, value, word in (("delayed-retry-min", low, "minimum"),
                             ("delayed-retry-max", high, "maximum")):
        if key in definition and _positive(value) is None:
            return (f"{erlang_term(value)} is not a valid delayed retry {word} delay. Must be "
                    "a positive integer")
    if kind is not None and _text(kind) != "disabled" and low is None:
        return f"delayed-retry-min is required when delayed-retry-type is {_text(kind)}"
    if low is not None and high is not None and high < low:
        return f"delayed-retry-max ({high}) must not be smaller than delayed-retry-min ({low})"
    return None
