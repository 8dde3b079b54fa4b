"""A deterministic simulation of one replicated stream: the real replication state machines
(`Shipper`, `Replicas`, the election's rule and fencing) on real storage logs, joined by a fake
network whose every message the test delivers, drops or holds back, and a fake etcd that keeps
the stream's leadership key with a mod revision.

What is real: broker/cluster/replication.py (the leader's shipping, the replica's sync, chunk
and commit handling), the election (broker/cluster/stream_election.py), storage's Log. What is
fake: the link (a FIFO queue per direction, as TCP is, that the test drains one message at a
time), etcd (one key, compare-and-set), and time (no step waits on a clock).

A node's role follows the leadership record as the broker's topology sync applies it, but each
node applies a new record only when the test says so (`apply`), as etcd's watch may reach one
node late; a node that is `crash`ed loses everything but its log's files (kill -9: the page
cache survives) and comes back with `restart`.

Invariants (docs/REPLICATION.md), checked by `check()` after every step:
1. every publish that was confirmed is held, byte for byte, by a majority of members;
2. the committed parts of any two members' logs agree (one is a prefix of the other);
3. a member's commit point never covers a chunk that the history of commits does not have
   (no member serves or counts as committed an entry it has not verified);
4. the commit history never changes: once an offset was committed with some bytes, every
   member that later commits it holds the same bytes.

Asyncio: one event loop for every node, stepped by the test; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leveret.broker.cluster.link import CallTimeout, Chunk, Handlers, LinkClosed, RemoteError
from leveret.broker.cluster.replication import Replicas, Shipper, quorum
from leveret.broker.cluster.stream_leadership import fenced_election, needs_new_epoch
from leveret.storage import Log, LogConfig

STREAM = "vh/stream"
TAIL = "stream.tail"
CALL_TIMEOUT_S = 30.0  # the link's default (LinkConfig.call_timeout_s)


@dataclass
class Leadership:
    """The stream's leadership key in the fake etcd."""

    leader: str
    epoch: int
    members: tuple[str, ...]
    revision: int = 1


class FakeEtcd:
    def __init__(self, members: tuple[str, ...]) -> None:
        self.key = Leadership(members[0], 1, members)
        self.revision = 1

    def get(self) -> Leadership:
        return Leadership(self.key.leader, self.key.epoch, self.key.members, self.key.revision)

    def swap(self, seen: Leadership, leader: str, epoch: int) -> bool:
        """A txn comparing the key's mod revision with the one read."""
        if seen.revision != self.key.revision:
            return False
        self.revision += 1
        self.key = Leadership(leader, epoch, self.key.members, self.revision)
        return True


@dataclass
class Message:
    kind: str  # "request", "reply", "post", "chunk"
    body: Any
    call: asyncio.Future[Any] | None = None


class Connection:
    """A link between two nodes: a FIFO per direction, drained by `Network.deliver`."""

    def __init__(self, net: Network, a: str, b: str) -> None:
        self.net = net
        self.queues: dict[str, deque[Message]] = {a: deque(), b: deque()}  # by receiver
        self.ends = {a: FakeLink(self, a, b), b: FakeLink(self, b, a)}
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for end in self.ends.values():
            for future in end.calls:
                if not future.done():
                    future.set_exception(LinkClosed("cut by the simulation"))
        for queue in self.queues.values():
            queue.clear()


class FakeLink:
    """One end of a Connection, with the methods of broker/cluster/link.py's Link that
    replication uses."""

    def __init__(self, connection: Connection, me: str, peer: str) -> None:
        self.connection = connection
        self.me = me
        self.peer_node = peer
        self.calls: list[asyncio.Future[Any]] = []

    @property
    def closed(self) -> bool:
        return self.connection.closed

    def _queue(self, message: Message) -> None:
        if self.closed:
            raise LinkClosed("cut by the simulation")
        self.connection.queues[self.peer_node].append(message)

    async def call(self, kind: str, body: Any = None, timeout: float | None = None) -> Any:
        timeout_s = CALL_TIMEOUT_S if timeout is None else timeout
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls.append(future)
        self._queue(Message("request", (kind, _wire(body)), future))
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise CallTimeout(kind, timeout_s) from None
        finally:
            self.calls.remove(future)

    def post(self, kind: str, body: Any = None) -> None:
        self._queue(Message("post", (kind, _wire(body))))

    async def send(self, kind: str, body: Any = None) -> None:
        self.post(kind, body)

    async def send_chunk(self, stream: str, epoch: int, data: bytes | memoryview) -> None:
        self._queue(Message("chunk", Chunk(epoch, stream, bytes(data))))


class Network:
    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.handlers: dict[str, Handlers] = {}
        self.connections: dict[frozenset[str], Connection] = {}
        self.cut: set[frozenset[str]] = set()
        self.tasks: set[asyncio.Task[Any]] = set()

    def link(self, me: str, peer: str) -> FakeLink | None:
        """The link between two running nodes that no fault cuts, or None."""
        pair = frozenset((me, peer))
        if pair in self.cut or me == peer or peer not in self.handlers:
            return None
        connection = self.connections.get(pair)
        if connection is None or connection.closed:
            connection = self.connections[pair] = Connection(self, me, peer)
        return connection.ends[me]

    def sever(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        self.cut.add(pair)
        connection = self.connections.pop(pair, None)
        if connection is not None:
            connection.close()

    def heal(self, a: str, b: str) -> None:
        self.cut.discard(frozenset((a, b)))

    def isolate(self, node: str) -> None:
        for other in self.nodes:
            if other != node:
                self.sever(node, other)

    def pending(self) -> list[tuple[frozenset[str], str]]:
        """(connection, receiver) of every direction with a message waiting."""
        return [(pair, to) for pair, connection in sorted(self.connections.items(),
                                                           key=lambda kv: sorted(kv[0]))
                for to, queue in sorted(connection.queues.items()) if queue]

    def deliver(self, index: int) -> None:
        """The next message on the index-th direction that has one."""
        waiting = self.pending()
        if not waiting:
            return
        pair, to = waiting[index % len(waiting)]
        connection = self.connections[pair]
        message = connection.queues[to].popleft()
        handlers = self.handlers.get(to)
        if handlers is None:
            return
        link = connection.ends[to]
        self._spawn(self._handle(handlers, link, message))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, handlers: Handlers, link: FakeLink, message: Message) -> None:
        if message.kind == "reply":
            future, (ok, value) = message.call, message.body
            assert future is not None
            if not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            return
        if message.kind == "chunk":
            assert handlers.chunk is not None
            await handlers.chunk(link, message.body)  # type: ignore[arg-type]
            return
        kind, body = message.body
        if message.kind == "post":
            handler = handlers.messages.get(kind)
            if handler is not None:
                await handler(link, body)  # type: ignore[arg-type]
            return
        request = handlers.requests[kind]
        try:
            reply: tuple[bool, Any] = (True, _wire(await request(link, body)))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 (as the link: the caller gets RemoteError)
            reply = (False, RemoteError(kind, type(exc).__name__, str(exc)))
        with contextlib.suppress(LinkClosed):
            if not link.closed:
                link.connection.queues[link.peer_node].append(Message("reply", reply,
                                                                      message.call))


@dataclass
class Node:
    name: str
    directory: Path
    log: Log | None = None
    replicas: Replicas | None = None
    shipper: Shipper | None = None
    role: str = ""
    epoch: int = 0  # the epoch of the record it applied
    leader: str = ""  # the leader of the record it applied
    fenced_at: int = 0  # as leader: the newest fence a replica answered
    up: bool = True
    committed: int = -1  # the commit point its readers see
    confirmed: int = -1  # as leader: the publishes confirmed up to here
    published: list[bytes] = field(default_factory=list)


class Simulation:
    """Three (or five) nodes replicating one stream; each method is one step a test takes."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.names = [f"n{i}" for i in range(1, size + 1)]
        self.net = Network(self.names)
        self.etcd = FakeEtcd(tuple(self.names))
        self.nodes = {name: Node(name, root / name) for name in self.names}
        self.confirmed: dict[int, bytes] = {}  # offset -> record, as its publisher was told
        self.history: dict[int, bytes] = {}  # offset -> record, the first time it committed
        self.sequence = 0
        self.violations: list[str] = []
        for node in self.nodes.values():
            self._boot(node)

    # -- steps ----------------------------------------------------------------------------

    def publish(self, name: str, count: int = 1) -> None:
        """A publish reaching the node that believes it leads (others forward: not modelled)."""
        node = self.nodes[name]
        if not node.up or node.role != "leader" or node.shipper is None or node.log is None:
            return
        if not node.shipper.may_write():
            return  # the writer waits (then forwards or nacks): nothing is written
        records = []
        for _ in range(count):
            self.sequence += 1
            records.append(f"m{self.sequence}".encode())
        node.log.append(records)
        node.shipper.appended()

    def deliver(self, index: int) -> None:
        self.net.deliver(index)

    def sever(self, a: str, b: str) -> None:
        if a != b:
            self.net.sever(a, b)

    def heal(self, a: str, b: str) -> None:
        self.net.heal(a, b)

    def elect(self, candidate: str) -> None:
        """The candidate's failover: as stream_failover does it, through the election core."""
        node = self.nodes[candidate]
        if not node.up or node.role == "leader":
            return
        self._spawn(self._elect(node))

    def apply(self, name: str) -> None:
        """The node's topology sync applies the queue record, which names the leader that the
        leadership key names (an election writes both in one txn)."""
        node = self.nodes[name]
        if not node.up:
            return
        current = self.etcd.get()
        if node.role and node.leader == current.leader:
            return  # (a leader taking the next epoch changes the leadership key only)
        self._take_role(node, current)

    def crash(self, name: str) -> None:
        node = self.nodes[name]
        if not node.up:
            return
        node.up = False
        self._stop_role(node)
        self.net.handlers.pop(name, None)
        self.net.isolate(name)
        assert node.log is not None
        node.log.close()
        node.log = None

    def restart(self, name: str) -> None:
        node = self.nodes[name]
        if node.up:
            return
        node.up = True
        for other in self.names:
            if other != name and self.nodes[other].up:
                self.net.heal(name, other)
        self._boot(node)

    def wait(self, seconds: float) -> None:
        """Time passes (the loop's virtual clock): retry pauses and timeouts come due."""
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualClockLoop)
        loop.advance(seconds)

    async def settle(self) -> None:
        """Let every task run until none can go further without a delivery."""
        for _ in range(40):
            await asyncio.sleep(0)

    # -- invariants ------------------------------------------------------------------------

    def check(self) -> None:
        logs = {name: self._committed_records(node) for name, node in self.nodes.items()}
        for name, records in logs.items():
            for offset, record in records.items():
                first = self.history.setdefault(offset, record)
                if first != record:
                    self.violations.append(
                        f"{name} counts offset {offset} committed as {record!r}; "
                        f"it was committed as {first!r}")
        for offset, record in self.confirmed.items():
            holders = [name for name, node in self.nodes.items()
                       if self._holds(node, offset, record)]
            if len(holders) < quorum(len(self.names)):
                self.violations.append(f"confirmed offset {offset} ({record!r}) is held by "
                                       f"{holders} only")

    def converged(self) -> bool:
        """Every member holds the same log up to the leader's commit point, and it commits."""
        leader = self.nodes[self.etcd.get().leader]
        if not leader.up or leader.role != "leader":
            return False
        want = self._committed_records(leader)
        return all(self._committed_records(node) == want for node in self.nodes.values()
                   if node.up) and leader.committed >= leader.log.next_offset - 1  # type: ignore[union-attr]

    def describe(self) -> str:
        """Each node's role, log tail and commit point, for a failing example's message."""
        lines = [f"etcd: {self.etcd.get()}"]
        for node in self.nodes.values():
            tail = node.log.tail if node.log is not None else None
            replica = node.replicas.logs.get(STREAM) if node.replicas is not None else None
            state = (f" replica epoch={replica.epoch} leader={replica.leader}"
                     if replica is not None else "")
            lines.append(f"{node.name}: up={node.up} role={node.role} epoch={node.epoch} "
                         f"tail={tail} committed={node.committed}{state}")
        return "\n".join(lines)

    # -- roles, as broker/cluster/stream_replication.py takes them ---------------------------

    def _boot(self, node: Node) -> None:
        node.log = Log.open(node.directory, LogConfig())
        handlers = Handlers()
        self.net.handlers[node.name] = handlers
        node.replicas = Replicas(handlers)
        handlers.on_request(TAIL, self._tail_handler(node.replicas))
        node.role, node.epoch, node.committed, node.fenced_at = "", 0, -1, 0
        self._take_role(node, self.etcd.get())

    @staticmethod
    def _tail_handler(replicas: Replicas) -> Any:
        """stream_failover's answer to a fenced tail request."""
        async def tail(_link: Any, body: Any) -> dict[str, int]:
            found = replicas.fence(body["stream"], body["fence"])
            if found is None:
                raise LookupError("no replica of this stream here")
            return {"epoch": found[0], "next_offset": found[1]}
        return tail

    def _take_role(self, node: Node, record: Leadership) -> None:
        self._stop_role(node)
        node.epoch, node.leader = record.epoch, record.leader
        assert node.log is not None and node.replicas is not None
        if record.leader == node.name:
            node.role = "leader"
            self._spawn(self._lead(node, record))
        else:
            node.role = "replica"

            def committed(offset: int, node: Node = node) -> None:
                node.committed = max(node.committed, offset)

            node.replicas.add(STREAM, node.log, on_commit=committed, leader=record.leader)

    async def _lead(self, node: Node, record: Leadership) -> None:
        """As StreamReplication._start_shipping: the leadership's epoch, or the next one when
        `needs_new_epoch`, then a Shipper; a fenced replica makes it do this again."""
        assert node.log is not None and node.replicas is not None
        log_, replicas = node.log, node.replicas
        current = self.etcd.get()
        if current.leader != node.name:
            return  # another node leads: its record will move this one on
        if needs_new_epoch(current.epoch, log_.tail[0], node.fenced_at):
            if not self.etcd.swap(current, node.name, current.epoch + 1):
                return
            current = self.etcd.get()

        def committed(offset: int) -> None:
            node.committed = max(node.committed, offset)
            self._confirm(node, offset)

        def fenced(fence: int) -> None:
            node.fenced_at = max(node.fenced_at, fence)
            if node.shipper is shipper:
                self._stop_role(node)
                node.role = "leader"
                self._spawn(self._lead(node, record))

        shipper = Shipper(STREAM, log_, current.epoch,
                          [m for m in record.members if m != node.name],
                          lambda peer: self.net.link(node.name, peer), on_commit=committed,
                          on_fenced=fenced)
        node.shipper = shipper
        replicas.shippers[STREAM] = shipper
        shipper.start()

    def _stop_role(self, node: Node) -> None:
        if node.shipper is not None:
            shipper, node.shipper = node.shipper, None
            if node.replicas is not None:
                node.replicas.shippers.pop(STREAM, None)
            shipper.stop()
        if node.replicas is not None:
            node.replicas.remove(STREAM)
        node.role = ""

    def _confirm(self, node: Node, offset: int) -> None:
        """The leader's commit point reached `offset`: its publishers are confirmed."""
        assert node.log is not None
        for record_offset, record in self._records(node.log, offset).items():
            self.confirmed.setdefault(record_offset, record)

    async def _elect(self, node: Node) -> None:
        """The candidate's failover, as stream_failover's `_elect` once a quorum lost the
        leader: read the leadership, fence a quorum at its next epoch and compare tails
        (stream_leadership.fenced_election), and the chosen candidate writes the next epoch
        with one compare-and-set."""
        current = self.etcd.get()
        if current.leader != node.leader or node.replicas is None:
            return  # already elected, as far as the candidate's record says

        async def ask(member: str, fence: int) -> tuple[int, int] | None:
            link = self.net.link(node.name, member)
            if link is None:
                return None
            with contextlib.suppress(LinkClosed, RemoteError, CallTimeout):
                answer = await link.call(TAIL, {"stream": STREAM, "fence": fence})
                return int(answer["epoch"]), int(answer["next_offset"])
            return None

        replicas = node.replicas
        chosen = await fenced_election(node.name, current.members, current.leader,
                                       current.epoch + 1,
                                       lambda fence: replicas.fence(STREAM, fence), ask)
        if chosen == node.name:
            self.etcd.swap(current, node.name, current.epoch + 1)

    def _spawn(self, coro: Any) -> None:
        self.net._spawn(coro)

    # -- reading logs ----------------------------------------------------------------------

    def _committed_records(self, node: Node) -> dict[int, bytes]:
        if node.log is None:
            return {}
        return self._records(node.log, node.committed)

    @staticmethod
    def _records(log_: Log, upto: int) -> dict[int, bytes]:
        """The records of `log_` at offsets up to `upto`, read from its files."""
        out: dict[int, bytes] = {}
        if upto < log_.first_offset:
            return out
        cursor = log_.ship_from(log_.first_offset)
        while True:
            data, cursor = log_.read_chunks(cursor, 1 << 20)
            if not data:
                return out
            for offset, record in _decode(data):
                if offset > upto:
                    return out
                out[offset] = record

    def _holds(self, node: Node, offset: int, record: bytes) -> bool:
        if node.log is None:
            node_log = Log.open(node.directory, LogConfig())
            try:
                return self._records(node_log, offset).get(offset) == record
            finally:
                node_log.close()
        return self._records(node.log, offset).get(offset) == record


def _wire(body: Any) -> Any:
    """A body as the peer reads it: the link carries JSON (tuples arrive as lists)."""
    return json.loads(json.dumps(body))


def _decode(data: bytes) -> list[tuple[int, bytes]]:
    from leveret.storage import chunk as ck

    out = []
    view = memoryview(data)
    while view:
        header = ck.decode_header(view)
        body = bytes(view[header.header_size:header.total_size])
        for i, record in enumerate(ck.decode_records(header, body)):
            out.append((header.first_offset + i, bytes(record)))
        view = view[header.total_size:]
    return out


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test moves it (`advance`): every sleep,
    retry pause and timeout of the code under test is then a step the test schedules. The test
    keeps a task ready whenever it runs the loop, so the loop never blocks on its selector."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
