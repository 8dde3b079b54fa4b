"""Replicated streams in the broker: the leader's writer ships and commits at a quorum, and the
other members hold replicas that serve their node's consumers.

A stream whose queue record names several `members` (docs/REPLICATION.md) is a real
`StreamQueue` on every member node (the topology's sync makes it; `attach` is then called). A
cluster node's stream queues are made with a `StreamMember` (stream_member.py), the model's
replication port, which this module drives; it never sets anything on the queue or its writer:

- On the leader (`record.node`), the member is not `local`: after each append the `Shipper`
  (broker/cluster/replication.py) ships the chunks to the replicas, and its `on_commit` moves
  the writer's commit point (`writer.committed_up_to`), so the publisher confirms of a batch go
  out once a majority of members hold it, never before. The stream's readers stop at that
  commit point too (the member's `commit_bound`). The epoch is the one the stream's leadership
  key in etcd holds (broker/cluster/stream_leadership.py), read before shipping starts.
- On every other member, the log is a replica (`Replicas.add`): it appends the leader's chunks
  as they are, and its readers (this node's AMQP 0-9-1 consumers read it, not the leader)
  stop at the commit point the leader announces. A publish that reaches the stream on this node
  goes to the leader through forwarding (a `RemoteQueue` for the leader, not in the model), and
  is confirmed when the leader confirms it.

A new record with other members and the same leader (add_replica, delete_replica: see
stream_membership.py) gives the leader a new shipper for the new replicas on the same log and
writer. Failover is stream_failover.py's. With fewer than a quorum of
members running, the leader appends but confirms nothing, and its readers see nothing new; the
stream resumes when a quorum is back (a returning replica is synced from its own tail).

It knows the model's StreamQueue and RemoteQueue, the cluster runtime, the replication core and
the stream members, and installs its parts (stream_failover, stream_membership, stream_sac):
each is given what it asks of the replication as a small Protocol and does not import this
module. Nothing of AMQP frames or sessions. Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol, cast

from leveret.broker.cluster import stream_failover, stream_sac
from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.cluster.link import Link, LinkError
from leveret.broker.cluster.replication import Replicas, Shipper, stall_s
from leveret.broker.cluster.stream_leadership import (
    StaleLeadership,
    StreamLeaderships,
    needs_new_epoch,
)
from leveret.broker.cluster.stream_led import Led
from leveret.broker.cluster.stream_member import StreamMember, member_of
from leveret.broker.cluster.stream_membership import StreamMembership
from leveret.broker.cluster.topology_records import QueueRecord
from leveret.broker.model.delayed_log import TYPE as DELAYED_LOG
from leveret.broker.model.log_queue import LogQueue
from leveret.broker.model.stream import StreamQueue
from leveret.broker.model.syncer import Syncer
from leveret.broker.process import logs
from leveret.broker.process.config import Config
from leveret.broker.remote.remote_queue import RemoteQueue
from leveret.storage import Log, LogClosedError, StorageError

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime

log = logs.get("leveret.cluster.streams")
RETRY_S = 1.0
OFFSETS = "stream.offsets"  # a replica's consumers' offsets, for the leader to store


# the queue types a cluster replicates by their log (a delayed exchange's log is one)
REPLICATED_TYPES = ("stream", "quorum", DELAYED_LOG)


def _log_queue(queue: object) -> LogQueue | None:
    """A stream or a quorum queue made with a cluster member (None: any other queue)."""
    return cast("LogQueue", queue) if member_of(queue) is not None else None


class Host(stream_sac.Vhosts, Protocol):
    """What of the broker the replication and its parts read: the vhosts (where the SAC
    groups' streams are), the settings (the failover delay) and the syncer (a replica's
    fsyncs before it acknowledges)."""

    @property
    def config(self) -> Config: ...

    @property
    def syncer(self) -> Syncer: ...


class StreamReplication:
    def __init__(self, broker: Host, cluster: ClusterRuntime) -> None:
        self.broker = broker
        self.cluster = cluster
        self.replicas = Replicas(cluster.links.handlers, broker.syncer)
        self.leaderships = StreamLeaderships(cluster.client, cluster.cluster)
        cluster.store.streams = self.leaderships
        cluster.links.handlers.on_message(OFFSETS, self._store_offsets)
        self.led: dict[str, Led] = {}
        self.following: dict[str, QueueRecord] = {}  # streams replicated here, by key
        self.failover: stream_failover.Failover | None = None
        self.sac: stream_sac.StreamSac | None = None  # single active consumer across nodes
        self.membership = StreamMembership(self)

    @staticmethod
    def replicated(record: QueueRecord) -> bool:
        """A stream or a quorum queue with a members list: declared with several, or its
        members changed since (delete_replica down to the leader alone keeps the list, and
        the leader's shipper)."""
        return record.type in REPLICATED_TYPES and len(record.members) >= 1

    def holds(self, record: QueueRecord) -> bool:
        """This node holds the queue: its leader, or a member of a replicated stream."""
        return record.node == self.cluster.node or (
            self.replicated(record) and self.cluster.node in record.members)

    def attach(self, queue: object, record: QueueRecord) -> None:
        """The sync made (or found) `queue` for `record` on this node: make it a leader or a
        replica if the record is a replicated stream (or quorum queue) this node is a member
        of."""
        replicated = _log_queue(queue)
        if replicated is None or not self.replicated(record):
            return
        member = member_of(queue)
        if member is None or member.role or self.cluster.node not in record.members:
            return
        key = record.storage_id or f"{record.vhost}/{record.name}"
        member.attach(replicated, key, self, tuple(record.members))
        if record.node == self.cluster.node:
            self._lead(replicated, member, record, key)
        else:
            self._replicate(replicated, member, record, key)
        replicated.took_role()
        if self.sac is not None and isinstance(queue, StreamQueue):
            self.sac.attached(queue)

    def _members_changed(self, queue: LogQueue, record: QueueRecord) -> bool:
        """add_replica or delete_replica on the stream this node leads, the leader and epoch
        unchanged: ship to the new set of replicas with a new shipper on the same log and
        writer (what waits for the quorum stays waiting and is confirmed at the new one)."""
        key = record.storage_id or f"{record.vhost}/{record.name}"
        led = self.led.get(key)
        if led is None or led.queue is not queue or record.node != self.cluster.node:
            return False
        led.member.members_changed(tuple(record.members))
        led.record = record
        old = led.shipper
        if old is None:  # still reading its epoch: it ships to the record's members
            return True
        self.replicas.shippers.pop(key, None)
        closing = asyncio.get_running_loop().create_task(old.close())
        _closing.add(closing)
        closing.add_done_callback(_closing.discard)
        led.shipper = None
        led.task = asyncio.get_running_loop().create_task(
            self._start_shipping(led, record, epoch=old.epoch))
        log.info("a replicated stream's members changed", stream=record.name,
                 vhost=record.vhost, members=list(record.members))
        return True

    def log_of(self, key: str) -> Log | None:
        """This node's log of the stream `key` (a replica's or the leader's), or None."""
        replica = self.replicas.logs.get(key)
        if replica is not None:
            return replica.log
        led = self.led.get(key)
        return led.queue.log if led is not None else None

    def rerole(self, queue: object, record: QueueRecord) -> bool:
        """A new record for a stream this node holds (a failover moved its leader): take the
        role it gives, on the same log, and keep the consumers. False if it is not that."""
        replicated = _log_queue(queue)
        if replicated is None or not replicated.role or not self.replicated(record):
            return False
        if (record.storage_id != replicated.storage_id
                or self.cluster.node not in record.members):
            return False
        if self._members_changed(replicated, record):
            return True
        self._reattach(replicated, record)
        return True

    def _reattach(self, queue: LogQueue, record: QueueRecord, attach: bool = True) -> None:
        """Detach `queue`, and attach it again (unless not `attach`) in the role `record`
        gives, on the same log; what its readers could read stays readable."""
        bound = queue.commit_bound
        self.detach(queue)
        if attach:
            self.attach(queue, record)
        member = member_of(queue)
        if member is not None:
            member.keep_bound(bound)

    def detach(self, queue: object) -> None:
        """The queue leaves this node's model (deleted, replaced): stop shipping or replicating
        before its log closes."""
        member = member_of(queue)
        replicated = _log_queue(queue)
        if member is None or not member.role or replicated is None:
            return
        if self.sac is not None and isinstance(queue, StreamQueue):
            self.sac.detached(queue)
        for key, led in list(self.led.items()):
            if led.queue is queue:
                self._stop(key, led)
        for key, replica in list(self.replicas.logs.items()):
            if replica.log is replicated.log or key == replicated.storage_id:  # (a restart)
                self.replicas.remove(key)
                self.following.pop(key, None)
        member.detach()
        replicated.took_role()

    def restarted(self, queue: LogQueue, key: str) -> None:
        """restart_stream reopened the queue's log: ship or replicate the new one, in the same
        role (the writer closed with the old log: what waited for a quorum was nack'ed)."""
        led = self.led.get(key)
        record = led.record if led is not None else self.following.get(key)
        if record is None:
            return
        self._reattach(queue, record)

    def member_rows(self, queue: LogQueue, key: str,
                    local: dict[str, Any]) -> list[dict[str, Any]]:
        """stream_status's rows: this node's (`local`, as the management API computes it) with
        its role, epoch and the commit point; on the leader, a row per replica as far as it
        has acknowledged (`lag`: the leader's offset minus the replica's)."""
        row = dict(local, epoch=queue.log.tail[0] if queue.log.next_offset else queue.log.epoch,
                   committed_offset=queue.commit_bound if queue.commit_bound is not None
                   else local["committed_offset"], lag=0)
        led = self.led.get(key)
        if queue.role != "leader" or led is None or led.shipper is None:
            row["role"] = "replica" if queue.role == "replica" else row["role"]
            if queue.role == "replica":
                row["epoch"] = self._replica_epoch(key, row["epoch"])
            return [row]
        shipper = led.shipper
        row["epoch"] = shipper.epoch
        rows = [row]
        for state in shipper.replicas.values():
            offset = state.next_offset - 1
            rows.append({
                "role": "replica", "node": state.node,
                "epoch": shipper.epoch if state.synced else None,
                "offset": offset, "committed_offset": min(shipper.committed, offset),
                "committed_chunk_id": None, "first_offset": None, "readers": None,
                "segments": None, "lag": max(0, local["offset"] - offset),
                "synced": state.synced})
        return rows

    def _replica_epoch(self, key: str, default: int) -> int:
        replica = self.replicas.logs.get(key)
        return replica.epoch if replica is not None and replica.epoch >= 0 else default

    # -- the leader

    def _lead(self, queue: LogQueue, member: StreamMember, record: QueueRecord,
              key: str) -> None:
        member.lead()  # nothing is readable, or committed, until a majority holds it
        queue.writer.committed_up_to(-1)  # (no confirm waits for an offset below 0)
        # until the epoch is read and set, publishes wait unwritten: a chunk written now would
        # carry the log's old epoch, which the replicas (and an election) must never see
        queue.writer.hold()
        led = self.led[key] = Led(queue, member, key, record)
        led.task = asyncio.get_running_loop().create_task(self._start_shipping(led, record))
        log.info("leading a replicated stream", stream=record.name, vhost=record.vhost,
                 members=list(record.members))

    async def _start_shipping(self, led: Led, record: QueueRecord,
                              epoch: int | None = None) -> None:
        """Take the stream's epoch from its leadership key, then ship (`epoch`: keep that one,
        for new members under the same leader)."""
        while epoch is None and not led.closed:
            try:
                epoch = await self._leading_epoch(led, record)
            except StaleLeadership:
                continue  # changed meanwhile: read it again
            except EtcdException as exc:
                log.warning("cannot read a stream's leadership yet; retrying",
                            stream=record.name, error=str(exc))
                await asyncio.sleep(RETRY_S)
            if epoch is None:
                return  # another node leads: the topology's record moves this one on
        if led.closed or epoch is None:
            return
        queue, member = led.queue, led.member
        record = led.record  # (add_replica, delete_replica may have changed it meanwhile)
        replicas = [m for m in record.members if m != record.node]

        membership = self.cluster.membership

        def committed(offset: int) -> None:
            if not membership.in_cluster:  # lost its lease: another node may lead by now
                return
            member.committed(offset)
            if offset > queue.writer.committer.committed:  # (a new shipper starts at -1)
                queue.writer.committed_up_to(offset)

        try:
            links = self.cluster.links
            shipper = Shipper(led.key, queue.log, epoch, replicas, links.link_to,
                              on_commit=committed,
                              on_fenced=lambda fence: self._fenced(led, fence),
                              stall_s_=stall_s(links.config.heartbeat_interval_s,
                                               links.config.heartbeat_timeout_s))
        except LogClosedError:
            return  # the stream was deleted, or the node stops, while its epoch was read
        led.shipper = shipper
        self.replicas.shippers[led.key] = shipper
        member.ship(shipper)  # the writer's appends ship, in contact with a quorum only
        shipper.on_contact = queue.writer.resume
        shipper.start()
        queue.writer.release()  # what waited goes out in the new epoch

    async def _leading_epoch(self, led: Led, record: QueueRecord) -> int | None:
        """The epoch to lead in: the leadership key's, or the next one, written there, when
        `needs_new_epoch`. None if the key names another leader."""
        found = await self.leaderships.get(record.vhost, record.name)
        if found is None:
            return 1
        if found.leader != self.cluster.node:
            log.warning("the stream's leadership names another node; not leading",
                        stream=record.name, vhost=record.vhost, leader=found.leader)
            return None
        if needs_new_epoch(found.epoch, led.queue.log.tail[0], led.fence):
            found = await self.leaderships.elect(found, self.cluster.node)
            log.info("leading a replicated stream in a new epoch", stream=record.name,
                     vhost=record.vhost, epoch=found.epoch)
        return found.epoch

    def _fenced(self, led: Led, fence: int) -> None:
        """A replica was fenced at a newer epoch by an election: write nothing more in this
        epoch; read the leadership again and lead on in a newer epoch, or let the new record
        move this node on (what waits in the writer is then nack'ed)."""
        led.fence = max(led.fence, fence)
        if led.closed or led.shipper is None or (led.task is not None and not led.task.done()):
            return
        shipper, led.shipper = led.shipper, None
        self.replicas.shippers.pop(led.key, None)
        led.member.ship(None)
        led.queue.writer.hold()
        log.warning("a replica was fenced by an election; checking the stream's leadership",
                    stream=led.record.name, vhost=led.record.vhost, epoch=shipper.epoch,
                    fence=fence)

        async def again() -> None:
            await shipper.close()
            await self._start_shipping(led, led.record)

        led.task = asyncio.get_running_loop().create_task(again())

    async def stop_leading(self, key: str) -> Led | None:
        """delete_replica of the leader's own membership, before another member is elected:
        ship and commit nothing more here (what waits for the quorum is nack'ed). The Led
        (its queue, record and final shipper), or None if this node does not lead `key`."""
        led = self.led.get(key)
        if led is None or led.shipper is None:
            return None
        shipper = led.shipper
        shipper.on_commit = lambda _offset: None
        self._stop(key, led)
        await shipper.close()
        return led

    def resume_leading(self, led: Led) -> None:
        """The election after stop_leading did not happen: lead again, on the same log."""
        self._reattach(led.queue, led.record, attach=not led.queue.deleted)

    def _stop(self, key: str, led: Led) -> None:
        led.closed = True
        del self.led[key]
        if led.task is not None:
            led.task.cancel()
        led.member.ship(None)
        # no longer the leader: what waits for a quorum here is nack'ed, never left unanswered,
        # and what waited for the epoch or for contact with a quorum is nack'ed unwritten
        if led.queue.writer.held or led.queue.writer.waiting:
            led.queue.writer.discard()
        led.queue.writer.committer.close()
        shipper = led.shipper
        if shipper is not None:
            self.replicas.shippers.pop(key, None)
            closing = asyncio.get_running_loop().create_task(shipper.close())
            _closing.add(closing)
            closing.add_done_callback(_closing.discard)

    # -- a replica

    def _replicate(self, queue: LogQueue, member: StreamMember, record: QueueRecord,
                   key: str) -> None:
        member.replicate(record.node, RemoteQueue(
            queue.vhost, queue.name, queue_type=record.type, node=record.node,
            durable=record.durable, auto_delete=record.auto_delete,
            arguments=dict(record.arguments), exclusive_elsewhere=False,
            forwarder=getattr(self.broker, "forwarder", None)))

        def committed(offset: int) -> None:
            member.committed(offset)
            queue.dispatch()

        self.replicas.add(key, queue.log, on_commit=committed, leader=record.node)
        self.following[key] = record
        log.info("replicating a stream", stream=record.name, vhost=record.vhost,
                 leader=record.node)


    # -- consumer offsets stored through the leader

    def send_offsets(self, key: str, leader: str, offsets: dict[bytes, int]) -> None:
        """Offsets a replica's consumers acknowledged: the leader writes them into the log,
        which brings them back to every member. Lost if the leader cannot be reached."""
        link = self.cluster.links.link_to(leader)
        body = {"stream": key, "offsets": [[name.hex(), offset] for name, offset
                                           in offsets.items()]}
        try:
            if link is None or link.closed:
                raise LinkError(f"no link to {leader}")
            link.post(OFFSETS, body)
        except LinkError as exc:
            log.warning("consumer offsets not stored: the stream's leader cannot be reached",
                        leader=leader, error=str(exc))

    async def _store_offsets(self, _link: Link, body: object) -> None:
        if not isinstance(body, dict):
            return
        key = body.get("stream")
        led = self.led.get(key) if isinstance(key, str) else None
        if led is None or led.queue.deleted:
            return
        offsets = {bytes.fromhex(str(name)): int(offset)
                   for name, offset in body.get("offsets", [])}
        try:
            led.queue.log.store_offsets(offsets)
        except StorageError as exc:
            log.error("storing a replica's consumer offsets failed", error=str(exc))
            return
        if led.shipper is not None:
            led.shipper.appended()


_closing: set[asyncio.Task[None]] = set()


def install(broker: Any) -> None:
    """Register the replication kinds on the links and let the topology's sync attach the
    replicated streams it makes (before the cache's first load)."""
    cluster = broker.cluster
    assert cluster is not None
    replication = StreamReplication(broker, cluster)
    broker.stream_replication = replication
    replication.failover = stream_failover.install(
        replication, float(broker.config.stream_failover_after_s))
    replication.sac = stream_sac.install(cluster, broker)
    sync = getattr(broker, "topology_sync", None)
    if sync is not None:
        sync.replication = replication


def replication_of(broker: object) -> StreamReplication | None:
    found = getattr(broker, "stream_replication", None)
    return found if isinstance(found, StreamReplication) else None


__all__ = ["StreamReplication", "install", "replication_of"]
