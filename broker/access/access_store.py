"""Where administrative writes go: the local metadata store, or the cluster's etcd.

Role: the management API and definitions import call one `AccessStore` for every change of
vhosts, users, permissions and policies (and, for definitions, exchanges, queues and
bindings; super streams, for the management API and the stream protocol), without knowing
which mode the node runs in. `access_store(broker)` gives:

- `LocalAccess` on a single node: `broker.admin`'s operations, as before (the model, then
  SQLite).
- Both: declaring exchanges and queues, and deleting queues and bindings, are written once in
  `AccessStore` (the model's checks and texts, then the topology port, `broker.topology`); only
  `_writing` (the cluster's refusals) differs.
- `ClusterAccess` in cluster mode: the same checks with the same texts (`broker.admin`, and for
  exchanges and queues the model's own declaration checks), then one `TopologyStore` txn in etcd
  (exchanges, queues and bindings through the topology port, `broker.topology`: the declare path
  and placement that AMQP and the stream protocol use), then `ClusterRuntime.settle(revision)`,
  so that the change is applied on every running node (by `cluster.access_sync` and
  `cluster.topology_sync`) before the caller answers. Nothing is written to SQLite. etcd
  unreachable, or this node out of the cluster (its lease lost), raises `TopologyUnavailable`
  (the API's 503): each change is one txn, so nothing is half-written.

Reads (`vhost_metadata`) come from the node's copy: the topology cache in cluster mode.

It must not know HTTP or AMQP. Runs on the broker's event loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, Literal

from leveret.broker.access import admin
from leveret.broker.cluster.etcd import EtcdException, EtcdUnavailable
from leveret.broker.cluster.topology_records import (
    PermissionRecord,
    PolicyRecord,
    UserRecord,
    VHostRecord,
)
from leveret.broker.model import superstream
from leveret.broker.model.errors import (
    AccessRefused,
    BrokerError,
    InternalError,
    NotFound,
    PreconditionFailed,
)
from leveret.broker.model.vhost import DEFAULT_EXCHANGE_TEXT, Authorize, VHost, allow_all
from leveret.broker.topology.port import (
    BindingSpec,
    ExchangeSpec,
    NotSettled,
    OutOfCluster,
    QueueSpec,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.topology.port import TopologyPort


class TopologyUnavailable(BrokerError):
    """The cluster's store (etcd) cannot take a change now; nothing was changed (or, when
    the text says so, the change may have been applied in full)."""


class AccessStore(ABC):
    """Administrative changes, each one all-or-nothing. Creating calls return True when the
    object is new (the API's 201 rather than 204)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @abstractmethod
    async def put_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                        acting_user: str | None = None,
                        default_queue_type: str | None = None) -> bool:
        """Create or update a vhost; `default_queue_type`: a registered type's name, or None
        for the server's (model/default_type.py)."""

    @abstractmethod
    async def delete_vhost(self, name: str) -> None: ...

    @abstractmethod
    async def put_user(self, name: str, *, password: str | None = None,
                       password_hash: str | None = None, hashing_algorithm: str | None = None,
                       tags: object = None) -> bool: ...

    @abstractmethod
    async def delete_user(self, name: str) -> None: ...

    @abstractmethod
    async def set_permissions(self, user: str, vhost: str, configure: object, write: object,
                              read: object) -> bool: ...

    @abstractmethod
    async def clear_permissions(self, user: str, vhost: str) -> None: ...

    @abstractmethod
    async def set_policy(self, vhost: str, name: str, *, pattern: object, definition: object,
                         priority: object = 0, apply_to: object = "all") -> bool: ...

    @abstractmethod
    async def clear_policy(self, vhost: str, name: str) -> None: ...

    @asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        """Around each change: the cluster's refusals as `TopologyUnavailable`."""
        yield

    # -- exchanges and queues: the model's checks and texts, then the topology port ----------

    @property
    def topology(self) -> TopologyPort:
        return self.broker.topology

    async def declare_exchange(self, vhost: str, name: str, body: dict[str, Any],
                               check: Authorize = allow_all) -> bool:
        model = admin.get_vhost(self.broker, vhost)
        type_ = body.get("type")
        if not isinstance(type_, str) or not type_:
            raise admin.BadRequest("exchange type is missing")
        spec = ExchangeSpec(
            name, type_,
            durable=admin.parse_bool(body.get("durable"), False),
            auto_delete=admin.parse_bool(body.get("auto_delete"), False),
            internal=admin.parse_bool(body.get("internal"), False),
            arguments=admin.parse_arguments(body.get("arguments")))
        model.check_exchange_declaration(  # the model's checks and texts, in its order
            name, type_, durable=spec.durable, auto_delete=spec.auto_delete,
            internal=spec.internal, arguments=dict(spec.arguments), check=check)
        async with self._writing():
            return await self.topology.declare_exchange(model, spec)

    async def declare_queue(self, vhost: str, name: str, body: dict[str, Any],
                            check: Authorize = allow_all) -> bool:
        model = admin.get_vhost(self.broker, vhost)
        if not name:
            raise admin.BadRequest("queue names cannot be empty")
        durable = admin.parse_bool(body.get("durable"), False)
        auto_delete = admin.parse_bool(body.get("auto_delete"), False)
        arguments = admin.parse_arguments(body.get("arguments"))
        _name, queue_type, _existing = model.check_queue_declaration(
            name, owner=None, durable=durable, auto_delete=auto_delete, arguments=arguments,
            check=check)
        spec = QueueSpec(name, queue_type, durable=durable, auto_delete=auto_delete,
                         arguments=arguments, new=_existing is None)
        async with self._writing():
            declared = await self.topology.declare_queue(model, spec)
        return declared.created

    @abstractmethod
    async def add_binding(self, vhost: str, source: str, destination_type: str,
                          destination: str, routing_key: object = "", arguments: object = None,
                          check: Authorize = allow_all) -> None: ...

    @abstractmethod
    async def delete_exchange(self, vhost: str, name: str, if_unused: bool = False,
                              check: Authorize = allow_all) -> None: ...

    async def delete_queue(self, vhost: str, name: str, if_unused: bool = False,
                           if_empty: bool = False, check: Authorize = allow_all) -> None:
        """Delete a queue. The conditions are checked here for a queue this node holds; the
        caller checks them for one held elsewhere (it knows its holder's counts)."""
        model = admin.get_vhost(self.broker, vhost)
        queue = model.queue(name)
        check("configure", "queue", name)
        if getattr(queue, "node", self.topology.node) == self.topology.node:
            queue.check_delete(if_unused, if_empty)
        async with self._writing():
            deleted = await self.topology.delete_queue(model, name)
        if deleted is None:
            raise NotFound(f"no queue '{name}' in vhost '{vhost}'")

    async def delete_binding(self, vhost: str, source: str, destination_type: str,
                             destination: str, routing_key: str, arguments: dict[str, Any],
                             check: Authorize = allow_all) -> None:
        model = admin.get_vhost(self.broker, vhost)
        check("write", destination_type, destination)
        check("read", "exchange", source)
        kind: Literal["queue", "exchange"] = "queue" if destination_type == "queue" \
            else "exchange"
        async with self._writing():
            await self.topology.unbind(model, BindingSpec(source, kind, destination,
                                                          routing_key, dict(arguments)))

    @abstractmethod
    async def add_super_stream(self, vhost: str, name: str, *, partitions: int | None = None,
                               binding_keys: list[str] | None = None,
                               names: list[str] | None = None,
                               arguments: dict[str, Any] | None = None,
                               owner: Any = None, check: Authorize = allow_all) -> list[str]:
        """Create a super stream (`superstream.plan`'s checks): its exchange, its partition
        streams and their bindings; the partition names."""

    @abstractmethod
    async def delete_super_stream(self, vhost: str, name: str,
                                  check: Authorize = allow_all) -> list[str]:
        """Delete a super stream's exchange, then its partition streams; their names."""

    @abstractmethod
    def vhost_metadata(self) -> dict[str, tuple[str, list[str]]]:
        """Every vhost's description and tags."""


class LocalAccess(AccessStore):
    """A single node: the model and SQLite, through broker.admin."""

    async def put_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                        acting_user: str | None = None,
                        default_queue_type: str | None = None) -> bool:
        return admin.add_vhost(self.broker, name, description, tags, acting_user,
                               default_queue_type)

    async def delete_vhost(self, name: str) -> None:
        admin.delete_vhost(self.broker, name)

    async def put_user(self, name: str, *, password: str | None = None,
                       password_hash: str | None = None, hashing_algorithm: str | None = None,
                       tags: object = None) -> bool:
        return admin.put_user(self.broker, name, password=password, password_hash=password_hash,
                              hashing_algorithm=hashing_algorithm, tags=tags)

    async def delete_user(self, name: str) -> None:
        admin.delete_user(self.broker, name)

    async def set_permissions(self, user: str, vhost: str, configure: object, write: object,
                              read: object) -> bool:
        return admin.set_permissions(self.broker, user, vhost, configure, write, read)

    async def clear_permissions(self, user: str, vhost: str) -> None:
        admin.clear_permissions(self.broker, user, vhost)

    async def set_policy(self, vhost: str, name: str, *, pattern: object, definition: object,
                         priority: object = 0, apply_to: object = "all") -> bool:
        return admin.set_policy(self.broker, vhost, name, pattern=pattern, definition=definition,
                                priority=priority, apply_to=apply_to)

    async def clear_policy(self, vhost: str, name: str) -> None:
        admin.clear_policy(self.broker, vhost, name)

    async def add_binding(self, vhost: str, source: str, destination_type: str,
                          destination: str, routing_key: object = "", arguments: object = None,
                          check: Authorize = allow_all) -> None:
        admin.add_binding(self.broker, vhost, source, destination_type, destination,
                          routing_key, arguments, check)

    async def delete_exchange(self, vhost: str, name: str, if_unused: bool = False,
                              check: Authorize = allow_all) -> None:
        admin.delete_exchange(self.broker, vhost, name, if_unused, check)

    async def add_super_stream(self, vhost: str, name: str, *, partitions: int | None = None,
                               binding_keys: list[str] | None = None,
                               names: list[str] | None = None,
                               arguments: dict[str, Any] | None = None,
                               owner: Any = None, check: Authorize = allow_all) -> list[str]:
        return superstream.add(admin.get_vhost(self.broker, vhost), name,
                               partitions=partitions, binding_keys=binding_keys, names=names,
                               arguments=arguments, owner=owner)

    async def delete_super_stream(self, vhost: str, name: str,
                                  check: Authorize = allow_all) -> list[str]:
        model = admin.get_vhost(self.broker, vhost)
        _super_exchange(model, name)
        return superstream.delete(model, name)

    def vhost_metadata(self) -> dict[str, tuple[str, list[str]]]:
        return admin.vhost_metadata(self.broker)


class ClusterAccess(AccessStore):
    """Cluster mode: etcd through the topology store, then settle before answering."""

    def __init__(self, broker: Broker, cluster: ClusterRuntime) -> None:
        super().__init__(broker)
        self.cluster = cluster

    @asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        """Refuse at once when this node is out of the cluster; turn etcd's failures into
        TopologyUnavailable with a sentence for the operator."""
        if not self.cluster.membership.in_cluster:
            raise _out_of_cluster()
        try:
            yield
        except OutOfCluster:
            raise _out_of_cluster() from None
        except (EtcdUnavailable, StoreUnavailable) as exc:
            raise _unreachable(exc.endpoints, exc.maybe_applied) from None
        except NotSettled:
            raise _not_settled() from None
        except EtcdException as exc:  # not unavailable: it answered no (a value too large)
            raise InternalError(f"etcd refused the change: {exc}") from None

    async def _settle(self, revision: int) -> None:
        try:
            await self.cluster.settle(revision)
        except TimeoutError:
            raise _not_settled() from None

    # -- vhosts ----------------------------------------------------------------------------------

    async def put_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                        acting_user: str | None = None,
                        default_queue_type: str | None = None) -> bool:
        if not name:
            raise admin.BadRequest("vhost names cannot be empty")
        store = self.cluster.store
        created = self.cluster.cache.vhost(name) is None
        async with self._writing():  # none named: the server's, as RabbitMQ 4.x records it
            revision = await store.put_vhost(VHostRecord(
                name, description or "", tuple(tags or []),
                default_queue_type or self.broker.default_queue_type))
            if created and acting_user is not None and acting_user in self.broker.users.users:
                revision = await store.put_permission(
                    PermissionRecord(acting_user, name, ".*", ".*", ".*"))
        await self._settle(revision)
        return created

    async def delete_vhost(self, name: str) -> None:
        async with self._writing():
            revision = await self.cluster.store.delete_vhost(name)
        if revision is None:
            raise NotFound(f"no vhost '{name}'")
        await self._settle(revision)

    # -- users and permissions ---------------------------------------------------------------

    async def put_user(self, name: str, *, password: str | None = None,
                       password_hash: str | None = None, hashing_algorithm: str | None = None,
                       tags: object = None) -> bool:
        existing = self.broker.users.users.get(name)
        new_hash = admin.user_password_hash(existing, name, password, password_hash,
                                            hashing_algorithm)
        algorithm = admin.algorithm_of(new_hash) if new_hash else admin.SHA256
        record = UserRecord(name, new_hash, algorithm, tuple(admin.parse_tags(tags)))
        async with self._writing():
            revision = await self.cluster.store.put_user(record)
        await self._settle(revision)
        return existing is None

    async def delete_user(self, name: str) -> None:
        async with self._writing():
            revision = await self.cluster.store.delete_user(name)
        if revision is None:
            raise NotFound(f"no user '{name}'")
        await self._settle(revision)

    async def set_permissions(self, user: str, vhost: str, configure: object, write: object,
                              read: object) -> bool:
        permission = admin.check_permissions(self.broker, user, vhost, configure, write, read)
        created = vhost not in self.broker.users.users[user].permissions
        async with self._writing():
            try:
                revision = await self.cluster.store.put_permission(PermissionRecord(
                    user, vhost, permission.configure, permission.write, permission.read))
            except NotFound:  # deleted elsewhere since the check
                raise admin.BadRequest("vhost_or_user_not_found") from None
        await self._settle(revision)
        return created

    async def clear_permissions(self, user: str, vhost: str) -> None:
        async with self._writing():
            revision = await self.cluster.store.delete_permission(user, vhost)
        if revision is None:
            raise NotFound(f"no permissions for user '{user}' in vhost '{vhost}'")
        await self._settle(revision)

    # -- policies ----------------------------------------------------------------------------

    async def set_policy(self, vhost: str, name: str, *, pattern: object, definition: object,
                         priority: object = 0, apply_to: object = "all") -> bool:
        model = admin.get_vhost(self.broker, vhost)
        policy = admin.make_policy(name, pattern=pattern, definition=definition,
                                   priority=priority, apply_to=apply_to)
        created = name not in model.policies
        record = PolicyRecord(vhost, name, policy.pattern, policy.apply_to, policy.priority,
                              dict(policy.definition))
        async with self._writing():
            revision = await self.cluster.store.put_policy(record)
        await self._settle(revision)
        return created

    async def clear_policy(self, vhost: str, name: str) -> None:
        async with self._writing():
            revision = await self.cluster.store.delete_policy(vhost, name)
        if revision is None:
            raise NotFound(f"no policy '{name}' in vhost '{vhost}'")
        await self._settle(revision)

    # -- exchanges, queues, bindings (definitions) -------------------------------------------

    async def add_binding(self, vhost: str, source: str, destination_type: str,
                          destination: str, routing_key: object = "", arguments: object = None,
                          check: Authorize = allow_all) -> None:
        model = admin.get_vhost(self.broker, vhost)
        if destination_type not in ("queue", "exchange"):
            raise admin.BadRequest(f"unknown destination type '{destination_type}'")
        if not isinstance(routing_key, str):
            raise admin.BadRequest("routing_key must be a string")
        check("write", destination_type, destination)
        check("read", "exchange", source)
        spec = BindingSpec(source, "queue" if destination_type == "queue" else "exchange",
                           destination, routing_key, admin.parse_arguments(arguments))
        async with self._writing():
            await self.topology.bind(model, spec)

    async def delete_exchange(self, vhost: str, name: str, if_unused: bool = False,
                              check: Authorize = allow_all) -> None:
        model = admin.get_vhost(self.broker, vhost)
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_TEXT)
        exchange = model.exchange(name)
        check("configure", "exchange", name)
        if name.startswith("amq."):
            raise AccessRefused(f"deletion of system {model.rs('exchange', name)} not allowed")
        if if_unused and exchange.bindings:
            raise PreconditionFailed(f"{model.rs('exchange', name)} in use")
        async with self._writing():
            deleted = await self.topology.delete_exchange(model, name)
        if not deleted:
            raise NotFound(f"no exchange '{name}' in vhost '{vhost}'")

    # -- super streams ------------------------------------------------------------------------

    async def add_super_stream(self, vhost: str, name: str, *, partitions: int | None = None,
                               binding_keys: list[str] | None = None,
                               names: list[str] | None = None,
                               arguments: dict[str, Any] | None = None,
                               owner: Any = None, check: Authorize = allow_all) -> list[str]:
        """The exchange, each partition stream (placed as a queue.declare of a stream is: the
        `balanced` locator unless the arguments name another, members per
        x-initial-cluster-size) and its binding, each through etcd and settled on every node,
        so consecutive partitions see the leaders placed before them. A failure removes what
        was made, then raises."""
        model = admin.get_vhost(self.broker, vhost)
        keys, names, queue_args = superstream.plan(
            model, name, partitions=partitions, binding_keys=binding_keys, names=names,
            arguments=arguments)
        marker = {"x-super-stream": True}
        model.check_exchange_declaration(name, "direct", durable=True, auto_delete=False,
                                         internal=False, arguments=marker, check=check)
        for queue_name in names:
            model.check_queue_declaration(queue_name, owner=None, durable=True,
                                          auto_delete=False, arguments=queue_args, check=check)
        made: list[str] = []  # the partitions made, after the exchange
        exchange_made = False
        try:
            await self.declare_exchange(vhost, name, {"type": "direct", "durable": True,
                                                      "arguments": marker})
            exchange_made = True
            for order, (key, queue_name) in enumerate(zip(keys, names, strict=True)):
                if not await self.declare_queue(vhost, queue_name,
                                                {"durable": True, "arguments": queue_args}):
                    raise PreconditionFailed(f"there is already a queue named {queue_name}")
                made.append(queue_name)
                await self.add_binding(vhost, name, "queue", queue_name, key,
                                       {"x-stream-partition-order": order})
        except BaseException:
            await self._unmake(vhost, name if exchange_made else None, made)
            raise
        return names

    async def _unmake(self, vhost: str, exchange: str | None, queues: list[str]) -> None:
        """Remove what a failed add_super_stream made (what cannot be removed stays)."""
        for queue_name in queues:
            with suppress(BrokerError):
                await self.delete_queue(vhost, queue_name)
        if exchange is not None:
            with suppress(BrokerError):
                await self.delete_exchange(vhost, exchange)

    async def delete_super_stream(self, vhost: str, name: str,
                                  check: Authorize = allow_all) -> list[str]:
        """The exchange (its bindings with it), then each partition stream, through etcd."""
        model = admin.get_vhost(self.broker, vhost)
        exchange = _super_exchange(model, name)
        partitions = [q.name for q in exchange.partitions() if q.type == "stream"]
        await self.delete_exchange(vhost, name, check=check)
        deleted = []
        for queue_name in partitions:
            with suppress(NotFound):  # deleted meanwhile
                await self.delete_queue(vhost, queue_name)
                deleted.append(queue_name)
        return deleted

    def vhost_metadata(self) -> dict[str, tuple[str, list[str]]]:
        return {r.name: (r.description, list(r.tags)) for r in self.cluster.cache.all("vhosts")
                if isinstance(r, VHostRecord)}


def _super_exchange(model: VHost, name: str) -> superstream.SuperStreamExchange:
    exchange = model.exchanges.get(name)
    if not isinstance(exchange, superstream.SuperStreamExchange):
        raise NotFound(f"The super stream {name} does not exist")
    return exchange


def _out_of_cluster() -> TopologyUnavailable:
    return TopologyUnavailable(
        "this node has lost its etcd lease and is not in the cluster; topology "
        "changes are refused until it rejoins")


def _unreachable(endpoints: Sequence[str], maybe_applied: bool) -> TopologyUnavailable:
    outcome = ("the change may or may not have been applied; read it back"
               if maybe_applied else "nothing was changed")
    return TopologyUnavailable(
        f"etcd cannot be reached at {', '.join(endpoints)}; topology changes are refused "
        f"until it is back ({outcome})")


def _not_settled() -> TopologyUnavailable:
    return TopologyUnavailable(
        "the change is stored in etcd but this node's copy did not catch up in time "
        "(is etcd reachable?)")


def access_store(broker: Broker) -> AccessStore:
    """The store for this node's mode."""
    if broker.cluster is not None:
        return ClusterAccess(broker, broker.cluster)
    return LocalAccess(broker)
