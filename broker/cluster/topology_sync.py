"""Applies the cluster's exchanges, queues and bindings from the topology cache to this node's
model, and tells etcd when the model itself lets go of a queue this node holds.

Every node has every exchange, queue and binding of the cluster in its vhosts. A queue whose
record names this node (`record.node`) is a real queue here, made by the vhost's queue factory
(a durable one on its `storage_id` folder, an exclusive one owned by the local session whose
cluster key the record's `exclusive_owner` carries); any other is a `RemoteQueue`. A binding
whose source or destination is missing here is ignored (a binding carries one lease only, so it
can outlive one of its ends). The cache reports changes in revision order, so a binding never
arrives before its ends, and a delete before a redeclare.

The model's own deletions of a queue held here (auto-delete, x-expires, the exclusive owner's
connection gone) reach `queue_removed`; they are carried to etcd with
`delete_queue(if_revision=...)`, so a queue declared again meanwhile is spared. An auto-delete
exchange that loses its last binding leaves every node's model; the node whose lease it carries
deletes it in etcd.

In cluster mode etcd is the source of truth for topology. The local SQLite metastore keeps only
this node's durable queues (vhost, name, type, arguments and `storage_id`): that is how a node
that restarts after a queue of its was deleted elsewhere finds the folder to delete (`loaded`,
after the cache's first load). Exchanges, bindings and policies are not written locally, and
durable queues held by other nodes neither.

It must not know AMQP or the sessions (sessions are opaque owners, found by their key in
`broker.cluster_sessions`). Asyncio: one event loop; the callbacks run in the cache's task and
never raise.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from leveret.broker.cluster import stream_replication
from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.cluster.topology_records import (
    BindingRecord,
    ExchangeRecord,
    QueueRecord,
    Record,
)
from leveret.broker.metadata.store import Metastore, MetastoreError
from leveret.broker.model.binding import Binding
from leveret.broker.model.delayed_log import EXCHANGE_ARG, log_name
from leveret.broker.model.delayed_log import TYPE as DELAYED_LOG
from leveret.broker.model.errors import BrokerError
from leveret.broker.model.exchange import Exchange
from leveret.broker.model.queue import Queue
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.vhost import Observer, VHost
from leveret.broker.process import logs
from leveret.broker.remote.remote_queue import Forwarding, RemoteQueue
from leveret.storage import StorageError

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.process.config import Config

log = logs.get("leveret.cluster.topology")


class NodeRecorder(Observer):
    """The vhosts' observer in cluster mode: the local metastore records this node's durable
    queues only, and every queue the model removes is reported to the sync."""

    def __init__(self, store: Metastore, removed: Callable[[Queue], None],
                 exchange_removed: Callable[[Exchange], None]) -> None:
        self.store = store
        self.removed = removed
        self.exchange_removed_ = exchange_removed

    def queue_declared(self, queue: Queue) -> None:
        if isinstance(queue, RemoteQueue):
            return
        try:
            self.store.put_queue(queue.vhost.name, queue.name, queue.type, queue.auto_delete,
                                 queue.arguments, getattr(queue, "storage_id", None))
        except MetastoreError as exc:
            log.error("metadata write failed", error=str(exc))

    def queue_deleted(self, queue: Queue) -> None:
        if isinstance(queue, RemoteQueue):
            return
        try:
            self.store.delete_queue(queue.vhost.name, queue.name)
        except MetastoreError as exc:
            log.error("metadata write failed", error=str(exc))

    def queue_removed(self, queue: Queue) -> None:
        self.removed(queue)

    def exchange_removed(self, exchange: Exchange) -> None:
        self.exchange_removed_(exchange)


class Node(Protocol):
    """What of the broker this module touches."""

    config: Config
    vhosts: dict[str, VHost]
    metastore: Metastore
    queue_env: StorageEnv
    cluster: ClusterRuntime | None
    forwarder: Forwarding | None  # what the RemoteQueues made here hand their work to
    recorder: Observer
    topology_sync: TopologySync | None
    cluster_sessions: dict[str, Any]


class TopologySync:
    def __init__(self, broker: Node, cluster: ClusterRuntime) -> None:
        self.broker = broker
        self.cluster = cluster
        self.recorder = NodeRecorder(broker.metastore, self._removed_by_model,
                                     self._exchange_removed_by_model)
        self._applying: Queue | None = None  # a removal etcd asked for: not sent back
        self._applying_exchange: str | None = None
        self._replacing = False
        self._tasks: set[asyncio.Task[None]] = set()
        # replicated streams (cluster/stream_replication.py)
        self.replication: stream_replication.StreamReplication | None = None
        self.deleting: dict[tuple[str, str], asyncio.Task[None]] = {}  # model -> etcd deletes
        # this node's durable queues as the local metastore had them at boot
        self._boot_rows = [(row["vhost"], row["name"], row["storage_id"])
                           for row in broker.metastore.rows("queues")]

    def install(self) -> None:
        broker, cache = self.broker, self.cluster.cache
        broker.recorder = self.recorder
        for vhost in broker.vhosts.values():
            vhost.observer = self.recorder
        cache.on_put("exchanges", self._guard(self.exchange_put))
        cache.on_delete("exchanges", self._guard(self.exchange_delete))
        cache.on_put("queues", self._guard(self.queue_put))
        cache.on_delete("queues", self._guard(self.queue_delete))
        cache.on_put("bindings", self._guard(self.binding_put))
        cache.on_delete("bindings", self._guard(self.binding_delete))

    @staticmethod
    def _guard(apply: Callable[[Any], None]) -> Callable[[Record], None]:
        def callback(record: Record) -> None:
            try:
                apply(record)
            except (BrokerError, StorageError, OSError) as exc:
                log.error("cannot apply a topology change", record=repr(record),
                          error=str(exc))
            except Exception:
                log.exception("applying a topology change failed", record=repr(record))
        return callback

    def _vhost(self, name: str) -> VHost | None:
        return self.broker.vhosts.get(name)

    # -- exchanges --------------------------------------------------------------------------------

    def exchange_put(self, record: ExchangeRecord) -> None:
        vhost = self._vhost(record.vhost)
        if vhost is None or record.name == "":
            return
        existing = vhost.exchanges.get(record.name)
        if existing is not None:
            if (existing.type, existing.durable, existing.auto_delete, existing.internal,
                    existing.arguments) == (record.type, record.durable, record.auto_delete,
                                            record.internal, record.arguments):
                return
            self._replace(lambda: vhost.remove_exchange(record.name))
        vhost.create_exchange(record.name, record.type, durable=record.durable,
                              auto_delete=record.auto_delete, internal=record.internal,
                              arguments=dict(record.arguments))
        if existing is not None:
            self._rebind(vhost)

    def _replace(self, remove: Callable[[], object]) -> None:
        """Remove what a changed record replaces: what the model drops with it (an auto-delete
        exchange that loses its bindings) is put back by the rebind, not deleted in etcd."""
        self._replacing = True
        try:
            remove()
        finally:
            self._replacing = False

    def exchange_delete(self, record: ExchangeRecord) -> None:
        vhost = self._vhost(record.vhost)
        if vhost is not None:
            self._applying_exchange = record.name
            try:
                vhost.remove_exchange(record.name)
            finally:
                self._applying_exchange = None
        log_record = self.cluster.cache.queue(record.vhost, log_name(record.vhost, record.name))
        if log_record is not None:
            self._drop_orphan_log(log_record)

    def _drop_orphan_log(self, record: QueueRecord) -> None:
        """A delayed exchange's log whose exchange is gone (deleted, or a transient one whose
        node's lease ended): its leader deletes it in etcd. A failover that re-put the record
        meanwhile brings it back here with the new leader, who deletes it then."""
        if record.type != DELAYED_LOG or record.node != self.cluster.node:
            return
        exchange = record.arguments.get(EXCHANGE_ARG)
        if isinstance(exchange, bytes):
            exchange = exchange.decode()
        if self.cluster.cache.exchange(record.vhost, str(exchange)) is None:
            self._delete_in_etcd(record)

    # -- queues -----------------------------------------------------------------------------------

    def is_local(self, record: QueueRecord) -> bool:
        return record.node == self.cluster.node

    def holds(self, record: QueueRecord) -> bool:
        """A real queue here: this node holds it, or is a member of a replicated stream."""
        if self.replication is not None:
            return bool(self.replication.holds(record))
        return self.is_local(record)

    def queue_put(self, record: QueueRecord) -> None:
        vhost = self._vhost(record.vhost)
        if vhost is None:
            return
        self._drop_orphan_log(record)
        existing = vhost.queues.get(record.name)
        if existing is not None:
            if self._same(existing, record):
                if self.replication is not None:  # restored from the local metastore at boot
                    self.replication.attach(existing, record)
                return
            if self.replication is not None and self.replication.rerole(existing, record):
                return  # a replicated stream's new leader: same log, another role
            self._replace(lambda: self._remove(vhost, existing))
        if self.holds(record):
            queue = self._create_local(vhost, record)
            if queue is not None and self.replication is not None:
                self.replication.attach(queue, record)
        else:
            queue = RemoteQueue(
                vhost, record.name, queue_type=record.type, node=record.node,
                durable=record.durable, auto_delete=record.auto_delete,
                arguments=dict(record.arguments), exclusive_elsewhere=bool(record.exclusive),
                forwarder=self.broker.forwarder)
            vhost.queues[record.name] = queue
        if existing is not None and queue is not None:
            self._rebind(vhost)

    def _same(self, queue: Queue, record: QueueRecord) -> bool:
        if (queue.type, queue.durable, queue.auto_delete, queue.arguments) != (
                record.type, record.durable, record.auto_delete, record.arguments):
            return False
        if isinstance(queue, RemoteQueue):
            return queue.node == record.node and queue.exclusive == record.exclusive and (
                not self.holds(record))  # (add_replica made this node a stream's member)
        if getattr(queue, "role", "") and tuple(getattr(queue, "members", ())) != record.members:
            return False
        return self.holds(record) and (
            not record.durable or getattr(queue, "storage_id", None) == record.storage_id)

    def _create_local(self, vhost: VHost, record: QueueRecord) -> Queue | None:
        owner: Any = None
        if record.exclusive:
            owner = self.broker.cluster_sessions.get(record.exclusive_owner or "")
            if owner is None:  # its connection closed before the record came back
                log.info("deleting an exclusive queue whose connection has closed",
                         queue=record.name, vhost=record.vhost)
                self._delete_in_etcd(record)
                return None
        queue = vhost.create_queue(
            record.name, record.type, durable=record.durable, exclusive_owner=owner,
            auto_delete=record.auto_delete, arguments=dict(record.arguments),
            storage_id=record.storage_id if record.durable else None)
        if queue.durable:
            self.recorder.queue_declared(queue)
        return queue

    def queue_delete(self, record: QueueRecord) -> None:
        vhost = self._vhost(record.vhost)
        if vhost is None:
            return
        queue = vhost.queues.get(record.name)
        if queue is not None:
            self._remove(vhost, queue)

    def _remove(self, vhost: VHost, queue: Queue) -> int:
        """Remove a queue as etcd says (a local one with its storage and consumers)."""
        self._applying = queue
        if self.replication is not None:
            self.replication.detach(queue)
        try:
            return vhost.delete_queue(queue)
        finally:
            self._applying = None

    def remove_local(self, vhost: VHost, queue: Queue) -> int:
        """A queue.delete of this node deleted the record: the model follows at once."""
        return self._remove(vhost, queue)

    # -- the model's own deletions ----------------------------------------------------------------

    def _removed_by_model(self, queue: Queue) -> None:
        if queue is self._applying or isinstance(queue, RemoteQueue):
            return
        record = self.cluster.cache.queue(queue.vhost.name, queue.name)
        if record is not None and self.is_local(record):
            self._delete_in_etcd(record)

    def _delete_in_etcd(self, record: QueueRecord) -> None:
        key = (record.vhost, record.name)
        task = asyncio.get_running_loop().create_task(self._delete_record(record))
        self.deleting[key] = task
        task.add_done_callback(
            lambda done: self.deleting.pop(key, None) if self.deleting.get(key) is done
            else None)

    async def _delete_record(self, record: QueueRecord) -> None:
        """Delete a record this node's model let go of; etcd unreachable: try until it is."""
        while True:
            try:
                await self.cluster.store.delete_queue(record.vhost, record.name,
                                                      if_revision=record.mod_revision)
                return
            except EtcdException as exc:
                log.warning("cannot delete a queue in etcd yet; retrying", queue=record.name,
                            vhost=record.vhost, error=str(exc))
                await asyncio.sleep(1.0)
            except BrokerError as exc:
                log.error("cannot delete a queue in etcd", queue=record.name,
                          vhost=record.vhost, error=str(exc))
                return

    async def deleted(self, vhost: str, name: str) -> None:
        """Return once a deletion of this queue that the model started has reached etcd."""
        task = self.deleting.get((vhost, name))
        if task is not None:
            await asyncio.shield(task)

    # -- bindings ---------------------------------------------------------------------------------

    def _ends(self, vhost: VHost, record: BindingRecord) -> tuple[Any, Any] | None:
        source = vhost.exchanges.get(record.source)
        table: dict[str, Any] = (vhost.queues if record.destination_type == "queue"
                                 else vhost.exchanges)
        destination = table.get(record.destination)
        if source is None or destination is None:
            return None
        return source, destination

    def binding_put(self, record: BindingRecord) -> None:
        vhost = self._vhost(record.vhost)
        ends = self._ends(vhost, record) if vhost is not None else None
        if ends is not None:
            ends[0].add(Binding(ends[0], ends[1], record.routing_key, dict(record.arguments)))

    def binding_delete(self, record: BindingRecord) -> None:
        vhost = self._vhost(record.vhost)
        if vhost is not None:
            vhost.remove_binding(record.source, record.destination_type, record.destination,
                                 record.routing_key, dict(record.arguments))

    def _exchange_removed_by_model(self, exchange: Exchange) -> None:
        """An auto-delete exchange lost its last binding on every node's model alike; the
        node whose lease it carries (its declaring node) deletes it in etcd."""
        if self._replacing or exchange.name == self._applying_exchange or \
                not exchange.auto_delete:
            return
        record = self.cluster.cache.exchange(exchange.vhost, exchange.name)
        lease = self.cluster.membership.lease
        if record is None or lease is None or record.lease != lease.id:
            return
        task = asyncio.get_running_loop().create_task(self._delete_exchange_record(record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_exchange_record(self, record: ExchangeRecord) -> None:
        try:
            await self.cluster.store.delete_exchange(record.vhost, record.name,
                                                     if_revision=record.mod_revision)
        except (EtcdException, BrokerError) as exc:  # it goes with the lease, at worst
            log.warning("cannot delete an auto-delete exchange in etcd", exchange=record.name,
                        vhost=record.vhost, error=str(exc))

    def _rebind(self, vhost: VHost) -> None:
        """An entity was replaced: its bindings (keyed by the old object) are added again."""
        for record in self.cluster.cache.bindings(vhost.name):
            self.binding_put(record)

    # -- boot -------------------------------------------------------------------------------------

    async def loaded(self) -> None:
        """After the cache's first load: what this node held but etcd no longer has goes. A
        durable queue of this node deleted while it was down (its row in the local metastore,
        read before the load, names a folder no queue here uses any more) loses its storage
        and its row; a restored exchange or queue etcd does not know leaves the model."""
        cache = self.cluster.cache
        for vhost in self.broker.vhosts.values():
            for name in list(vhost.exchanges):
                if name and not name.startswith("amq.") and cache.exchange(vhost.name, name) \
                        is None:
                    vhost.remove_exchange(name)
            for queue in list(vhost.queues.values()):
                if cache.queue(vhost.name, queue.name) is None:
                    self._drop_stale(vhost, queue)
        in_use = {getattr(q, "storage_id", None) for vhost in self.broker.vhosts.values()
                  for q in vhost.queues.values() if not isinstance(q, RemoteQueue)}
        metastore = self.broker.metastore
        current = {(row["vhost"], row["name"]): row["storage_id"]
                   for row in metastore.rows("queues")}
        for vhost_name, name, storage_id in self._boot_rows:
            if storage_id is None or storage_id in in_use:
                continue
            log.info("deleting the storage of a queue the cluster deleted while this node "
                     "was down", queue=name, vhost=vhost_name, storage_id=storage_id)
            shutil.rmtree(self.broker.queue_env.directory(storage_id), ignore_errors=True)
            if current.get((vhost_name, name)) == storage_id:
                metastore.delete_queue(vhost_name, name)

    def _drop_stale(self, vhost: VHost, queue: Queue) -> None:
        log.info("deleting a queue the cluster deleted while this node was down",
                 queue=queue.name, vhost=vhost.name)
        self._remove(vhost, queue)


def install(broker: Node) -> None:
    """Register the cache callbacks that keep `broker`'s vhosts in step with etcd."""
    assert broker.cluster is not None
    sync = TopologySync(broker, broker.cluster)
    broker.topology_sync = sync
    sync.install()
    stream_replication.install(broker)  # replicated streams: attached to what the sync makes


async def loaded(broker: Node) -> None:
    """After the cache's first load, before clients are served (see TopologySync.loaded)."""
    if broker.topology_sync is not None:
        await broker.topology_sync.loaded()
