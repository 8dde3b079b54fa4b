"""The topology port in a cluster: every change is one etcd txn, settled on every node.

Role: the one declare path of a cluster, whichever front end asks. `declare_queue` places the
queue (`placement.place`), writes its record (a fresh `storage_id` for every declaration: its
identity, and a durable queue's folder), puts leased entities (exclusive, auto-delete,
transient) with this node's lease, runs `TopologyStore.declare_queue`, then waits until every
running node has applied the revision (`ClusterRuntime.settle`). The model follows through
the topology's sync (`cluster.topology_sync`), on every node alike.

What is undone when etcd may have applied a refused change is decided here, once: a queue
declaration whose txn may have been applied is watched in the background (`_undo_later`) and
deleted if it is the one this declaration wrote, so a refused declaration leaves nothing,
for every front end. Other refused changes (exchanges, bindings, deletions) are left as etcd
has them: the front end's text says to read them back.

Every change first hands itself to the event loop (`_own_turn`): a front end may start it
eagerly, outside any task (`session.backlog.start_step`), and etcd's client, its timeouts and
the settling wait belong to the task that goes on with it.

Errors: `StoreUnavailable` (etcd did not answer), `OutOfCluster` (no lease for a leased
entity), `NotSettled` (stored, not applied here in time); the model's errors (406, 405, 404)
pass through with its texts. Anything else etcd refuses (`EtcdException`) passes through.

It must not know AMQP, the stream protocol, HTTP or etcd's wire (the store speaks it).
Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from leveret.broker.cluster import running_nodes
from leveret.broker.cluster.etcd import EtcdException, EtcdUnavailable
from leveret.broker.cluster.runtime import SETTLE_TIMEOUT_S
from leveret.broker.cluster.topology import Created
from leveret.broker.cluster.topology_records import BindingRecord, ExchangeRecord, QueueRecord
from leveret.broker.model import delayed_log
from leveret.broker.model.delayed_exchange import is_delayed
from leveret.broker.process import logs
from leveret.broker.remote.remote_queue import RemoteQueue
from leveret.broker.topology import placement
from leveret.broker.topology.port import (
    BindingSpec,
    DeclaredQueue,
    DeletedQueue,
    ExchangeSpec,
    NotSettled,
    OutOfCluster,
    Placement,
    QueueSpec,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.cluster.topology_sync import TopologySync
    from leveret.broker.model.vhost import VHost

log = logs.get("leveret.cluster.topology")
UNDO_PAUSE_S = 0.5
UNDO_WINDOW_S = 30.0  # how long a refused declaration is watched for once etcd answers


async def _own_turn() -> None:
    """Wait one turn of the event loop, so that what follows runs in the task that awaits
    this, whoever started it."""
    await asyncio.sleep(0)


class ClusterTopology:
    """The etcd implementation of `TopologyPort`."""

    def __init__(self, cluster: ClusterRuntime, sync: TopologySync, locator_setting: str,
                 ) -> None:
        self.cluster = cluster
        self.sync = sync
        self.locator_setting = locator_setting
        self._undoing: set[asyncio.Task[None]] = set()

    @property
    def node(self) -> str:
        return self.cluster.node

    def running_nodes(self) -> set[str]:
        return running_nodes.running_nodes(self.cluster)

    async def place(self, vhost: VHost, spec: QueueSpec) -> Placement:
        await _own_turn()
        return await placement.place(self.cluster, vhost.name, vhost.policies, spec,
                                     self.locator_setting)

    def placements(self, vhost: VHost) -> dict[str, Placement]:
        return {r.name: Placement(r.node, r.members) for r in self.cluster.cache.all("queues")
                if isinstance(r, QueueRecord) and r.vhost == vhost.name}

    async def refresh(self, vhost: VHost, exchanges: Sequence[str] = (),
                      queues: Sequence[str] = ()) -> None:
        """Read from etcd the names the model lacks; return once the cache has applied those
        that exist. etcd unreachable: the model's answer stands."""
        await _own_turn()
        store = self.cluster.store
        revision = 0
        try:
            for name in exchanges:
                if name not in vhost.exchanges:
                    exchange = await store.get_exchange(vhost.name, name)
                    revision = max(revision, exchange.mod_revision if exchange else 0)
            for name in queues:
                if name not in vhost.queues:
                    queue = await store.get_queue(vhost.name, name)
                    revision = max(revision, queue.mod_revision if queue else 0)
        except EtcdException:
            return
        if revision:
            try:
                await self.cluster.cache.wait_for(revision, SETTLE_TIMEOUT_S)
            except TimeoutError:
                raise NotSettled(revision) from None

    # -- queues -------------------------------------------------------------------------------

    async def queue_record(self, vhost: VHost, spec: QueueSpec) -> QueueRecord:
        """The record a declaration writes: placed, with a fresh storage_id."""
        where = await self.place(vhost, spec)
        return QueueRecord(
            vhost.name, spec.name, spec.type, durable=spec.durable and not spec.exclusive,
            auto_delete=spec.auto_delete, exclusive=spec.exclusive,
            arguments=dict(spec.arguments), node=where.node, storage_id=uuid.uuid4().hex,
            owner_node=self.cluster.node if spec.exclusive else None,
            exclusive_owner=spec.owner_key if spec.exclusive else None, members=where.members)

    async def declare_queue(self, vhost: VHost, spec: QueueSpec) -> DeclaredQueue:
        await _own_turn()
        record = await self.queue_record(vhost, spec)
        leased = record.exclusive or record.auto_delete or not record.durable
        lease = self._lease() if leased else 0
        await self.sync.deleted(record.vhost, record.name)  # the model let it go: etcd first
        try:
            result = await self.cluster.store.declare_queue(record, lease)
        except EtcdUnavailable as exc:
            if exc.maybe_applied:
                self._undo_later(record)
            raise StoreUnavailable(tuple(exc.endpoints), exc.maybe_applied) from None
        await self._settle(result.revision)
        return DeclaredQueue(result.record.name,
                             Placement(result.record.node, result.record.members),
                             isinstance(result, Created))

    async def delete_queue(self, vhost: VHost, name: str) -> DeletedQueue | None:
        """Delete the queue as this node's cache knows it (a newer declaration stays); drop
        it from the model at once if this node holds it. None: it was not there."""
        await _own_turn()
        record = self.cluster.cache.queue(vhost.name, name)
        queue = vhost.queues.get(name)
        held = queue if queue is not None and not isinstance(queue, RemoteQueue) else None
        count = held.count_on_delete if held is not None else None  # the sync may drop it first
        async with self._store():
            revision = await self.cluster.store.delete_queue(
                vhost.name, name, if_revision=record.mod_revision if record else 0)
        if revision is None:
            return None
        if held is not None and vhost.queues.get(name) is held:
            count = self.sync.remove_local(vhost, held)
        await self._settle(revision)
        return DeletedQueue(count)

    # -- exchanges and bindings ---------------------------------------------------------------

    async def declare_exchange(self, vhost: VHost, spec: ExchangeSpec) -> bool:
        await _own_turn()
        record = ExchangeRecord(vhost.name, spec.name, spec.type, spec.durable,
                                spec.auto_delete, spec.internal, dict(spec.arguments))
        lease = self._lease() if record.auto_delete or not record.durable else 0
        async with self._store():
            result = await self.cluster.store.declare_exchange(record, lease)
        await self._settle(result.revision)
        if is_delayed(spec.type, spec.arguments):
            await self._declare_delayed_log(vhost, spec)
        return isinstance(result, Created)

    async def _declare_delayed_log(self, vhost: VHost, spec: ExchangeSpec) -> None:
        """A delayed exchange's log: a hidden queue record beside it, placed as a quorum
        queue is (3 members by default, capped at the running nodes), whose leader holds and
        routes the exchange's messages (model/delayed_log.py). A transient exchange's is
        transient too: put with this node's lease, as the exchange is, it goes with it."""
        name = delayed_log.log_name(vhost.name, spec.name)
        if self.cluster.cache.queue(vhost.name, name) is not None:
            return
        await self.declare_queue(vhost, QueueSpec(
            name, delayed_log.TYPE, durable=spec.durable,
            arguments={delayed_log.EXCHANGE_ARG: spec.name}))

    async def delete_exchange(self, vhost: VHost, name: str) -> bool:
        await _own_turn()
        async with self._store():
            revision = await self.cluster.store.delete_exchange(vhost.name, name)
        if revision is None:
            return False
        await self._settle(revision)
        hidden = delayed_log.log_name(vhost.name, name)
        if self.cluster.cache.queue(vhost.name, hidden) is not None:
            async with self._store():
                revision = await self.cluster.store.delete_queue(vhost.name, hidden)
            if revision is not None:
                await self._settle(revision)
        return True

    async def bind(self, vhost: VHost, spec: BindingSpec) -> None:
        await _own_turn()
        async with self._store():
            result = await self.cluster.store.bind(self._binding(vhost, spec))
        await self._settle(result.revision)

    async def unbind(self, vhost: VHost, spec: BindingSpec) -> bool:
        await _own_turn()
        async with self._store():
            revision = await self.cluster.store.unbind(self._binding(vhost, spec))
        if revision is None:
            return False
        await self._settle(revision)
        return True

    @staticmethod
    def _binding(vhost: VHost, spec: BindingSpec) -> BindingRecord:
        return BindingRecord(vhost.name, spec.source, spec.destination_type, spec.destination,
                             spec.routing_key, dict(spec.arguments))

    # -- etcd -----------------------------------------------------------------------------------

    def _lease(self) -> int:
        lease = self.cluster.membership.lease
        if lease is None or not lease.alive:
            raise OutOfCluster()
        return lease.id

    @asynccontextmanager
    async def _store(self) -> AsyncIterator[None]:
        try:
            yield
        except EtcdUnavailable as exc:
            raise StoreUnavailable(tuple(exc.endpoints), exc.maybe_applied) from None

    async def _settle(self, revision: int) -> None:
        try:
            await self.cluster.settle(revision)
        except TimeoutError:
            raise NotSettled(revision) from None

    def _undo_later(self, record: QueueRecord) -> None:
        """A refused declaration's txn may have been applied, now or later (etcd may still
        hold the request): read the key until etcd has answered for UNDO_WINDOW_S, and delete
        the queue if it is the one this declaration wrote (its fresh `storage_id`)."""
        task = asyncio.get_running_loop().create_task(self._undo(record))
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)

    async def _undo(self, record: QueueRecord) -> None:
        store = self.cluster.store
        loop = asyncio.get_running_loop()
        answered_since: float | None = None
        while answered_since is None or loop.time() - answered_since < UNDO_WINDOW_S:
            try:
                found = await store.get_queue(record.vhost, record.name)
                if found is not None and found.storage_id == record.storage_id:
                    await store.delete_queue(record.vhost, record.name,
                                             if_revision=found.mod_revision)
                    log.info("undid a refused queue declaration", queue=record.name,
                             vhost=record.vhost)
                    return
                if found is not None:  # another declaration holds the name: ours cannot apply
                    return
                answered_since = answered_since or loop.time()
            except EtcdException:
                answered_since = None
            await asyncio.sleep(UNDO_PAUSE_S)
