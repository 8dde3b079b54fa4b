"""A replicated stream's log: the leader ships its chunks to the replicas, and commits at a quorum.

Leader side, `Shipper` (one per stream, on its leader): for each replica a task first syncs with
it (`stream.sync`: the replica takes the leader's epoch and answers its tail; if its last epoch
is older than the leader's, it truncates to where that epoch ends in the leader's log, as osiris
does), then sends whole chunks from the leader's log (`Log.read_chunks`, the bytes as they are on
disk, each with its two CRCs) as CHUNK frames stamped with the epoch, as fast as the link's
backpressure lets it, and waits for the writer's next append when it has caught up. A replica
answers each frame with `stream.ack` (the next offset it holds). The committed offset is the
highest offset held by a majority of members, the leader included; `on_commit` reports each
advance, and `stream.commit` tells the replicas, whose readers see only committed data. A replica
that goes away is synced again, from its own tail, once its link is back: only the delta is sent.
A replica whose tail is below the leader's first offset (the leader's retention removed what it
lacks, or it is a new member) starts again, empty, at that first offset, as osiris's do.

Replica side, `Replicas` (one per node): the logs this node holds as a replica, by stream. It
appends a chunk only from the stream's current epoch (the one of the last sync), so a deposed
leader's chunks are refused (fencing); a chunk that does not follow the log closes nothing but is
dropped and logged, and the leader's next sync repairs the gap.

Who leads which stream, with which epoch and replicas, is the caller's (the stream coordinator's,
through etcd). It must not know AMQP, the model's queues or etcd.
Asyncio: one event loop; the logs are used from it only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from leveret.broker import logs
from leveret.broker.cluster.link import Chunk, Handlers, Link, LinkError
from leveret.storage import Log
from leveret.storage import chunk as ck
from leveret.storage.errors import BadChunk, StorageError

log = logs.get("leveret.cluster.replication")
SYNC = "stream.sync"
ACK = "stream.ack"
COMMIT = "stream.commit"
CHUNK_BYTES = 1 << 20  # read and sent per frame, at most (one bigger chunk goes whole)
RETRY_S = 0.2


def quorum(members: int) -> int:
    return members // 2 + 1


def committed_offset(tails: list[int], members: int) -> int:
    """The highest offset held by a majority: the quorum-th greatest next offset, minus one."""
    held = sorted(tails, reverse=True)
    need = quorum(members)
    return held[need - 1] - 1 if len(held) >= need else -1


@dataclass
class ReplicaState:
    node: str
    next_offset: int = 0  # what it holds, as it last acknowledged
    synced: bool = False


class Shipper:
    def __init__(self, stream: str, log_: Log, epoch: int, replicas: list[str],
                 link_to: Callable[[str], Link | None],
                 on_commit: Callable[[int], None] = lambda _offset: None,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        self.stream = stream
        self.log = log_
        self.epoch = epoch
        self.replicas = {node: ReplicaState(node) for node in replicas}
        self.link_to = link_to
        self.on_commit = on_commit
        self.chunk_bytes = chunk_bytes
        self.committed = -1
        self._appended = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        log_.set_epoch(epoch)

    @property
    def members(self) -> int:
        return len(self.replicas) + 1

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._ship(state)) for state in self.replicas.values()]
        self._advance()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def appended(self) -> None:
        """The writer appended: ship it, and commit it if this leader alone is a quorum."""
        self._appended.set()
        self._advance()

    def acked(self, node: str, epoch: int, next_offset: int, resync: bool = False) -> None:
        state = self.replicas.get(node)
        if state is None or epoch != self.epoch or not state.synced:
            return
        if resync:  # it refused a chunk: sync it again from its tail, then ship from there
            state.synced = False
            self._appended.set()
            return
        state.next_offset = max(state.next_offset, next_offset)
        self._advance()

    def _advance(self) -> None:
        tails = [self.log.next_offset] + [s.next_offset for s in self.replicas.values()]
        committed = committed_offset(tails, self.members)
        if committed > self.committed:
            self.committed = committed
            self.on_commit(committed)
            for node in self.replicas:
                link = self.link_to(node)
                if link is not None and not link.closed:
                    with contextlib.suppress(LinkError):
                        link.post(COMMIT, {"stream": self.stream, "epoch": self.epoch,
                                           "committed": committed})

    async def _ship(self, state: ReplicaState) -> None:
        while True:
            link = self.link_to(state.node)
            if link is None or link.closed:
                state.synced = False
                await asyncio.sleep(RETRY_S)
                continue
            try:
                await self._sync_and_send(link, state)
            except (LinkError, StorageError, BadChunk, Resync) as exc:
                log.info("replica sync interrupted", stream=self.stream, replica=state.node,
                         error=str(exc))
                state.synced = False
                await asyncio.sleep(RETRY_S)

    async def _sync_and_send(self, link: Link, state: ReplicaState) -> None:
        answer = await link.call(SYNC, {"stream": self.stream, "epoch": self.epoch,
                                        "epoch_end": None})
        last_epoch, next_offset = int(answer["last_epoch"]), int(answer["next_offset"])
        if last_epoch < self.epoch:
            agree = min(self.log.epoch_end(last_epoch), next_offset)
            if agree < next_offset:
                answer = await link.call(SYNC, {"stream": self.stream, "epoch": self.epoch,
                                                "epoch_end": agree})
                next_offset = int(answer["next_offset"])
        first = self.log.first_offset
        if next_offset < first:  # retention here removed what it lacks: it starts at our first
            answer = await link.call(SYNC, {"stream": self.stream, "epoch": self.epoch,
                                            "epoch_end": None, "start": first})
            next_offset = int(answer["next_offset"])
        state.next_offset, state.synced = next_offset, True
        self._advance()
        if self.committed >= 0:  # a replica that came back learns the commit point at once
            with contextlib.suppress(LinkError):
                link.post(COMMIT, {"stream": self.stream, "epoch": self.epoch,
                                   "committed": self.committed})
        cursor = self.log.ship_from(next_offset)
        while not link.closed:
            if not state.synced:
                raise Resync(f"{state.node} refused a chunk and is synced again")
            data, cursor = self.log.read_chunks(cursor, self.chunk_bytes)
            if data:
                await link.send_chunk(self.stream, self.epoch, data)
                continue
            self._appended.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):  # and look again: another replica cleared it
                    await self._appended.wait()
        raise LinkError(f"link to {state.node} closed")


class Resync(Exception):
    """A replica refused a chunk: its sender syncs it again."""


@dataclass
class ReplicaLog:
    log: Log
    epoch: int = -1  # the epoch of the last sync: chunks of any other epoch are refused
    leader: str = ""
    committed: int = -1  # what this replica's readers may read: announced and held here
    announced: int = -1  # the leader's last commit point
    expected: str = ""  # the node the stream's record names as leader ("": any)
    # after a sync: the tracking chunks this log ends with (they take no offset, so the leader
    # ships them again from the replica's next offset); dropped when they come back
    held: list[bytes] = field(default_factory=list)
    on_commit: Callable[[int], None] = lambda _offset: None

    def advance(self) -> None:
        """The commit point here: the leader's, as far as this log holds it."""
        committed = min(self.announced, self.log.next_offset - 1)
        if committed > self.committed:
            self.committed = committed
            self.on_commit(committed)


class Replicas:
    """The stream logs this node holds as a replica, answering their leaders over the links."""

    def __init__(self, handlers: Handlers) -> None:
        self.logs: dict[str, ReplicaLog] = {}
        self.shippers: dict[str, Shipper] = {}  # streams this node leads, for their acks
        handlers.on_request(SYNC, self._sync)
        handlers.on_message(ACK, self._ack)
        handlers.on_message(COMMIT, self._commit)
        handlers.on_chunk(self._chunk)

    def add(self, stream: str, log_: Log,
            on_commit: Callable[[int], None] = lambda _offset: None,
            leader: str = "", epoch: int = -1) -> ReplicaLog:
        """Hold `log_` as a replica of `stream`. With `leader`, only that node may sync it (a
        deposed leader is refused even before it learns of the new epoch); `epoch` is the
        oldest epoch still accepted."""
        replica = self.logs[stream] = ReplicaLog(log_, epoch=epoch, on_commit=on_commit,
                                                 expected=leader)
        return replica

    def remove(self, stream: str) -> None:
        self.logs.pop(stream, None)

    async def _sync(self, link: Link, body: Any) -> dict[str, int]:
        replica = self._replica(body)
        epoch = _int(body, "epoch")
        if epoch < replica.epoch:
            raise ValueError(f"epoch {epoch} is older than this replica's {replica.epoch}")
        if replica.expected and link.peer_node != replica.expected:
            raise ValueError(f"{link.peer_node} does not lead this stream; "
                             f"{replica.expected} does")
        replica.epoch, replica.leader = epoch, link.peer_node
        end = _offset(body, "epoch_end")
        if end is not None and end < replica.log.next_offset:
            log.info("truncating a replica's tail the leader does not have", stream=body["stream"],
                     offset=end, next_offset=replica.log.next_offset)
            end = max(end, replica.committed + 1)
            if end < replica.log.first_offset:  # its own retention removed where they agree
                replica.log.reset_to(end)
            else:
                replica.log.truncate_from(end)
        start = _offset(body, "start")
        if start is not None and start > replica.log.next_offset:
            log.info("replica starts again at the leader's first offset", stream=body["stream"],
                     offset=start, next_offset=replica.log.next_offset)
            replica.log.reset_to(start)
        last_epoch, next_offset = replica.log.tail
        tail, _cursor = replica.log.read_chunks(replica.log.ship_from(next_offset), CHUNK_BYTES)
        replica.held = _split(tail)
        return {"last_epoch": last_epoch, "next_offset": next_offset}

    async def _chunk(self, link: Link, chunk: Chunk) -> None:
        replica = self.logs.get(chunk.stream)
        if replica is None or chunk.epoch != replica.epoch or link.peer_node != replica.leader:
            log.warning("chunk refused: not from this stream's current leader",
                        stream=chunk.stream, epoch=chunk.epoch, peer_node=link.peer_node)
            return
        data: bytes | memoryview = chunk.data
        if replica.held:  # the first frame after a sync: what this log already ends with
            data = _drop_held(replica, memoryview(chunk.data))
        try:
            next_offset = replica.log.append_chunks(data)
        except BadChunk as exc:
            log.warning("chunk refused; asking the leader to sync again", stream=chunk.stream,
                        reason=str(exc))
            replica.epoch = -1  # nothing more until the leader syncs again, which it is asked
            with contextlib.suppress(LinkError):
                link.post(ACK, {"stream": chunk.stream, "epoch": chunk.epoch,
                                "next_offset": replica.log.next_offset, "resync": True})
            return
        with contextlib.suppress(LinkError):
            link.post(ACK, {"stream": chunk.stream, "epoch": chunk.epoch,
                            "next_offset": next_offset})
        replica.advance()

    async def _ack(self, link: Link, body: Any) -> None:
        shipper = self.shippers.get(str(body.get("stream")))
        if shipper is not None:
            shipper.acked(link.peer_node, _int(body, "epoch"), _int(body, "next_offset"),
                          resync=body.get("resync") is True)

    async def _commit(self, link: Link, body: Any) -> None:
        replica = self.logs.get(str(body.get("stream")))
        if replica is None or _int(body, "epoch") != replica.epoch:
            return
        replica.announced = max(replica.announced, _int(body, "committed"))
        replica.advance()

    def _replica(self, body: Any) -> ReplicaLog:
        stream = body.get("stream") if isinstance(body, dict) else None
        replica = self.logs.get(stream) if isinstance(stream, str) else None
        if replica is None:
            raise LookupError(f"this node holds no replica of stream {stream!r}")
        return replica


def _split(data: bytes) -> list[bytes]:
    chunks, view = [], memoryview(data)
    while view:
        size = ck.decode_header(view).total_size
        chunks.append(bytes(view[:size]))
        view = view[size:]
    return chunks


def _drop_held(replica: ReplicaLog, view: memoryview) -> memoryview:
    """Skip the leading chunks of `view` that are, byte for byte, the tracking chunks the
    replica's log already ends with; anything else ends the skipping."""
    held, replica.held = replica.held, []
    for chunk in held:
        if bytes(view[:len(chunk)]) != chunk:
            break
        view = view[len(chunk):]
    return view


def _offset(body: Any, key: str) -> int | None:
    """An optional offset of a sync: None when absent or not a non-negative integer."""
    value = body.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _int(body: Any, key: str) -> int:
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer")
    return value
