"""A replicated stream's log: the leader ships its chunks to the replicas, and commits at a quorum.

The protocol and its invariants are in docs/REPLICATION.md; in short:

Leader side, `Shipper` (one per stream, on its leader, for one epoch): for each replica a task
syncs with it in two calls. The first (`stream.sync` with the epoch) makes the replica take the
leader's epoch (if its fence allows it: an election may have fenced it at a newer one, and then
the answer says so and the leader's `on_fenced` is told) and answer the epochs of its log with
where each ends. The leader finds where the two logs part (`agreement`: chunks of one epoch are
one leader's, written once, so two logs agree up to the end of the last epoch range they share),
and the second call (`agree`) makes the replica cut everything from there, tracking chunks at
that offset included, or start again at the leader's first offset if retention here removed
what it lacks. Only then is the replica *verified*: it takes chunks and commit points from this
leader. The leader ships whole chunks from its log (`Log.read_chunks`, the bytes as on disk, each
with its two CRCs) as CHUNK frames stamped with the epoch, and each replica answers `stream.ack`
(its next offset and the epoch of its last chunk).

The commit rule (Raft's, for the same reason): the committed offset is the highest offset held by
a quorum of members whose last chunk is of the current epoch, the leader included. A new leader
that inherited chunks first writes an empty tracking chunk of its epoch (`Log.mark_epoch`), so
that what it inherited is committed once a quorum holds that chunk, and an election, which picks
the greatest (last epoch, next offset) among a quorum of fenced members, can never pick a member
that lacks a committed chunk. `on_commit` reports each advance, and `stream.commit` tells the
verified replicas, whose readers see only committed data.

Replica side, `Replicas` (one per node): the logs this node holds as a replica, by stream. It
takes a chunk only from the verified sync's leader and epoch, so a deposed leader's chunks are
refused (and told so, with the fence, in the ack); `fence` raises a log's fence (durably, in the
log's folder) for an election, after which the old leader's chunks and commits are refused too.

Who leads which stream, with which epoch and replicas, is the caller's (the stream coordinator's,
through etcd). It must not know AMQP, the model's queues or etcd.
Asyncio: one event loop; the logs are used from it only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from leveret.broker.cluster.link import Chunk, Handlers, Link, LinkError
from leveret.broker.model.syncer import INLINE, Syncer
from leveret.broker.process import logs
from leveret.storage import Log, shipping
from leveret.storage.errors import BadChunk, StorageError

log = logs.get("leveret.cluster.replication")
SYNC = "stream.sync"
ACK = "stream.ack"
COMMIT = "stream.commit"
ALIVE = "stream.alive"  # after a stall: does the peer still hold this link? (one per link)


class SyncRequest(TypedDict, total=False):
    """`stream.sync`, the leader to a replica: its hello (`stream`, `epoch`), then the cut
    (with `agree`, and `start` when the leader's retention removed what the replica lacks)."""

    stream: str
    epoch: int
    agree: int
    start: int


class AckMessage(TypedDict, total=False):
    """`stream.ack`, a replica to its leader: what it holds of `stream` (or that it is
    `fenced` at a newer epoch, or asks to be synced again: `resync`)."""

    stream: str
    epoch: int
    next_offset: int
    last_epoch: int
    fenced: int
    resync: bool


class CommitMessage(TypedDict):
    """`stream.commit`, the leader to a replica: the commit point of `stream`."""

    stream: str
    epoch: int
    committed: int
CHUNK_BYTES = 1 << 20  # read and sent per frame, at most (one bigger chunk goes whole)
RETRY_S = 0.2
IDLE_CHECK_S = 1.0  # a caught-up sender looks at the log again this often, appended or not
TICK_S = 0.25  # the node's stall watch notes that its event loop runs this often (a timer)
STALL_S = 1.0  # a stall this long holds every leader until its replicas are confirmed (the
# default; a node's own is `stall_s(link config)`: what its peers' failure detection allows)


def stall_s(heartbeat_interval_s: float, heartbeat_timeout_s: float) -> float:
    """The shortest stall of this node's loop after which a peer may have dropped its link for
    silence, and so the others may have begun to depose its leaders: a peer drops a link that
    sent nothing for `heartbeat_timeout_s`, and this node sends at least a heartbeat every
    `heartbeat_interval_s` while its loop runs. A shorter stall (a loaded loop lagging) cannot
    have let a peer take this node for lost; anything else that deposes a leader while its
    links stay up (an election on lease expiry, a transfer) fences the replicas, whose fenced
    acknowledgement comes over those links (Replicas.fence)."""
    return max(TICK_S * 2, heartbeat_timeout_s - heartbeat_interval_s)


class StallWatch:
    """One per event loop, shared by the leaders it runs: notices that the loop did not run
    for `stall_s` (a SIGSTOP, a hung disk, a swap storm). Then no leader writes or commits on
    what it believed of its replicas before the stall until that is confirmed: one ALIVE call
    per link the synced replicas were synced over (not two sync calls per replica of every
    leader). The peer answers on the same link, after anything it sent on it before, so a
    fenced acknowledgement that an election made it send while this node was stalled is
    handled first (the link's reader handles messages in order, before it reads the reply),
    and the replica is then no longer synced. A link the peer dropped (for this node's silence)
    gives no answer: its replicas are synced again, and a deposed leader's first sync is
    answered with the fence. One timer for the node, not one per leader: with 1,000 quorum
    queues, per-leader timers were 4,000 wake-ups a second, and a loop that lagged past 1 s
    under load had every leader sync again, which made it lag more (docs/QUORUM-QUEUES.md,
    "Many queues")."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stall_s_: float = STALL_S) -> None:
        self.loop = loop
        self.stall_s = stall_s_
        self.stalls = 0  # how many it noticed (for the tests and the log)
        self._ticked = loop.time()
        self._leaders: set[Shipper] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._confirming: set[asyncio.Task[None]] = set()

    def add(self, shipper: Shipper) -> None:
        if not self._leaders:
            self._ticked = self.loop.time()
            self._timer = self.loop.call_later(TICK_S, self._tick)
        self._leaders.add(shipper)

    def discard(self, shipper: Shipper) -> None:
        self._leaders.discard(shipper)
        if not self._leaders and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def check(self) -> None:
        """Called every TICK_S (a timer, not a task) and before each write of any leader."""
        now = self.loop.time()
        stalled_s = now - self._ticked
        self._ticked = now
        if stalled_s > self.stall_s:
            self.stalls += 1
            at_risk: dict[Link, list[tuple[Shipper, ReplicaState]]] = {}
            for shipper in list(self._leaders):
                for state, link in shipper.stalled():
                    at_risk.setdefault(link, []).append((shipper, state))
            log.warning("this node's event loop stalled; its leaders confirm their replicas",
                        stalled_s=round(stalled_s, 1), leaders=len(self._leaders),
                        links=len(at_risk))
            for link, states in at_risk.items():
                task = self.loop.create_task(self._confirm(link, states))
                self._confirming.add(task)
                task.add_done_callback(self._confirming.discard)

    @staticmethod
    async def _confirm(link: Link, states: list[tuple[Shipper, ReplicaState]]) -> None:
        try:
            await link.call(ALIVE, {})
            alive = True
        except LinkError as exc:  # closed, timed out, or a peer that does not know the call
            log.info("a link did not answer after a stall; its replicas are synced again",
                     peer_node=link.peer_node, error=str(exc))
            alive = False
        for shipper, state in states:
            shipper.confirmed(state, alive)

    def _tick(self) -> None:
        self.check()
        self._timer = self.loop.call_later(TICK_S, self._tick) if self._leaders else None


_watches: dict[asyncio.AbstractEventLoop, StallWatch] = {}


def stall_watch(stall_s_: float | None = None) -> StallWatch:
    """The running loop's StallWatch (made at the first call; `stall_s_` sets its threshold)."""
    loop = asyncio.get_running_loop()
    watch = _watches.get(loop)
    if watch is None or watch.loop.is_closed():
        for old in [k for k in _watches if k.is_closed()]:
            del _watches[old]
        watch = _watches[loop] = StallWatch(loop)
    if stall_s_ is not None:
        watch.stall_s = stall_s_
    return watch


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
    last_epoch: int = -1  # the epoch of its last chunk, as it last acknowledged
    synced: bool = False
    link: Link | None = None  # the link its last sync went over (a new link is synced anew)
    confirming: bool = False  # this node stalled since: counted again once its link answers


class Shipper:
    def __init__(self, stream: str, log_: Log, epoch: int, replicas: list[str],
                 link_to: Callable[[str], Link | None],
                 on_commit: Callable[[int], None] = lambda _offset: None,
                 chunk_bytes: int = CHUNK_BYTES,
                 on_fenced: Callable[[int], None] = lambda _epoch: None,
                 stall_s_: float | None = None) -> None:
        self.stream = stream
        self.log = log_
        self.epoch = epoch
        self.replicas = {node: ReplicaState(node) for node in replicas}
        self.link_to = link_to
        self.on_commit = on_commit
        self.on_fenced = on_fenced
        self.chunk_bytes = chunk_bytes
        self.committed = -1
        self.on_contact: Callable[[], None] = lambda: None  # may_write() may say yes again
        self._appended = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stall_s = stall_s_
        self._watch: StallWatch | None = None
        log_.set_epoch(epoch)
        log_.raise_fence(epoch)
        if not log_.empty and log_.tail[0] < epoch:
            log_.mark_epoch()  # what this leader inherited commits with its first chunk

    @property
    def members(self) -> int:
        return len(self.replicas) + 1

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._watch = stall_watch(self._stall_s)
        self._watch.add(self)
        self._tasks = [loop.create_task(self._ship(state)) for state in self.replicas.values()]
        self._advance()

    def may_write(self) -> bool:
        """Whether this leader may append now: its node's loop was not stalled (a process
        paused or starved past the StallWatch's threshold may have been deposed meanwhile: it
        syncs every replica again, and the first sync of a deposed leader is answered with the
        fence), and a quorum of members, itself included, is synced over an open link. A leader
        cut off from its quorum writes nothing more, so the publishes its sockets still hold
        wait, then go to the next leader's node or are nack'ed; they are never written in an
        epoch that is over."""
        if self._watch is not None:
            self._watch.check()
        linked = sum(1 for state in self.replicas.values() if state.synced
                     and not state.confirming and state.link is not None
                     and not state.link.closed)
        return linked + 1 >= quorum(self.members)

    def stalled(self) -> list[tuple[ReplicaState, Link]]:
        """The node's loop stalled (StallWatch): a synced replica counts for nothing (no write,
        no commit) until its link answers; one whose link is gone is synced again. Returns the
        replicas to confirm, with their links."""
        to_confirm = []
        for state in self.replicas.values():
            if not state.synced:
                continue
            if state.link is None or state.link.closed:
                state.synced = False
                self._appended.set()
                continue
            state.confirming = True
            to_confirm.append((state, state.link))
        return to_confirm

    def confirmed(self, state: ReplicaState, alive: bool) -> None:
        """The ALIVE call over `state`'s link ended: counted again, or synced again."""
        if not state.confirming:
            return
        state.confirming = False
        if not alive:
            state.synced = False
            self._appended.set()
        elif state.synced:  # (a fenced acknowledgement before the answer unsynced it)
            self._advance()
            self.on_contact()

    def stop(self) -> None:
        """Ship nothing more (close() also waits for the senders to end)."""
        if self._watch is not None:
            self._watch.discard(self)
        for task in self._tasks:
            task.cancel()

    async def close(self) -> None:
        self.stop()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def appended(self) -> None:
        """The writer appended: ship it, and commit it if this leader alone is a quorum."""
        self._appended.set()
        self._advance()

    def acked(self, node: str, epoch: int, next_offset: int, last_epoch: int,
              resync: bool = False) -> None:
        state = self.replicas.get(node)
        if state is None or epoch != self.epoch or not state.synced:
            return
        if resync:  # it refused a chunk: sync it again from its tail, then ship from there
            state.synced = False
            self._appended.set()
            return
        if next_offset >= state.next_offset:
            state.next_offset, state.last_epoch = next_offset, last_epoch
        self._advance()

    def fenced(self, node: str, fence: int) -> None:
        """`node` refused this leader's epoch: an election fenced it at `fence`."""
        state = self.replicas.get(node)
        if state is not None and fence > self.epoch:
            state.synced = False
            self.on_fenced(fence)

    def _advance(self) -> None:
        """Commit what a quorum of current-epoch members holds. The stall watch looks first:
        an acknowledgement (or a sync's answer) read just before the loop stalled, and counted
        after it, would commit in an epoch an election may have ended meanwhile, and a quorum
        queue would then send deliveries that the new leader has already given out again."""
        if self._watch is not None:
            self._watch.check()
        current = [self.log.kept_next] if self.log.tail[0] == self.epoch else []
        current += [s.next_offset for s in self.replicas.values()
                    if s.synced and not s.confirming and s.last_epoch == self.epoch]
        committed = committed_offset(current, self.members)
        if committed > self.committed:
            self.committed = committed
            self.on_commit(committed)
            for state in self.replicas.values():
                if state.synced:
                    self._post_commit(state.node)

    def _post_commit(self, node: str) -> None:
        link = self.link_to(node)
        if link is not None and not link.closed:
            with contextlib.suppress(LinkError):
                link.post(COMMIT, {"stream": self.stream, "epoch": self.epoch,
                                   "committed": self.committed})

    async def _ship(self, state: ReplicaState) -> None:
        while True:
            link = self.link_to(state.node)
            if link is None or link.closed:
                state.synced = False
                await asyncio.sleep(RETRY_S)
                continue
            try:
                await self._sync_and_send(link, state)
            except (LinkError, StorageError, BadChunk, Resync, ValueError, KeyError,
                    TypeError) as exc:  # (the last three: a malformed answer)
                log.info("replica sync interrupted", stream=self.stream, replica=state.node,
                         error=str(exc))
                state.synced = False
                await asyncio.sleep(RETRY_S)

    async def _sync_and_send(self, link: Link, state: ReplicaState) -> None:
        cursor = await self._sync(link, state)
        while not link.closed:
            if not state.synced:
                raise Resync(f"{state.node} refused a chunk, or this node stalled: it is synced "
                             "again")
            data, cursor = self.log.read_chunks(cursor, self.chunk_bytes)
            if data:
                await link.send_chunk(self.stream, self.epoch, data)
                continue
            self._appended.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_CHECK_S):  # and look again: another replica
                    await self._appended.wait()            # may have cleared it
        raise LinkError(f"link to {state.node} closed")

    async def _sync(self, link: Link, state: ReplicaState) -> shipping.Cursor:
        """The two calls of a sync; returns where shipping to the replica starts."""
        hello = await link.call(SYNC, {"stream": self.stream, "epoch": self.epoch})
        fence = hello.get("fenced")
        if isinstance(fence, int):
            self.fenced(state.node, fence)
            raise Resync(f"{state.node} is fenced at epoch {fence}, newer than {self.epoch}")
        agree = agreement(self.log, _ranges(hello), _int(hello, "first_offset"))
        body: dict[str, Any] = {"stream": self.stream, "epoch": self.epoch, "agree": agree}
        if agree < self.log.first_offset:  # retention here removed what it lacks
            agree = body["start"] = self.log.first_offset
        answer = await link.call(SYNC, body)
        state.next_offset, state.last_epoch = _int(answer, "next_offset"), _int(answer,
                                                                                "last_epoch")
        state.synced, state.link, state.confirming = True, link, False
        self._advance()
        self.on_contact()
        if self.committed >= 0:  # a replica that came back learns the commit point at once
            self._post_commit(state.node)
        return self.log.ship_from(agree)


def agreement(log_: Log, ranges: list[tuple[int, int]], first_offset: int) -> int:
    """Where a replica's log parts from `log_` (the leader's): the offset up to which every
    chunk of the replica is, byte for byte, the leader's. `ranges` are the replica's epochs
    with the offset after each one's last chunk (Log.epoch_ranges), `first_offset` its first.

    Chunks of one epoch are written once, by that epoch's leader, each after the one before, so
    two logs holding chunks of epoch e from the same offset agree until one's e-chunks end. The
    leader's e-chunks run from epoch_end(e - 1) to epoch_end(e); an epoch may hold nothing
    but an empty tracking chunk (`Log.mark_epoch`), so it starts and ends at one offset, and
    the leader must be asked whether it has the epoch at all, not whether its range is empty.
    A range the leader's retention already removed cannot be compared, and is taken as agreed
    (it was committed)."""
    mine = dict(log_.epoch_ranges())
    agree = first_offset
    for epoch, end in ranges:
        if end <= log_.first_offset:
            agree = end
            continue
        start = max(agree, log_.first_offset)
        if epoch not in mine or log_.epoch_end(epoch - 1) > start:
            return agree  # the leader has no chunk of this epoch, or others where it starts
        mine_to = mine[epoch]
        agree = min(end, mine_to)
        if agree < end:
            return agree
    return agree


class Resync(Exception):
    """A replica refused a chunk or the leader's epoch: its sender syncs it again."""


@dataclass
class ReplicaLog:
    log: Log
    epoch: int = -1  # the epoch of the last sync: chunks of any other epoch are refused
    leader: str = ""
    verified: bool = False  # the last sync cut what its leader does not have: chunks may come
    committed: int = -1  # what this replica's readers may read: announced and held here
    announced: int = -1  # the leader's last commit point
    expected: str = ""  # the node the stream's record names as leader ("": any)
    link: Link | None = None  # the leader's link, of the last sync
    on_commit: Callable[[int], None] = lambda _offset: None

    def advance(self) -> None:
        """The commit point here: the leader's, as far as this log holds it, once verified."""
        if not self.verified:
            return
        committed = min(self.announced, self.log.kept_next - 1)
        if committed > self.committed:
            self.committed = committed
            self.on_commit(committed)


class Replicas:
    """The stream logs this node holds as a replica, answering their leaders over the links."""

    def __init__(self, handlers: Handlers, syncer: Syncer = INLINE) -> None:
        self.syncer = syncer  # a chunk is acknowledged once kept as the log's policy says
        self.logs: dict[str, ReplicaLog] = {}
        self.shippers: dict[str, Shipper] = {}  # streams this node leads, for their acks
        handlers.on_request(SYNC, self._sync)
        handlers.on_request(ALIVE, self._alive)
        handlers.on_message(ACK, self._ack)
        handlers.on_message(COMMIT, self._commit)
        handlers.on_chunk(self._chunk)

    def add(self, stream: str, log_: Log,
            on_commit: Callable[[int], None] = lambda _offset: None,
            leader: str = "", epoch: int = -1) -> ReplicaLog:
        """Hold `log_` as a replica of `stream`. With `leader`, only that node may sync it (a
        deposed leader is refused even before it learns of the new epoch); `epoch` is the
        oldest epoch still accepted (the log's fence is raised to it)."""
        log_.raise_fence(epoch)
        replica = self.logs[stream] = ReplicaLog(log_, on_commit=on_commit, expected=leader)
        return replica

    def remove(self, stream: str) -> None:
        self.logs.pop(stream, None)

    def fence(self, stream: str, epoch: int) -> tuple[int, int] | None:
        """An election: from now on, nothing of an epoch older than `epoch` is taken (durably),
        and the current leader, if older, is verified no more. Returns the log's tail after
        that (it can no longer grow in an older epoch), or None if this node holds no replica
        of `stream`."""
        replica = self.logs.get(stream)
        if replica is None:
            return None
        replica.log.raise_fence(epoch)
        if replica.epoch < epoch:
            replica.verified = False
            if replica.link is not None and not replica.link.closed:  # tell the leader now,
                last_epoch, next_offset = replica.log.tail          # not at its next chunk
                with contextlib.suppress(LinkError):
                    replica.link.post(ACK, {"stream": stream, "epoch": replica.epoch,
                                            "next_offset": next_offset,
                                            "last_epoch": last_epoch, "fenced": epoch})
        return replica.log.tail

    async def _sync(self, link: Link, body: SyncRequest) -> dict[str, Any]:
        replica = self._replica(body)
        epoch = _int(body, "epoch")
        if replica.expected and link.peer_node != replica.expected:
            raise ValueError(f"{link.peer_node} does not lead this stream; "
                             f"{replica.expected} does")
        if "agree" not in body:
            return self._hello(replica, link, epoch)
        if epoch != replica.epoch or link.peer_node != replica.leader:
            raise ValueError("a sync's second call from another leader or epoch")
        self._cut(replica, body)
        replica.verified = True
        replica.advance()
        last_epoch, next_offset = replica.log.tail
        return {"last_epoch": last_epoch, "next_offset": next_offset}

    @staticmethod
    async def _alive(_link: Link, _body: object) -> dict[str, Any]:
        """A leader's node stalled: this answer, on the link it asked on, comes after anything
        this node sent on it before (a fenced acknowledgement included)."""
        return {}

    @staticmethod
    def _hello(replica: ReplicaLog, link: Link, epoch: int) -> dict[str, Any]:
        """The first call of a sync: take the leader's epoch, unverified, and answer this log's
        epochs; or, fenced at a newer epoch, say so."""
        if epoch < replica.log.fence:
            return {"fenced": replica.log.fence}
        replica.log.raise_fence(epoch)
        replica.epoch, replica.leader, replica.verified = epoch, link.peer_node, False
        replica.link = link
        return {"ranges": replica.log.epoch_ranges(), "first_offset": replica.log.first_offset}

    @staticmethod
    def _cut(replica: ReplicaLog, body: SyncRequest) -> None:
        """The second call: cut from where the leader says the logs part."""
        log_ = replica.log
        agree, start = _offset(body, "agree"), _offset(body, "start")
        if agree is None:
            raise ValueError("agree must be a non-negative integer")
        if start is not None and (start > log_.next_offset or agree < log_.first_offset):
            log.info("replica starts again at the leader's first offset",
                     offset=start, next_offset=log_.next_offset)
            log_.reset_to(start)
            return
        if agree <= min(replica.committed, log_.next_offset - 1):  # never: a committed chunk
            # is on every later leader
            raise ValueError(f"the leader would cut offset {agree}, committed here")
        if agree < log_.next_offset:
            log.info("truncating a replica's tail the leader does not have",
                     offset=agree, next_offset=log_.next_offset)
        log_.truncate_from(agree)

    async def _chunk(self, link: Link, chunk: Chunk) -> None:
        replica = self.logs.get(chunk.stream)
        if (replica is None or not replica.verified or chunk.epoch != replica.epoch
                or link.peer_node != replica.leader):
            log.warning("chunk refused: not from this stream's verified leader",
                        stream=chunk.stream, epoch=chunk.epoch, peer_node=link.peer_node)
            if replica is not None and chunk.epoch < replica.log.fence:
                self._post_ack(link, chunk, replica, fenced=replica.log.fence)
            return
        try:
            replica.log.append_chunks(chunk.data)
        except BadChunk as exc:
            log.warning("chunk refused; asking the leader to sync again", stream=chunk.stream,
                        reason=str(exc))
            replica.verified = False  # nothing more until the leader syncs again, as asked
            self._post_ack(link, chunk, replica, resync=True)
            return

        def kept(ok: bool) -> None:  # fsynced, if the log's policy says so (a quorum queue's)
            if ok:
                self._post_ack(link, chunk, replica)
                replica.advance()

        self.syncer.sync(replica.log, kept)

    @staticmethod
    def _post_ack(link: Link, chunk: Chunk, replica: ReplicaLog, **extra: int | bool) -> None:
        last_epoch, next_offset = replica.log.tail[0], replica.log.kept_next
        with contextlib.suppress(LinkError):
            link.post(ACK, {"stream": chunk.stream, "epoch": chunk.epoch,
                            "next_offset": next_offset, "last_epoch": last_epoch, **extra})

    async def _ack(self, link: Link, body: AckMessage) -> None:
        shipper = self.shippers.get(str(body.get("stream")))
        if shipper is None:
            return
        fence = body.get("fenced")
        if isinstance(fence, int) and not isinstance(fence, bool):
            shipper.fenced(link.peer_node, fence)
            return
        shipper.acked(link.peer_node, _int(body, "epoch"), _int(body, "next_offset"),
                      _int(body, "last_epoch"), resync=body.get("resync") is True)

    async def _commit(self, link: Link, body: CommitMessage) -> None:
        replica = self.logs.get(str(body.get("stream")))
        if (replica is None or not replica.verified or _int(body, "epoch") != replica.epoch
                or link.peer_node != replica.leader):
            return
        replica.announced = max(replica.announced, _int(body, "committed"))
        replica.advance()

    def _replica(self, body: object) -> ReplicaLog:
        stream = body.get("stream") if isinstance(body, dict) else None
        replica = self.logs.get(stream) if isinstance(stream, str) else None
        if replica is None:
            raise LookupError(f"this node holds no replica of stream {stream!r}")
        return replica


def _ranges(body: object) -> list[tuple[int, int]]:
    ranges = body.get("ranges") if isinstance(body, dict) else None
    if not isinstance(ranges, list):
        raise ValueError("ranges must be a list")
    out = []
    for item in ranges:
        if (not isinstance(item, list) or len(item) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)):
            raise ValueError("each range is [epoch, end offset]")
        out.append((item[0], item[1]))
    return out


def _offset(body: Mapping[str, object], key: str) -> int | None:
    """An optional offset of a sync: None when absent or not a non-negative integer."""
    value = body.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _int(body: object, key: str) -> int:
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer")
    return value
