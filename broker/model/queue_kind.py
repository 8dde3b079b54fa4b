"""Queue kinds: what a queue type decides before a queue exists, and the registry of them.

A `QueueKind` is one queue type as a declaration sees it: its name (the `x-queue-type`), how
it validates a new queue's flags and arguments with RabbitMQ's texts, whether a redeclaration
is equivalent to the queue that exists, and how it builds a queue (`create`). Classic queues
(classic_kind.py), streams (stream_kind.py) and quorum queues (quorum_kind.py) are kinds; the
composition root (broker.py)
registers them in one `QueueKinds`, which every vhost asks. Adding a queue type is one more
module and one registration: the vhost and the argument tables stay as they are.

`DeclareRules` holds the rules RabbitMQ applies to any type it knows (args.py's catalogue,
and the flags a replicated type refuses): a declaration of a type RabbitMQ knows but a broker
does not register (none in broker.py today; unit tests make such brokers) is validated by them
first, then refused as an unsupported queue type.

It must not know the vhost, the session, the cluster or I/O: a kind builds a queue for the
`QueueOwner` it is given (queue.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from leveret.broker.model import args as qargs
from leveret.broker.model import equivalence
from leveret.broker.model.errors import PreconditionFailed

if TYPE_CHECKING:
    from leveret.broker.model.equivalence import QueueAttrs
    from leveret.broker.model.fields import FieldTable
    from leveret.broker.model.queue import Queue, QueueOwner


class DeclareRules:
    """RabbitMQ's declare-time rules for the queue type `name`, from args.py's catalogue:
    the generic argument validators (check_declare_arguments) and the equivalence of the
    arguments this type keeps. A kind extends them with its own checks."""

    server_named = True  # whether "" asks the server to name the queue (not for a stream)
    # RabbitMQ's replicated types (quorum queues, streams) are durable, not exclusive and not
    # auto-delete: their declarations are refused otherwise, and a vhost's default type of
    # this kind does not apply to such a declaration (is_compatible)
    durable_only = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.module = qargs.QUEUE_TYPE_MODULES.get(name, name)  # RabbitMQ's, for its texts
        self.declare_keys = qargs.QUEUE_TYPE_ARGS.get(name, ())

    def check_server_named(self) -> None:
        """Refuse a server-named declaration where the type cannot have one."""
        if not self.server_named:
            raise PreconditionFailed(f"Cannot declare a server-named queue for type {self.module}")

    def validate_arguments(self, rs: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                           arguments: FieldTable) -> None:
        """A new queue's flags and arguments, after the vhost's checks of the DLX: the typed
        validators, then the keys of other types, then a durable-only type's flags (RabbitMQ's
        order: rabbit_amqqueue checks the arguments before the type's declare)."""
        qargs.check_queue_args(arguments, self.name, rs)
        if self.durable_only:
            check_durable_only(rs, durable=durable, exclusive=exclusive, auto_delete=auto_delete)

    def is_compatible(self, *, durable: bool, exclusive: bool, auto_delete: bool) -> bool:
        """Whether a declaration with these flags may be of this type (RabbitMQ's
        is_compatible, which decides where a vhost's default queue type applies)."""
        return not self.durable_only or (durable and not exclusive and not auto_delete)

    def check_equivalence(self, existing: QueueAttrs, durable: bool, auto_delete: bool,
                          arguments: FieldTable) -> None:
        """A redeclaration of `existing` (a queue of this type) must match it."""
        equivalence.check_queue(existing, durable, auto_delete, arguments, self.declare_keys)


def check_durable_only(rs: str, *, durable: bool, exclusive: bool, auto_delete: bool) -> None:
    """rabbit_queue_type_util's checks of a replicated type's flags, in RabbitMQ's order."""
    if auto_delete:
        raise PreconditionFailed(f"invalid property 'auto-delete' for {rs}")
    if exclusive:
        raise PreconditionFailed(f"invalid property 'exclusive-owner' for {rs}")
    if not durable:
        raise PreconditionFailed(f"invalid property 'non-durable' for {rs}")


class QueueKind(Protocol):
    """One implemented queue type: its declare rules, and how it builds a queue."""

    name: str
    module: str
    server_named: bool

    def check_server_named(self) -> None: ...

    def is_compatible(self, *, durable: bool, exclusive: bool, auto_delete: bool) -> bool: ...

    def validate_arguments(self, rs: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                           arguments: FieldTable) -> None: ...

    def check_equivalence(self, existing: QueueAttrs, durable: bool, auto_delete: bool,
                          arguments: FieldTable) -> None: ...

    def create(self, owner: QueueOwner, name: str, *, durable: bool, exclusive_owner: object,
               auto_delete: bool, arguments: FieldTable, storage_id: str | None) -> Queue:
        """A queue whose declaration was checked (`storage_id`: its files, when it had some
        before, at boot or on another node of a cluster)."""
        ...


class QueueKinds:
    """The queue types this broker implements, by name."""

    def __init__(self, kinds: Iterable[QueueKind] = ()) -> None:
        self.kinds: dict[str, QueueKind] = {}
        for kind in kinds:
            self.register(kind)

    def register(self, kind: QueueKind) -> None:
        self.kinds[kind.name] = kind

    def declared(self, arguments: FieldTable, rs: str) -> QueueKind | DeclareRules:
        """The type a declaration names by `x-queue-type` (classic when absent): its kind, or
        RabbitMQ's rules for a type it knows that is not implemented here. Raises for a value
        that is not a string or names no type RabbitMQ knows."""
        name = qargs.queue_type_of(arguments, rs)
        return self.rules(name)

    def rules(self, name: str) -> QueueKind | DeclareRules:
        """The declare rules of the type `name`: its kind's, when it is implemented."""
        kind = self.kinds.get(name)
        return kind if kind is not None else DeclareRules(name)

    def implemented(self, name: str, rs: str) -> QueueKind:
        """The kind that builds queues of type `name`, or RabbitMQ's refusal."""
        kind = self.kinds.get(name)
        if kind is None:
            raise PreconditionFailed(
                f"invalid arg 'x-queue-type' for {rs}: \"unsupported queue type '{name}'\""
            )
        return kind

    def __getitem__(self, name: str) -> QueueKind:
        """The kind of a type already checked (KeyError if it is not implemented here)."""
        return self.kinds[name]

    def __contains__(self, name: object) -> bool:
        return name in self.kinds
