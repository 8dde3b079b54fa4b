"""Whether a redeclaration matches what exists: RabbitMQ's equivalence checks and their texts.

A declaration of an existing exchange or queue must agree on its flags and on the arguments
that matter for its type, or it is 406 `inequivalent arg '<field>' for <resource>: received
<new> but current is <old>` (rabbit_misc:assert_args_equivalence). Knows exchanges and queues
by their attributes only (`ExchangeAttrs`, `QueueAttrs`: the model's runtime objects and the
cluster topology's plain records both fit); nothing of vhosts, sessions or I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from leveret.broker.model import args as qargs
from leveret.broker.model.binding import MISSING, describe_pair, equivalent
from leveret.broker.model.errors import PreconditionFailed, ResourceLocked


class ExchangeAttrs(Protocol):
    """What the check reads of an existing exchange."""

    @property
    def type(self) -> str: ...
    @property
    def durable(self) -> bool: ...
    @property
    def auto_delete(self) -> bool: ...
    @property
    def internal(self) -> bool: ...
    @property
    def arguments(self) -> dict[str, Any]: ...


class QueueAttrs(Protocol):
    """What the check reads of an existing queue (`resource`: `queue 'q' in vhost 'v'`)."""

    @property
    def resource(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def durable(self) -> bool: ...
    @property
    def auto_delete(self) -> bool: ...
    @property
    def arguments(self) -> dict[str, Any]: ...


def check_exchange(x: ExchangeAttrs, rs: str, type_: str, durable: bool, auto_delete: bool,
                   internal: bool, arguments: dict[str, Any]) -> None:
    for field, current, received in (
        ("type", x.type, type_),
        ("durable", x.durable, durable),
        ("auto_delete", x.auto_delete, auto_delete),
        ("internal", x.internal, internal),
    ):
        if current != received:
            shown = [str(v).lower() if isinstance(v, bool) else v for v in (received, current)]
            raise PreconditionFailed(
                f"inequivalent arg '{field}' for {rs}: received '{shown[0]}' but current "
                f"is '{shown[1]}'"
            )
    check_arguments(rs, x.arguments, arguments, ("alternate-exchange",))


def check_queue(queue: QueueAttrs, durable: bool, auto_delete: bool,
                arguments: dict[str, Any], keys: Sequence[str] | None = None) -> None:
    """A redeclaration of `queue`: its flags, then `x-queue-type` and the arguments its type
    keeps (`keys`: its kind's; by default, those RabbitMQ lists for `queue.type`)."""
    rs = queue.resource
    for field, current, wanted in (
        ("durable", queue.durable, durable),
        ("auto_delete", queue.auto_delete, auto_delete),
    ):
        if current != wanted:
            raise PreconditionFailed(
                f"inequivalent arg '{field}' for {rs}: received '{str(wanted).lower()}' "
                f"but current is '{str(current).lower()}'"
            )
    current_args = dict(queue.arguments)
    current_args.setdefault("x-queue-type", "classic")
    received = dict(arguments)
    received.setdefault("x-queue-type", "classic")
    if keys is None:
        keys = qargs.QUEUE_TYPE_ARGS.get(queue.type, ())
    ordered = ["x-queue-type"] + [k for k in keys if k != "x-queue-type"]
    check_arguments(rs, current_args, received, ordered)


def check_arguments(rs: str, current: dict[str, Any], received: dict[str, Any],
                    keys: Sequence[str]) -> None:
    for key in keys:
        old, new = current.get(key, MISSING), received.get(key, MISSING)
        if not equivalent(old, new):
            received_text, current_text = describe_pair(new, old)
            raise PreconditionFailed(
                f"inequivalent arg '{key}' for {rs}: received {received_text} but current "
                f"is {current_text}"
            )


def exclusive_locked(resource: str) -> ResourceLocked:
    """405 for a queue that is exclusive to another connection (or a redeclare whose
    exclusive flag differs from the original declaration)."""
    return ResourceLocked(
        f"cannot obtain exclusive access to locked {resource}. It could be originally "
        "declared on another connection or the exclusive property value does not match that "
        "of the original declaration."
    )
