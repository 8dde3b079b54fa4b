"""A delayed exchange's log as a queue the replication drives: the held messages of one
delayed exchange, led by one node, replicated as a quorum queue's log is.

On one node the exchange makes its own `DelayedLog` (`OwnLogs`: a one-member log, in the
folder named by a digest of the vhost and exchange name, as before). In a cluster the
topology holds, beside the exchange, a hidden queue record of type `x-delayed-log`
(`log_name`: `amq.delayed.<digest>`), placed as a quorum queue is; every member node makes
a `DelayedLog` through `DelayedLogKind` on its `storage_id` folder, and the cluster's
replication (broker/cluster/stream_replication.py) makes it the leader or a replica
(`took_role`). Nodes that are not members have a `RemoteQueue` under that name; a publish
into the exchange through them is forwarded to the leader as a publish to a queue led
elsewhere is (`TopologyLogs`), and confirmed when a majority of members hold it.

Only the leader (or the one node) routes, only committed entries: a new leader rebuilds the
store's index from its log (what ROUTED records up to the commit point name is skipped) and
routes what is due; a replica keeps no index and routes nothing. Routed copies go through
the exchange (`route_due`), looked up by name in the vhost at the due time.

It must not know the cluster, etcd, AMQP or the session; it is a `LogQueue` (log_queue.py).
Threading: single-threaded, on the event loop.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from leveret.broker.model.delayed_store import FOLDER, TRANSIENT, DelayedStore
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.fields import FieldTable
from leveret.broker.model.leader_wait import WaitingPublishes
from leveret.broker.model.log_queue import MemberAnswers
from leveret.broker.model.message import Confirm, InboundMessage
from leveret.broker.model.queue import Queue, QueueOwner
from leveret.broker.model.queue_kind import DeclareRules
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.x_delay import held_delay

if TYPE_CHECKING:
    from leveret.broker.model.exchange import Exchange
    from leveret.broker.model.scheduler import Timer

TYPE = "x-delayed-log"
PREFIX = "amq.delayed."  # a client cannot declare an amq. queue: the name is the broker's
FOLLOW_MS = 1000  # how often a replica follows the leader's ROUTED records
EXCHANGE_ARG = "x-delayed-log-exchange"  # the hidden record's argument naming its exchange


def digest(vhost: str, name: str) -> str:
    """32 hex digits of the vhost and exchange name (never the name itself: user input)."""
    return hashlib.sha256(f"{vhost}\0{name}".encode()).hexdigest()[:32]


def log_name(vhost: str, exchange: str) -> str:
    """The hidden queue that holds a delayed exchange's log in a cluster's topology."""
    return PREFIX + digest(vhost, exchange)


class Router(Protocol):
    """The delayed exchange, as its log hands it what fell due."""

    def route_due(self, vhost: Any, batch: list[tuple[int, InboundMessage]],
                  log_id: str) -> None: ...


class DelayedLog(MemberAnswers, Queue):
    """One delayed exchange's held messages: a store over a log, led here or replicated."""

    type = TYPE

    def __init__(self, vhost: QueueOwner, name: str, *, env: StorageEnv, directory: Path,
                 exchange: str, storage_id: str, replication: Replication = ONE_NODE,
                 alone: bool = True, **kwargs: Any) -> None:
        super().__init__(vhost, name, **kwargs)
        self.exchange_name = exchange
        self.storage_id = storage_id
        self.replication = replication
        self.alone = alone  # one node's own log: it leads from the start, with no election
        self._follow_timer: Timer | None = None
        self.waiting = WaitingPublishes(vhost.scheduler, self.awaiting_leader, self._send)
        self.store = DelayedStore(vhost.scheduler, env, directory, self._route, name=exchange,
                                  replication=replication, leading=alone)

    # -- what the exchange asks -----------------------------------------------------------

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        """Hold `message` (its x-delay from now) on the leader; a replica forwards it there;
        between two leaders (an election) it waits for the next one, HOLD_MS at most, as a
        quorum queue's publish does (leader_wait.py). The message may have been published
        to another exchange and reached this one through a binding or as an alternate
        exchange: only the vhost's routing hands it here (a client can neither route to the
        log by its name nor bind it: vhost.py). False: no delay to hold it for."""
        if self.waiting or self.awaiting_leader():
            self.waiting.add(message, confirm)
            return True
        return self._send(message, confirm)

    def _send(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        leader = self.replication.forward_to
        if leader is not None:
            return bool(leader.publish(message, confirm))
        delay = held_delay(message.headers)
        if delay is None:
            return False
        self.store.hold(message, self.vhost.scheduler.now_ms() + delay, confirm)
        return True

    def awaiting_leader(self) -> bool:
        """Between two leaders: the leader's node lost and the next leader not known yet,
        or this member between two roles (a one-member log never is)."""
        if self.alone:
            return False
        leader = self.replication.forward_to
        if leader is not None:
            return not leader.reachable()
        role = self.replication.role
        return role == "replica" or (role == "" and bool(self.replication.members))

    def _route(self, batch: list[tuple[int, InboundMessage]]) -> None:
        exchange: Exchange | None = self.vhost.exchanges.get(self.exchange_name)
        route_due = getattr(exchange, "route_due", None)
        if route_due is None:  # the exchange went first: its log goes with it
            for offset, _message in batch:
                self.store.routed_one(offset)
            return
        route_due(self.vhost, batch, self.storage_id)

    # -- the LogQueue the replication drives (log_queue.py) -------------------------------

    @property
    def log(self) -> Any:
        return self.store.log

    @property
    def writer(self) -> Any:
        return self.store.writer

    def dispatch(self) -> None:
        """A replica's commit point moved: it routes nothing, but follows the ROUTED records
        to delete its log's head as the leader does (at most once a second)."""
        if self._follow_timer is None and not self.deleted:
            self._follow_timer = self.vhost.scheduler.call_later(FOLLOW_MS, self._follow)

    def _follow(self) -> None:
        self._follow_timer = None
        bound = self.replication.commit_bound
        if self.deleted or self.store.closed or self.role != "replica" or bound is None:
            return
        self.store.follow_commit(bound)

    def took_role(self) -> None:
        """A leader rebuilds its index from the log and routes what is due; any other role
        drops the index and routes nothing."""
        if self.alone or self.replication.role == "leader":
            self.store.lead()
        else:
            self.store.follow()
        if self.waiting:
            self.waiting.release()  # publishes that waited for a leader: to it now

    # -- a queue nobody consumes ----------------------------------------------------------

    @property
    def message_count(self) -> int:
        return self.store.count

    def get(self, no_ack: bool) -> None:
        return None

    def purge(self) -> int:
        return 0

    def check_consume(self, exclusive: bool) -> None:
        raise PreconditionFailed(f"{self.resource} holds a delayed exchange's messages")

    def commit_pending(self) -> None:
        self.store.commit_pending()

    def close(self) -> None:
        self.waiting.drop()
        if self.deleted:
            return
        if self.durable:
            self.store.close()
        else:  # a transient exchange's log ends with the broker (its record with the lease)
            self.store.destroy()

    def on_delete(self) -> None:
        self.waiting.drop()
        super().on_delete()
        self.store.destroy()


class DelayedLogKind(DeclareRules):
    """The hidden type: made from the topology only (a client's declaration of it is refused
    before any kind is asked: args.py knows no such type)."""

    server_named = False
    durable_only = True

    def __init__(self, env: StorageEnv, replication: Callable[[], Replication]) -> None:
        super().__init__(TYPE)
        self.env = env
        self.replication = replication

    def create(self, owner: QueueOwner, name: str, *, durable: bool, exclusive_owner: object,
               auto_delete: bool, arguments: FieldTable, storage_id: str | None) -> Queue:
        storage_id = storage_id or digest(owner.name, name)
        replication = self.replication()
        exchange = arguments.get(EXCHANGE_ARG, b"")
        if isinstance(exchange, bytes):
            exchange = exchange.decode()
        return DelayedLog(owner, name, env=self.env, directory=self.env.directory(storage_id),
                          exchange=str(exchange), storage_id=storage_id,
                          replication=replication, alone=replication is ONE_NODE,
                          durable=durable, arguments=arguments)


class DelayedLogs(Protocol):
    """Where a delayed exchange's log is: the composition root chooses (one node: the
    exchange's own; a cluster: the hidden queue of the topology)."""

    def opened(self, exchange: Any, vhost: Any) -> DelayedLog | None:
        """The exchange joined `vhost`: its own log, if this port makes one."""
        ...

    def log_for(self, exchange: Any, vhost: Any) -> Queue | None:
        """The queue that holds the exchange's messages now (a DelayedLog, or the
        RemoteQueue of its leader); None: none yet."""
        ...


class OwnLogs:
    """One node: each delayed exchange makes its own one-member log."""

    def opened(self, exchange: Any, vhost: Any) -> DelayedLog | None:
        env = vhost.exchange_env
        folder = digest(vhost.name, exchange.name) if exchange.durable else (
            TRANSIENT + uuid.uuid4().hex)
        return DelayedLog(vhost, log_name(vhost.name, exchange.name), env=env,
                          directory=env.root / FOLDER / folder, exchange=exchange.name,
                          storage_id=folder, durable=exchange.durable)

    def log_for(self, exchange: Any, vhost: Any) -> Queue | None:
        own: Queue | None = exchange.delayed_log
        return own



class TopologyLogs:
    """A cluster: the log is the topology's hidden queue, placed and replicated as a quorum
    queue is; this node may hold a member of it or reach its leader through forwarding."""

    def opened(self, exchange: Any, vhost: Any) -> DelayedLog | None:
        return None

    def log_for(self, exchange: Any, vhost: Any) -> Queue | None:
        queue: Queue | None = vhost.queues.get(log_name(vhost.name, exchange.name))
        return queue


def hidden(queue: object) -> bool:
    """A delayed exchange's log (or the RemoteQueue of its leader): the broker's, not listed
    with the queues nor exported with the definitions."""
    return getattr(queue, "type", None) == TYPE
