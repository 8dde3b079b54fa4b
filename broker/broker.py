"""The broker's state: configuration, users, vhosts and live connections.

Broker is what every Session shares. It creates the default vhost and user from the config,
answers connection-level questions (server properties, limits) and cleans up after a
connection (its exclusive queues). It does no network I/O itself; `server` runs it.
"""

from __future__ import annotations

import asyncio
import gc
import platform
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from leveret.amqp.stored import decode_record, encode_record, stream_entries_as_records
from leveret.broker.access.auth import HASHING_ALGORITHM, Permission, Users
from leveret.broker.cluster.stream_member import StreamMember
from leveret.broker.metadata.recorder import MetadataRecorder, restore
from leveret.broker.metadata.store import Metastore
from leveret.broker.model import default_type
from leveret.broker.model.classic_kind import ClassicKind
from leveret.broker.model.delayed_log import (
    DelayedLog,
    DelayedLogKind,
    DelayedLogs,
    OwnLogs,
    TopologyLogs,
)
from leveret.broker.model.delayed_store import remove_transient_stores
from leveret.broker.model.durable import DurableClassicQueue
from leveret.broker.model.queue_kind import QueueKinds
from leveret.broker.model.quorum_kind import QuorumKind
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.stream import StreamQueue
from leveret.broker.model.stream_kind import StreamKind
from leveret.broker.model.syncer import SYNCFS_FROM, ThreadSyncer
from leveret.broker.model.vhost import Observer, VHost
from leveret.broker.process import logs
from leveret.broker.process.alarms import Alarms
from leveret.broker.process.config import Config
from leveret.broker.topology.local import LocalTopology
from leveret.storage.openlogs import OpenLogs
from leveret.storage.wal import WriteAheadLog

if TYPE_CHECKING:
    from leveret.broker.cluster.membership import Membership
    from leveret.broker.cluster.peers import ClusterLinks
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.cluster.topology_sync import TopologySync
    from leveret.broker.model.message import InboundMessage
    from leveret.broker.remote.remote_queue import Forwarding
    from leveret.broker.session.connection import Session
    from leveret.broker.topology.port import TopologyPort

VERSION = "0.1.0"
# A full garbage collection after this many closed connections. The cyclic collector is tuned to
# run rarely (server.settle_garbage_collector) and a closed connection leaves a few reference
# cycles (its transport, its wire machine): under connection churn they would pile up.
COLLECT_AFTER_CLOSED = 1000
log = logs.get("leveret.broker")


class AsyncioScheduler:
    """The model's clock and timers, on the running asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_later(delay_ms / 1000, callback)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)


class Broker:
    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop | None = None,
                 queues_locked: bool = False) -> None:
        self.config = config
        self.loop = loop or asyncio.get_event_loop()
        self.scheduler = AsyncioScheduler(self.loop)
        self.users = Users()
        self.vhosts: dict[str, VHost] = {}
        self.connections: set[Session] = set()
        self.login_failures = 0
        # churn, for the metrics: closed ones are these minus those open now
        self.connections_opened_total = 0
        self.channels_opened_total = 0
        self.closed_since_collect = 0
        self.started_at = time.time()
        self.alarm: str | None = None  # "low on memory", "low on disk", ... while an alarm holds
        self.alarm_listeners: list[Callable[[], None]] = []  # told after every alarm change
        self.membership: Membership | None = None  # this node's cluster, in cluster mode
        self.cluster_links: ClusterLinks | None = None  # its links to the other nodes
        self.cluster: ClusterRuntime | None = None  # all of the above, and the topology
        # reaches the queues other nodes hold (broker/remote): set in cluster mode, by server.py
        self.forwarder: Forwarding | None = None
        self.topology_sync: TopologySync | None = None  # etcd's topology into the model
        # where declare, bind and delete go: the model here, etcd once the cluster is composed
        self.topology: TopologyPort = LocalTopology(config.node_name)
        self.instance = uuid.uuid4().hex[:12]  # this process, in cluster-unique session keys
        self.cluster_sessions: dict[str, Session] = {}  # by cluster_key, in cluster mode
        self.alarms = Alarms(config.data_dir, config.vm_memory_high_watermark,
                             config.disk_free_limit_bytes, self.alarm_changed)
        queues_dir = config.data_dir / "queues"
        # the wire layer's record codec: every message the model stores is one it built
        encode = cast("Callable[[InboundMessage], bytes]", encode_record)
        # one cap for the node on logs holding their active files open (storage/openlogs.py)
        self.open_logs = OpenLogs(config.open_logs) if config.open_logs else None
        self.stream_env = StorageEnv(queues_dir, encode, decode_record,
                                     _fsync(config.stream_fsync), stream_entries_as_records,
                                     config.stream_chunk_min_records,
                                     config.stream_chunk_max_records,
                                     config.stream_chunk_max_bytes,
                                     # (the server's flock covers the streams' folders too)
                                     folder_locks=not queues_locked,
                                     open_logs=self.open_logs)
        # fsyncs the queues' logs (under "always") on threads, off the event loop; a round of
        # many logs is one fdatasync of the node's write-ahead log (server.py replays it)
        walled = config.queue_fsync == "always" and config.queue_wal_from > 0
        self.syncer = ThreadSyncer(
            syncfs_from=config.queue_wal_from if walled else SYNCFS_FROM,
            wal=WriteAheadLog(config.data_dir / WAL_FOLDER) if walled else None)
        self.queue_env = StorageEnv(queues_dir, encode, decode_record,
                                    _fsync(config.queue_fsync), syncer=self.syncer,
                                    # the server's flock covers every queue folder
                                    folder_locks=not queues_locked,
                                    open_logs=self.open_logs)
        # the queue types every vhost may hold: adding one is one more registration here
        self.queue_kinds = QueueKinds([
            ClassicKind(self.queue_env),
            StreamKind(self.stream_env, self._stream_replication),
            QuorumKind(self.queue_env, self._stream_replication),
            DelayedLogKind(self.queue_env, self._stream_replication),
        ])
        # where a delayed exchange's log is: its own one-member log on one node; in a cluster
        # a hidden queue of the topology, placed and replicated as a quorum queue's log
        self.delayed_logs: DelayedLogs = TopologyLogs() if config.etcd else OwnLogs()
        # a new vhost's default queue type unless it is given one (RabbitMQ's node-wide
        # default_queue_type); Config.load has checked it
        self.default_queue_type = (default_type.parse(config.default_queue_type,
                                                      self.queue_kinds) or default_type.FALLBACK)
        remove_transient_stores(queues_dir)  # of transient delayed exchanges, after a crash
        self.metastore = Metastore(config.data_dir / "metadata.sqlite3")
        self.recorder: Observer = MetadataRecorder(self.metastore)
        if self.metastore.fresh:
            if not config.etcd:  # a cluster's defaults are made once, in etcd (access_sync)
                self._first_boot()
        else:
            restore(self, self.metastore)

    def _first_boot(self) -> None:
        """An empty data directory gets the default vhost and user, as RabbitMQ does."""
        config = self.config
        self.add_vhost(config.default_vhost)
        if config.default_user:
            self.add_user(config.default_user, config.default_pass, tags=["administrator"])
            self.set_permissions(config.default_user, config.default_vhost, Permission())

    def add_vhost(self, name: str, persist: bool = True,
                  default_queue_type: str | None = None) -> VHost:
        """The vhost `name`, made if there is none: with `default_queue_type` (a registered
        type's name), else the server's, as RabbitMQ 4.x records in a new vhost."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = VHost(
                name,
                self.scheduler,
                queue_kinds=self.queue_kinds,
                observer=self.recorder,
                exchange_env=self.queue_env,
                delayed_logs=self.delayed_logs,
                default_queue_type=default_queue_type or self.default_queue_type,
            )
            self.vhosts[name] = vhost
            if persist and not self.config.etcd:  # in cluster mode vhosts live in etcd
                self.metastore.put_vhost(name, default_queue_type=vhost.default_queue_type)
        return vhost

    def _stream_replication(self) -> Replication:
        """A new stream's replication, for good: one node's, or in a cluster this node's
        member of it, which broker/cluster/stream_replication.py makes a leader or a replica
        once the topology names this node."""
        return StreamMember() if self.config.etcd else ONE_NODE

    def add_user(
        self,
        name: str,
        password: str | None = None,
        *,
        password_hash: str | None = None,
        tags: list[str] | None = None,
    ) -> None:
        user = self.users.add(name, password, password_hash=password_hash, tags=tags)
        self.metastore.put_user(name, user.password_hash, HASHING_ALGORITHM, user.tags)

    def set_permissions(self, user: str, vhost: str, permission: Permission) -> None:
        self.users.set_permissions(user, vhost, permission)
        self.metastore.put_permission(
            user, vhost, permission.configure, permission.write, permission.read
        )

    def server_properties(self) -> dict[str, Any]:
        return {
            "product": "Leveret",
            "version": VERSION,
            "platform": f"Python {platform.python_version()}",
            "copyright": "Leveret contributors",
            "information": "An AMQP 0.9.1 broker in Python; see the README",
            "cluster_name": self.config.cluster_name if self.config.etcd
            else self.config.node_name,
            "capabilities": {
                "publisher_confirms": True,
                "exchange_exchange_bindings": True,
                "basic.nack": True,
                "consumer_cancel_notify": True,
                "connection.blocked": True,
                "consumer_priorities": True,
                "authentication_failure_close": True,
                "per_consumer_qos": True,
                "direct_reply_to": False,
                "stream_end_offset": True,  # the x-leveret-end-offset consumer argument
            },
        }

    def cluster_key(self, session: Session) -> str:
        """A connection's name across the cluster (an exclusive queue's owner in etcd)."""
        return f"{self.config.node_name}/{self.instance}/{session.id}"

    def connection_opened(self, session: Session) -> None:
        self.connections.add(session)
        self.connections_opened_total += 1
        if self.cluster is not None:
            self.cluster_sessions[self.cluster_key(session)] = session

    def connection_closed(self, session: Session) -> None:
        self.connections.discard(session)
        if self.cluster is not None:  # its exclusive queues' records go with them (sync)
            self.cluster_sessions.pop(self.cluster_key(session), None)
        for vhost in self.vhosts.values():
            owned = [q for q in vhost.queues.values() if q.exclusive_owner is session]
            for queue in owned:
                vhost.delete_queue(queue)
        self.closed_since_collect += 1
        if self.closed_since_collect >= COLLECT_AFTER_CLOSED:
            self.closed_since_collect = 0
            gc.collect()

    def too_many_connections(self) -> bool:
        limit = self.config.max_connections
        return bool(limit) and len(self.connections) >= limit

    def alarm_changed(self, reason: str | None) -> None:
        """Resource alarm set or cleared: publishers block on their next publish, or resume."""
        self.alarm = reason
        if reason is None:
            for session in list(self.connections):
                session.unblock()
        for listener in self.alarm_listeners:
            listener()

    def login_failed(self) -> None:
        self.login_failures += 1

    def commit_pending(self) -> None:
        """Shutdown, before connections close: every stream and durable queue writes what it
        holds, fsyncs what its policy left pending and confirms it (the acks go out before
        connection.close)."""
        for vhost in self.vhosts.values():
            for exchange in list(vhost.exchanges.values()):
                try:
                    exchange.commit_pending()  # a delayed exchange's held messages
                except Exception:
                    log.exception("committing an exchange failed", exchange=exchange.name,
                                  vhost=vhost.name)
            for queue in list(vhost.queues.values()):
                if isinstance(queue, (StreamQueue, DurableClassicQueue, DelayedLog)):
                    try:
                        queue.commit_pending()
                    except Exception:
                        log.exception("committing a queue failed", queue=queue.name,
                                      vhost=vhost.name)

    def close(self) -> None:
        """Shutdown: every exchange that keeps messages, then every queue, flushes and
        releases its files."""
        for vhost in self.vhosts.values():
            for exchange in list(vhost.exchanges.values()):
                try:
                    exchange.close()
                except Exception:
                    log.exception("closing an exchange failed", exchange=exchange.name,
                                  vhost=vhost.name)
            for queue in list(vhost.queues.values()):
                try:
                    queue.close()
                except Exception:
                    log.exception("closing a queue failed", queue=queue.name, vhost=vhost.name)
        self.syncer.close()
        used = self.syncer.rounds or (self.open_logs is not None and self.open_logs.released)
        if self.open_logs is not None and used:  # (what the cap cost over this run: figures;
            # nothing from a start that failed, whose one line is the error)
            log.info("open logs at stop", cap=self.open_logs.capacity,
                     released=self.open_logs.released, refused=self.open_logs.refused,
                     fsynced_to_release=self.open_logs.synced, rounds=self.syncer.rounds,
                     round_fdatasyncs=self.syncer.fdatasync_calls,
                     round_syncfs=self.syncer.syncfs_calls)
        self.metastore.close()


WAL_FOLDER = "wal"  # the node's write-ahead log, under its data directory (storage/wal.py)


def _fsync(policy: str) -> str | int:
    """A config fsync policy: never, always, or a number of milliseconds."""
    return int(policy) if policy.isdigit() else policy
