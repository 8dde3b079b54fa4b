"""A vhost's default queue type (RabbitMQ's `default_queue_type`): the values that name one,
and what it does to a declaration that names no type.

RabbitMQ 4.x gives every vhost a default queue type, set when the vhost is created or updated
(the HTTP API, definitions, `rabbitmqctl`), else the node's own (`default_queue_type` in
rabbitmq.conf), else classic. A queue.declare without `x-queue-type` gets it written into its
arguments, unless the type cannot hold such a queue: an exclusive, auto-delete or non-durable
declaration stays classic (`rabbit_amqqueue:augment_declare_args`). Redeclarations are compared
with those completed arguments, so the default shapes them as it shapes a first declaration.

Pure functions over an arguments table and the registered kinds; it must not know HTTP, the
metadata store, the config or the session (they pass values in and map InvalidDefaultType).
"""

from __future__ import annotations

import json

from leveret.broker.model import args as qargs
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.fields import FieldTable
from leveret.broker.model.queue_kind import QueueKinds

FALLBACK = "classic"  # RabbitMQ's rabbit_queue_type:fallback()
UNSET = (None, "undefined")  # RabbitMQ reads these (and JSON null) as "no default given"


class InvalidDefaultType(PreconditionFailed):
    """A value that names no queue type this broker runs (RabbitMQ 4.3's texts; a 400 in the
    management API, a failed import in definitions)."""


def parse(value: object, kinds: QueueKinds) -> str | None:
    """A default_queue_type as the HTTP API or definitions give it, checked as RabbitMQ 4.3's
    validate_default_queue_type: None when none is given (absent, null, "undefined"), else the
    type's name (`quorum` for "quorum" or "rabbit_quorum_queue")."""
    if value in UNSET:
        return None
    if value == "":
        raise InvalidDefaultType("default_queue_type must not be an empty string")
    if not isinstance(value, str | bool):
        raise InvalidDefaultType(f"{json.dumps(value)} is not a valid default_queue_type value")
    given = json.dumps(value) if isinstance(value, bool) else value
    by_module = {module: name for name, module in qargs.QUEUE_TYPE_MODULES.items()}
    name = by_module.get(given, given)
    if name not in qargs.QUEUE_TYPE_MODULES:
        raise InvalidDefaultType(f"{given} is not a valid queue type")
    if name not in kinds:
        raise InvalidDefaultType(f"queue type {given} is not enabled")
    return name


def complete(arguments: FieldTable, default: str, kinds: QueueKinds, *, durable: bool,
             exclusive: bool, auto_delete: bool) -> None:
    """Write `default` into a declaration's arguments (in place) when they name no type and
    the type may hold a queue with these flags. A classic default writes nothing: RabbitMQ
    3.10 leaves such arguments as they are, and a missing x-queue-type means classic."""
    if "x-queue-type" in arguments or default == FALLBACK:
        return
    if kinds.rules(default).is_compatible(durable=durable, exclusive=exclusive,
                                          auto_delete=auto_delete):
        arguments["x-queue-type"] = default
