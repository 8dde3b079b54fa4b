"""A virtual host: its exchanges, queues and bindings, and routing between them.

Declarations, deletions and bindings follow RabbitMQ's rules and raise domain errors with its
texts; routing follows exchange-to-exchange bindings and alternate exchanges with cycle
protection, so each queue gets a message at most once. Who may do what is checked by the
session before it calls in here. A queue declaration runs the checks every type shares here
and asks the type's `QueueKind` (queue_kind.py, registered by the composition root) for the
rest and to build the queue; no type's own rule is written here. A declaration that names no
type gets the vhost's default type (default_type.py). Single-threaded; no I/O.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any

from leveret.broker.model import args as qargs
from leveret.broker.model import dedup, default_type, equivalence
from leveret.broker.model.binding import Binding
from leveret.broker.model.classic_kind import ClassicKind
from leveret.broker.model.deadletter import (
    dead_lettered_copy,
    is_cycle,
    routing_keys_of,
    string_list,
)
from leveret.broker.model.delayed_log import TYPE as DELAYED_LOG
from leveret.broker.model.delayed_log import DelayedLogs, OwnLogs, hidden
from leveret.broker.model.errors import (
    AccessRefused,
    BrokerError,
    InternalError,
    NotFound,
    PreconditionFailed,
    resource,
)
from leveret.broker.model.exchange import Exchange
from leveret.broker.model.exchange_types import exchange_class
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.policy import Policy, effective
from leveret.broker.model.queue import Queue
from leveret.broker.model.queue_kind import QueueKinds
from leveret.broker.model.replication import ONE_NODE
from leveret.broker.model.scheduler import Scheduler
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.superstream_exchange import (
    SuperStreamExchange,
    check_exchange_arguments,
    is_super_stream,
)
from leveret.broker.model.x_delay import held_delay
from leveret.storage import StorageError

PREDECLARED = (
    ("", "direct"),  # the default exchange: routing to it is by queue name, see route()
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
DEFAULT_EXCHANGE_TEXT = "operation not permitted on the default exchange"

Authorize = Callable[[str, str, str], None]  # (permission, resource kind, name); raises


def allow_all(_permission: str, _kind: str, _name: str) -> None:
    return None


def server_generated_name(prefix: str) -> str:
    """`amq.gen-` / `amq.ctag-` + 22 base64url characters of 16 random bytes."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


class Observer:
    """Told about durable changes, so a metadata store can record them (no-op here)."""

    def exchange_declared(self, exchange: Exchange) -> None: ...
    def exchange_deleted(self, exchange: Exchange) -> None: ...
    def queue_declared(self, queue: Queue) -> None: ...
    def queue_deleted(self, queue: Queue) -> None: ...
    def queue_removed(self, queue: Queue) -> None:
        """Any queue left the model (durable or not, however it went): the cluster's hook."""

    def exchange_removed(self, exchange: Exchange) -> None:
        """Any exchange left the model (an auto-delete one with its last binding too)."""
    def binding_added(self, binding: Binding) -> None: ...
    def binding_removed(self, binding: Binding) -> None: ...
    def policy_set(self, vhost: VHost, policy: Policy) -> None: ...
    def policy_cleared(self, vhost: VHost, policy: Policy) -> None: ...


class VHost:
    def __init__(
        self,
        name: str,
        scheduler: Scheduler,
        queue_kinds: QueueKinds | None = None,
        observer: Observer | None = None,
        default_queue_type: str = default_type.FALLBACK,
        exchange_env: StorageEnv | None = None,
        delayed_logs: DelayedLogs | None = None,
    ) -> None:
        self.name = name
        # where exchanges that keep messages (delayed exchanges) keep them; None: none may
        self.exchange_env = exchange_env
        # where a delayed exchange's log is: its own (one node), or the topology's (a cluster)
        self.delayed_logs: DelayedLogs = delayed_logs or OwnLogs()
        self.scheduler = scheduler
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        # the queue types it may hold (the composition root's; in-memory classic queues alone
        # for a vhost made on its own, as in unit tests)
        self.queue_kinds = queue_kinds or QueueKinds([ClassicKind()])
        # the type of a declaration that names none (default_type.py): set by whoever keeps
        # the vhost's metadata (a registered kind's name)
        self.default_queue_type = default_queue_type
        self.observer = observer or Observer()
        self.policies: dict[str, Policy] = {}
        for name_, type_ in PREDECLARED:
            cls = exchange_class(type_)
            assert cls is not None
            self.exchanges[name_] = cls(self.name, name_, durable=True)

    def rs(self, kind: str, name: str) -> str:
        return resource(kind, name, self.name)

    # -- exchanges ----------------------------------------------------------------------------

    def exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange '{name}' in vhost '{self.name}'")
        return exchange

    def declare_exchange(
        self,
        name: str,
        type_: str,
        *,
        passive: bool = False,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
        check: Authorize = allow_all,
    ) -> Exchange:
        """RabbitMQ's order: type, default exchange, permission, then reserved names."""
        arguments = arguments or {}
        existing = self.check_exchange_declaration(
            name, type_, passive=passive, durable=durable, auto_delete=auto_delete,
            internal=internal, arguments=arguments, check=check)
        if existing is not None:
            return existing
        return self.add_exchange(name, type_, durable=durable, auto_delete=auto_delete,
                                 internal=internal, arguments=arguments)

    def add_exchange(self, name: str, type_: str, *, durable: bool, auto_delete: bool,
                     internal: bool, arguments: dict[str, Any]) -> Exchange:
        """Create and record an exchange whose declaration was checked
        (check_exchange_declaration)."""
        exchange = self.create_exchange(name, type_, durable=durable, auto_delete=auto_delete,
                                        internal=internal, arguments=arguments)
        if durable:
            try:
                self.observer.exchange_declared(exchange)
            except BrokerError:  # not recorded (a full disk): it does not exist
                del self.exchanges[name]
                raise
        return exchange

    def check_exchange_declaration(
        self,
        name: str,
        type_: str,
        *,
        passive: bool = False,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any],
        check: Authorize = allow_all,
    ) -> Exchange | None:
        """Every check of a declaration, raising as declare_exchange does; the existing
        (equivalent) exchange, or None when a new one may be created."""
        if passive:
            if name == "":
                raise AccessRefused(DEFAULT_EXCHANGE_TEXT)
            return self.exchange(name)
        qargs.check_nesting(arguments, self.rs("exchange", name))
        cls = exchange_class(type_)
        if cls is None:  # a channel error since RabbitMQ 3.13 (3.10: 503, on the connection)
            raise PreconditionFailed(f"unknown exchange type '{type_}'")
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_TEXT)
        check("configure", "exchange", name)
        existing = self.exchanges.get(name)
        if existing is not None:
            equivalence.check_exchange(existing, self.rs("exchange", name), type_, durable,
                                       auto_delete, internal, arguments)
            return existing
        if name.startswith("amq."):
            raise AccessRefused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        ae = arguments.get("alternate-exchange")
        if "alternate-exchange" in arguments and not qargs.is_str(ae):  # void too
            raise PreconditionFailed(
                f"invalid type '{qargs.erlang_type(ae)}' for arg 'alternate-exchange' in "
                f"{self.rs('exchange', name)}"
            )
        if ae is not None:
            check("read", "exchange", name)
            check("write", "exchange", qargs.text(ae))
        dedup.from_arguments(arguments, self.rs("exchange", name), self.scheduler.now_ms)
        check_exchange_arguments(arguments, self.rs("exchange", name))
        cls.validate(arguments)
        return None

    def create_exchange(self, name: str, type_: str, *, durable: bool, auto_delete: bool,
                        internal: bool, arguments: dict[str, Any]) -> Exchange:
        """Add an exchange whose declaration was checked (not recorded: the caller does)."""
        cls = exchange_class(type_, arguments)
        assert cls is not None
        if type_ == "direct" and is_super_stream(arguments):
            cls = SuperStreamExchange
        exchange = cls(
            self.name,
            name,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        exchange.dedup = dedup.from_arguments(arguments, self.rs("exchange", name),
                                              self.scheduler.now_ms)
        try:
            exchange.opened(self)
        except StorageError as exc:  # its files cannot be created (a full disk)
            raise InternalError(f"cannot create {self.rs('exchange', name)}: {exc}") from None
        self.exchanges[name] = exchange
        return exchange

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        exchange = self.check_exchange_delete(name, if_unused)
        if exchange is not None:
            self._remove_exchange(exchange)

    def check_exchange_delete(self, name: str, if_unused: bool = False) -> Exchange | None:
        """The checks of delete_exchange; the exchange to delete, None if there is none."""
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_TEXT)
        if name.startswith("amq."):
            raise AccessRefused(f"deletion of system {self.rs('exchange', name)} not allowed")
        exchange = self.exchanges.get(name)
        if exchange is not None and if_unused and exchange.bindings:
            raise PreconditionFailed(f"{self.rs('exchange', name)} in use")
        return exchange

    def remove_exchange(self, name: str) -> None:
        """Drop an exchange and its bindings, with no checks (the cluster's topology says so)."""
        exchange = self.exchanges.get(name)
        if exchange is not None and name != "":
            self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        for key in list(exchange.bindings):
            binding = exchange.remove(key)
            if binding is not None and exchange.durable:
                self.observer.binding_removed(binding)
        self._remove_bindings_to(exchange)
        if exchange.durable:
            self.observer.exchange_deleted(exchange)
        exchange.removed()
        self.observer.exchange_removed(exchange)

    def _remove_bindings_to(self, destination: object) -> None:
        for source in list(self.exchanges.values()):
            for binding in source.bindings_to(destination):
                self._unbind(binding)

    def remove_binding(self, source_name: str, kind: str, destination_name: str,
                       routing_key: str, arguments: dict[str, Any]) -> None:
        """Remove a binding with no checks (the cluster's topology says so); an auto-delete
        source goes with its last binding, as with unbind."""
        source = self.exchanges.get(source_name)
        table: dict[str, Any] = self.queues if kind == "queue" else self.exchanges
        destination = table.get(destination_name)
        if source is None or destination is None:
            return
        binding = source.bindings.get(Binding(source, destination, routing_key, arguments).key)
        if binding is not None:
            self._unbind(binding)

    def _unbind(self, binding: Binding) -> None:
        source = binding.source
        source.remove(binding.key)
        if source.durable and getattr(binding.destination, "durable", False):
            self.observer.binding_removed(binding)
        if source.auto_delete and not source.bindings and source.name in self.exchanges:
            self._remove_exchange(source)

    # -- queues -------------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue '{name}' in vhost '{self.name}'")
        return queue

    @staticmethod
    def check_exclusive(queue: Queue, owner: object, strict: bool = False) -> None:
        owned_elsewhere = queue.exclusive_owner is not None and queue.exclusive_owner is not owner
        if owned_elsewhere or (strict and queue.exclusive_owner is not owner):
            raise equivalence.exclusive_locked(queue.resource)

    def declare_queue(
        self,
        name: str,
        *,
        owner: object,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        check: Authorize = allow_all,
    ) -> Queue:
        arguments = dict(arguments or {})
        if passive:
            queue = self.queue(name)
            self.check_exclusive(queue, owner)
            queue.touch()
            return queue
        name, queue_type, existing = self.check_queue_declaration(
            name, owner=owner, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
            arguments=arguments, check=check)
        if existing is not None:
            existing.touch()
            return existing
        return self.add_queue(name, queue_type, durable=durable and not exclusive,
                              exclusive_owner=owner if exclusive else None,
                              auto_delete=auto_delete, arguments=arguments)

    def add_queue(self, name: str, queue_type: str, *, durable: bool, exclusive_owner: Any,
                  auto_delete: bool, arguments: dict[str, Any]) -> Queue:
        """Create and record a queue whose declaration was checked (check_queue_declaration)."""
        queue = self.create_queue(name, queue_type, durable=durable,
                                  exclusive_owner=exclusive_owner, auto_delete=auto_delete,
                                  arguments=arguments)
        if queue.durable:
            try:
                self.observer.queue_declared(queue)
            except BrokerError:  # not recorded (a full disk): it does not exist, nor its files
                del self.queues[name]
                queue.on_delete()
                raise
        return queue

    def check_queue_declaration(
        self,
        name: str,
        *,
        owner: object,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any],
        check: Authorize = allow_all,
    ) -> tuple[str, str, Queue | None]:
        """Every check of a (not passive) declaration, raising as declare_queue does: the
        name (generated for ""), the queue type, and the existing (equivalent) queue or None
        when a new one may be created. `arguments` gets the vhost's default type in place
        when it names none (default_type.complete), so the caller creates what was checked."""
        rs = self.rs("queue", name or "amq.gen")
        qargs.check_nesting(arguments, rs)
        default_type.complete(arguments, self.default_queue_type, self.queue_kinds,
                              durable=durable, exclusive=exclusive, auto_delete=auto_delete)
        kind = self.queue_kinds.declared(arguments, rs)
        if name == "":
            kind.check_server_named()
            name = server_generated_name("amq.gen-")
        elif name.startswith("amq."):
            raise AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        check("configure", "queue", name)
        exclusive_owner = owner if exclusive else None
        durable = durable and not exclusive
        existing = self.queues.get(name)
        if existing is not None:
            self.check_exclusive(existing, exclusive_owner, strict=True)
            self.queue_kinds.rules(existing.type).check_equivalence(existing, durable,
                                                                    auto_delete, arguments)
            return name, kind.name, existing
        rs = self.rs("queue", name)
        # RabbitMQ's channel checks the DLX's type and permissions before the queue type
        # validates its arguments.
        dlx = arguments.get("x-dead-letter-exchange")
        if dlx is not None and not qargs.is_str(dlx):
            raise PreconditionFailed(
                f"invalid type '{qargs.erlang_type(dlx)}' for arg 'x-dead-letter-exchange' in {rs}"
            )
        if dlx is not None:
            check("read", "queue", name)
            check("write", "exchange", qargs.text(dlx))
        kind.validate_arguments(rs, durable=durable, exclusive=exclusive,
                                auto_delete=auto_delete, arguments=arguments)
        dedup.from_arguments(arguments, rs, self.scheduler.now_ms)
        self.queue_kinds.implemented(kind.name, rs)
        return name, kind.name, None

    def create_queue(self, name: str, queue_type: str, *, durable: bool, exclusive_owner: object,
                     auto_delete: bool, arguments: dict[str, Any],
                     storage_id: str | None = None) -> Queue:
        """Add a queue whose declaration was checked (not recorded: the caller does)."""
        kind = self.queue_kinds[queue_type]  # checked by check_queue_declaration (or etcd's)
        try:
            queue = kind.create(self, name, durable=durable, exclusive_owner=exclusive_owner,
                                auto_delete=auto_delete, arguments=arguments,
                                storage_id=storage_id or None)
        except StorageError as exc:  # its files cannot be created (a full disk)
            raise InternalError(f"cannot create {self.rs('queue', name)}: {exc}") from None
        queue.dedup = dedup.from_arguments(arguments, queue.resource, self.scheduler.now_ms)
        self.queues[name] = queue
        return queue

    def restore_queue(self, name: str, queue_type: str, *, auto_delete: bool,
                      arguments: dict[str, Any], storage_id: str | None) -> Queue:
        """Recreate a durable queue from the metadata store at boot."""
        kind = self.queue_kinds[queue_type]  # checked by check_queue_declaration (or etcd's)
        queue = kind.create(self, name, durable=True, exclusive_owner=None,
                            auto_delete=auto_delete, arguments=arguments,
                            storage_id=storage_id or None)
        queue.dedup = dedup.from_arguments(arguments, queue.resource, self.scheduler.now_ms)
        self.queues[name] = queue
        return queue

    def delete_queue(self, queue: Queue) -> int:
        current = self.queues.get(queue.name)
        if current is None or current is not queue:
            return 0
        count = queue.count_on_delete
        del self.queues[queue.name]
        self._remove_bindings_to(queue)
        queue.on_delete()
        if queue.durable:
            self.observer.queue_deleted(queue)
        self.observer.queue_removed(queue)
        return count

    # -- policies -----------------------------------------------------------------------------

    def policy_for(self, kind: str, name: str, queue_type: str | None = None) -> Policy | None:
        """The policy of a queue or exchange (`queue_type`: a queue's, when it is not in
        the vhost yet)."""
        queue = self.queues.get(name) if kind == "queues" else None
        if queue_type is None:
            queue_type = queue.type if queue is not None else "stream"
        return effective(self.policies, kind, queue_type, name)

    def set_policy(self, policy: Policy) -> None:
        self.policies[policy.name] = policy
        self.observer.policy_set(self, policy)
        self._policies_changed()

    def clear_policy(self, name: str) -> bool:
        policy = self.policies.pop(name, None)
        if policy is None:
            return False
        self.observer.policy_cleared(self, policy)
        self._policies_changed()
        return True

    def _policies_changed(self) -> None:
        for queue in list(self.queues.values()):
            queue.policy_changed()

    # -- bindings -----------------------------------------------------------------------------

    def _destination(self, kind: str, name: str) -> Any:
        return self.queue(name) if kind == "queue" else self.exchange(name)

    def bind(
        self,
        source_name: str,
        kind: str,
        destination_name: str,
        routing_key: str,
        arguments: dict[str, Any] | None = None,
        owner: object = None,
    ) -> None:
        binding = self.check_bind(source_name, kind, destination_name, routing_key, arguments,
                                  owner)
        source = binding.source
        if source.add(binding) and source.durable and getattr(binding.destination, "durable",
                                                              False):
            try:
                self.observer.binding_added(binding)
            except BrokerError:  # not recorded (a full disk)
                source.remove(binding.key)
                raise

    def check_bind(
        self,
        source_name: str,
        kind: str,
        destination_name: str,
        routing_key: str,
        arguments: dict[str, Any] | None = None,
        owner: object = None,
    ) -> Binding:
        """The checks of bind, raising as it does; the binding it would add."""
        if source_name == "" or (kind == "exchange" and destination_name == ""):
            raise AccessRefused(DEFAULT_EXCHANGE_TEXT)
        source = self.exchange(source_name)
        destination = self._destination(kind, destination_name)
        if kind == "queue":
            if hidden(destination):  # a delayed exchange's log takes what it holds only
                raise NotFound(f"no queue '{destination_name}' in vhost '{self.name}'")
            self.check_exclusive(destination, owner)
        arguments = dict(arguments or {})
        qargs.check_nesting(arguments, self.rs(kind, destination_name))
        source.check_binding(routing_key, arguments)
        return Binding(source, destination, routing_key, arguments)

    def unbind(
        self,
        source_name: str,
        kind: str,
        destination_name: str,
        routing_key: str,
        arguments: dict[str, Any] | None = None,
        owner: object = None,
    ) -> None:
        """Remove a binding. As RabbitMQ (`absent_errs_only`), a missing source, destination
        or binding is not an error, and exclusivity is checked only for a binding that exists."""
        binding = self.check_unbind(source_name, kind, destination_name, routing_key, arguments,
                                    owner)
        if binding is not None:
            self._unbind(binding)

    def check_unbind(
        self,
        source_name: str,
        kind: str,
        destination_name: str,
        routing_key: str,
        arguments: dict[str, Any] | None = None,
        owner: object = None,
    ) -> Binding | None:
        """The checks of unbind; the binding it would remove, or None."""
        if source_name == "" or (kind == "exchange" and destination_name == ""):
            raise AccessRefused(DEFAULT_EXCHANGE_TEXT)
        source = self.exchanges.get(source_name)
        table: dict[str, Any] = self.queues if kind == "queue" else self.exchanges
        destination = table.get(destination_name)
        if source is None or destination is None:
            return None
        qargs.check_nesting(arguments or {}, self.rs(kind, destination_name))
        binding = source.bindings.get(
            Binding(source, destination, routing_key, dict(arguments or {})).key
        )
        if binding is None:
            return None
        if kind == "queue":
            self.check_exclusive(destination, owner)
        return binding

    # -- routing ------------------------------------------------------------------------------

    def route(self, exchange: Exchange, message: InboundMessage) -> list[Queue]:
        """Every queue the message goes to, each once."""
        return self._route(exchange, message)[0]

    def route_run(self, exchange: Exchange, message: InboundMessage) -> list[Queue] | None:
        """`route` for the first message of a run whose every message has the same exchange,
        routing key and headers: the queues each of them goes to; None when an exchange on
        the way routes by a message's properties, so that each must be routed alone."""
        queues, by_properties = self._route(exchange, message)
        return None if by_properties else queues

    def _route(self, exchange: Exchange, message: InboundMessage,
               holders: list[Exchange] | None = None) -> tuple[list[Queue], bool]:
        """The queues, and whether an exchange that routes by properties was on the way.
        `holders` given (a publish): a delayed exchange reached on the way, wherever (the one
        published to, through an exchange-to-exchange binding, as an alternate exchange),
        that holds the message (its x-delay) is put there and routes nothing now, as the
        plugin's route answers no queues for it; each once. Not given (a held message
        falling due, a dead letter): every exchange routes at once."""
        headers = message.headers
        keys: str | list[str] = message.routing_key
        if "CC" in headers or "BCC" in headers:
            keys = routing_keys_of(message) + string_list(headers.get("BCC"))
        if exchange.name == "":  # (a delayed exchange's log is the broker's: not by name)
            if isinstance(keys, str):
                queue = self.queues.get(keys)
                return ([queue] if queue is not None and queue.type != DELAYED_LOG else []), False
            found = (self.queues.get(key) for key in dict.fromkeys(keys))
            return [queue for queue in found
                    if queue is not None and queue.type != DELAYED_LOG], False
        queues: dict[Queue, None] = {}
        seen: set[int] = set()
        pending = [exchange]
        by_properties = False
        held: bool | None = None  # whether the message is one to hold (known once asked)
        while pending:
            x = pending.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            if x.keeps_messages and holders is not None:
                if held is None:
                    held = held_delay(headers) is not None
                if held:
                    holders.append(x)
                    continue
            by_properties = by_properties or x.routes_by_properties
            destinations = x.route_message(keys, headers, message)
            if not destinations:
                ae = x.alternate_exchange
                if ae is not None and ae in self.exchanges:
                    pending.append(self.exchanges[ae])
                continue
            for destination in destinations:
                if destination.kind == "queue":
                    queues[destination] = None
                else:
                    pending.append(destination)
        return list(queues), by_properties

    def publish(self, exchange: Exchange, message: InboundMessage, confirm: Confirm | None) -> int:
        """Route and enqueue; returns how many queues took it, each delayed exchange on the
        way that holds it counted as one (0 for a duplicate). `confirm` covers the holds."""
        if exchange.dedup is not None and exchange.dedup.seen(message.headers):
            return 0
        holders: list[Exchange] = []
        queues = self._route(exchange, message, holders)[0]
        taken = 0
        for holder in holders:  # it keeps the message to route later (delayed_exchange.py)
            if holder.hold(message, confirm):
                taken += 1
        return taken + self._enqueue_routed(queues, message, confirm)

    def route_held(self, exchange: Exchange, message: InboundMessage,
                   confirm: Confirm | None = None, *, remote_only: bool = False,
                   local: Confirm | None = None) -> int:
        """Route and enqueue with no deduplication or hold (a held message falling due is
        not checked again, nor held again by a delayed exchange on its way: the plugin's
        negative x-delay); returns how many queues took it. `remote_only`: `confirm` waits
        for the queues held by other nodes only, and `local` for this node's replicated ones
        (a quorum queue or stream led here, whose copy is committed once other nodes hold
        it: a delayed exchange's router records a copy as routed only then, but retries
        only what another node refused; a copy in this node's own queue is written with the
        ROUTED record, on the same disk)."""
        return self._enqueue_routed(self.route(exchange, message), message, confirm,
                                    remote_only, local)

    def _enqueue_routed(self, queues: list[Queue], message: InboundMessage,
                        confirm: Confirm | None, remote_only: bool = False,
                        local: Confirm | None = None) -> int:
        """Enqueue a routed message (without its BCC header) to `queues`."""
        if queues and "BCC" in message.headers:
            headers = dict(message.headers)
            del headers["BCC"]
            message = message.replace(headers=headers)
        return self.publish_to(queues, message, confirm, remote_only, local)

    @staticmethod
    def publish_to(queues: list[Queue], message: InboundMessage, confirm: Confirm | None,
                   remote_only: bool = False, local: Confirm | None = None) -> int:
        """Enqueue a routed message; returns how many of `queues` took it."""
        taken = 0
        for queue in queues:
            use = confirm
            if remote_only and not queue.written_elsewhere:
                use = local if _with_peers(queue) else None
            if queue.publish(message, use):
                taken += 1
        return taken

    def dead_letter(self, queue: Queue, entry: QueuedMessage, reason: str,
                    confirm: Confirm | None = None) -> int:
        """Republish a dead-lettered copy to the queue's DLX; the number of queues that took
        it (`confirm`: settled when they all hold it, for at-least-once dead lettering)."""
        dlx_name = getattr(queue, "dlx", None)
        if dlx_name is None:
            return 0
        exchange = self.exchanges.get(dlx_name)
        if exchange is None:
            return 0
        copy = dead_lettered_copy(
            entry.message,
            queue.name,
            reason,
            self.scheduler.now_ms(),
            dlx_name,
            getattr(queue, "dlrk", None),
        )
        taken = 0
        for target in self.route(exchange, copy):
            if not is_cycle(copy, target.name, reason) and target.publish(copy, confirm):
                taken += 1
        return taken


def _with_peers(queue: Queue) -> bool:
    """Whether a message this node writes for `queue` is committed only once other nodes
    hold it (a replicated queue led here)."""
    return getattr(queue, "replication", ONE_NODE) is not ONE_NODE
