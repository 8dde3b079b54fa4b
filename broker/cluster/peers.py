"""The links between cluster nodes: one node-to-node link per pair of running nodes.

Role: in cluster mode, listen on the cluster port (`LinkServer`), follow the running nodes
through etcd (a range read of `/leveret/<cluster>/nodes/`, then a watch from the revision after
it) and keep exactly one `Link` to each other running node. Of a pair, the node whose name sorts
lower dials and the other accepts; a link the rule does not expect (the higher name dialing) is
closed at once. The dialer reconnects with a backoff (0.2 s doubling to 5 s, and at once when
the peer's record is put again) for as long as the peer's record is live; either side drops the
link when the record goes (lease expired, node stopped) or names another process (a restart).
While this node is out of the cluster (membership's lease lost) it closes every link, refuses
new ones and dials nobody, until it rejoins.

Callers register their kinds on `handlers` before `start()`: until then the node refuses links
in the handshake (`PeerStarting`), and a dialer refused so tries again after 0.2 s, so that no
frame arrives before its handler and links come up as soon as both nodes have started.
`link_to(node)` gives the link to a node, or None; `wait_linked(nodes, timeout_s)` waits for
links (a declaration placing a stream on nodes still starting); `read_records()` learns the
running nodes before `start()`. The first kind is `node.ping`: each
side asks the other's name, version and the etcd revision it has applied, once a link is up.

It must not know AMQP, the model or the broker; it knows etcd only through the client and the
node records' JSON (`advertise_host`, `cluster_port`, `started_at`, `version`).

Threading: one event loop. `listen`, `start` and `close` are its coroutines, `set_in_cluster`
a plain call from it (membership's listener); the watcher, the dialers and the pings are its
tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Coroutine, Iterable
from typing import Any

from leveret.broker.cluster.etcd import EtcdClient, EtcdException, RangeResult, WatchEvent
from leveret.broker.cluster.link import (
    Handlers,
    HandshakeError,
    Link,
    LinkConfig,
    LinkError,
    LinkServer,
    PeerStarting,
    connect,
)
from leveret.broker.cluster.membership import ClusterKeys
from leveret.broker.process import listen, logs

log = logs.get("leveret.cluster.peers")
PING = "node.ping"
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 5.0
PING_TIMEOUT_S = 5.0
RESYNC_PAUSE_S = 1.0  # after the watch fails: read the records again this long after


def endpoint(record: dict[str, Any]) -> tuple[str, int, Any]:
    """Where a node's record says it listens, and which process it names (its start time)."""
    port = record.get("cluster_port")
    return (str(record.get("advertise_host") or ""), port if isinstance(port, int) else 0,
            record.get("started_at"))


class ClusterLinks:
    """This node's links to the other running nodes, by node name."""

    def __init__(self, client: EtcdClient, cluster: str, node: str, secret: bytes, *,
                 version: str, host: str, port: int,
                 config: LinkConfig | None = None) -> None:
        self.client = client
        self.node = node
        self.version = version
        self.keys = ClusterKeys(cluster)
        self.config = config or LinkConfig(cluster, node, secret)
        self.handlers = Handlers()
        self.handlers.on_request(PING, self._answer_ping)
        self.links: dict[str, Link] = {}
        self.records: dict[str, dict[str, Any]] = {}  # the other nodes' live records
        self.pings: dict[str, dict[str, Any]] = {}  # what each linked peer answered to a ping
        self.revision = 0  # the etcd revision of the last record change applied
        self.in_cluster = False
        self.started = False
        # nodes linked at least once since their record appeared: a node whose link is down
        # now was lost, rather than still starting (stream failover counts on it)
        self.ever_linked: set[str] = set()
        self._outbound: set[Link] = set()
        # a node refuses links until it has started: its handlers are registered by then
        self._server = LinkServer(self.config, self.handlers, self._accepted, host=host,
                                  port=port, admit=lambda: self.started)
        self._first: RangeResult | None = None  # read_records' answer, for start's watch
        self._linked = asyncio.Event()  # set, and replaced, whenever a link is adopted
        self._dialers: dict[str, asyncio.Task[None]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def active(self) -> bool:
        return self.started and self.in_cluster

    def dials(self, peer: str) -> bool:
        """Of a pair, the node whose name sorts lower dials the other."""
        return self.node < peer

    def link_to(self, node: str) -> Link | None:
        link = self.links.get(node)
        return link if link is not None and not link.closed else None

    async def listen(self) -> None:
        """Bind the cluster port (OSError if it cannot). Links are refused until `start`."""
        await self._server.start()

    async def read_records(self) -> None:
        """Read the node records once, before `start` (whose watch goes on from there), so
        that the running nodes are known from the moment the node serves clients, before
        any link is up. Nothing is dialed yet."""
        try:
            self._first = await self.client.range(self.keys.nodes, prefix=True)
        except EtcdException as exc:
            log.warning("cannot read the node records yet; retrying", error=str(exc))
            return
        self.revision = self._first.revision
        self._resync(self._first)

    async def read_new_records(self) -> None:
        """Read the node records now and take the ones the watch has not brought yet (a
        declaration counts every node live in etcd at this moment; a node that joined a moment
        ago may not have reached this one's watch). Removals stay the watch's."""
        result = await self.client.range(self.keys.nodes, prefix=True)
        for kv in result.kvs:
            name = kv.key.decode(errors="replace")[len(self.keys.nodes):]
            if name not in self.records:
                self._peer_up(name, _record(kv.value))

    async def start(self) -> None:
        """Follow the node records and keep the links (after the node has joined)."""
        first, self._first = self._first, None
        if first is None:
            try:  # the first read here: the node starts knowing its peers, if etcd answers
                first = await self.client.range(self.keys.nodes, prefix=True)
                self.revision = first.revision
            except EtcdException as exc:
                log.warning("cannot read the node records yet; retrying", error=str(exc))
        self.started = True
        self._watcher = asyncio.create_task(self._watch(first), name="cluster-peers")

    def set_in_cluster(self, in_cluster: bool) -> None:
        """Membership's listener: out of the cluster, close every link and dial nobody."""
        self.in_cluster = in_cluster
        if in_cluster:
            for name in self.records:
                self._ensure_dialer(name)
            return
        dialers, self._dialers = self._dialers, {}
        for task in dialers.values():
            task.cancel()
        for link in list(self.links.values()):
            self._close(link, "this node lost its etcd lease")

    async def close(self) -> None:
        """Stop following, dialing and accepting; close every link."""
        self.started = False
        tasks = [t for t in (self._watcher, *self._dialers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await self._server.close()
        for link in list(self.links.values()):
            await link.close("node stopping")
        if tasks:
            await asyncio.wait(tasks)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def wait_linked(self, nodes: Iterable[str], timeout_s: float) -> set[str]:
        """Wait, at most `timeout_s`, until this node has a link to each of `nodes` (a dialer
        waiting out its backoff is woken); the nodes still without one."""
        wanted = set(nodes) - {self.node}
        for name in wanted:
            if name in self._wake:
                self._wake[name].set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            missing = {name for name in wanted if self.link_to(name) is None}
            if not missing or loop.time() >= deadline:
                return missing
            await _wait(self._linked, deadline - loop.time())

    def link_views(self) -> list[dict[str, Any]]:
        """The links as /api/nodes shows them (RabbitMQ's `cluster_links`, plus what the peer
        answered to its ping)."""
        views = []
        for name, link in sorted(self.links.items()):
            peer_addr, peer_port = _address(link.get_extra_info("peername"))
            sock_addr, sock_port = _address(link.get_extra_info("sockname"))
            ping = self.pings.get(name, {})
            views.append({"name": name, "peer_addr": peer_addr, "peer_port": peer_port,
                          "sock_addr": sock_addr, "sock_port": sock_port,
                          "direction": "outbound" if link in self._outbound else "inbound",
                          "peer_version": ping.get("version"),
                          "peer_revision": ping.get("revision")})
        return views

    # -- following the records -----------------------------------------------------------------

    async def _watch(self, first: RangeResult | None) -> None:
        prefix = self.keys.nodes
        while True:
            try:
                result = first or await self.client.range(prefix, prefix=True)
                first = None
                self._resync(result)
                async for event in self.client.watch(prefix, prefix=True,
                                                     start_revision=result.revision + 1):
                    self._apply(event)
            except EtcdException as exc:
                log.debug("node records: watch interrupted; reading them again", error=str(exc))
            await asyncio.sleep(RESYNC_PAUSE_S)

    def _resync(self, result: RangeResult) -> None:
        prefix = self.keys.nodes
        seen: dict[str, dict[str, Any]] = {}
        for kv in result.kvs:
            seen[kv.key.decode(errors="replace")[len(prefix):]] = _record(kv.value)
        for name in set(self.records) - set(seen):
            self._peer_down(name)
        for name, record in seen.items():
            self._peer_up(name, record)
        self.revision = max(self.revision, result.revision)

    def _apply(self, event: WatchEvent) -> None:
        name = event.kv.key.decode(errors="replace")[len(self.keys.nodes):]
        if event.type == "PUT":
            self._peer_up(name, _record(event.kv.value))
        else:
            self._peer_down(name)
        self.revision = max(self.revision, event.kv.mod_revision)

    def _peer_up(self, name: str, record: dict[str, Any]) -> None:
        if name == self.node:
            return
        old = self.records.get(name)
        self.records[name] = record
        link = self.links.get(name)
        if old is not None and link is not None and endpoint(old) != endpoint(record):
            self._close(link, "the peer restarted or moved")
        if self.active and self.dials(name):
            self._ensure_dialer(name)
            self._wake[name].set()

    def _peer_down(self, name: str) -> None:
        if self.records.pop(name, None) is None:
            return
        self.ever_linked.discard(name)
        dialer = self._dialers.pop(name, None)
        if dialer is not None:
            dialer.cancel()
        link = self.links.get(name)
        if link is not None:
            self._close(link, "the peer's record is gone from etcd")

    # -- dialing and accepting -----------------------------------------------------------------

    def _ensure_dialer(self, name: str) -> None:
        if not self.dials(name) or name == self.node:
            return
        task = self._dialers.get(name)
        if task is None or task.done():
            self._wake.setdefault(name, asyncio.Event())
            self._dialers[name] = asyncio.create_task(self._dial(name), name=f"dial-{name}")

    async def _dial(self, name: str) -> None:
        """Keep a link to `name` while its record is live and this node is in the cluster."""
        loop = asyncio.get_running_loop()
        backoff = BACKOFF_MIN_S
        wake = self._wake[name]
        while self.active and name in self.records:
            record = self.records[name]
            host, port, _ = endpoint(record)
            wake.clear()
            try:
                link = await connect(host, port, self.config, self.handlers)
            except PeerStarting:  # it links as soon as it has started: try again soon
                log.debug("a peer is starting; retrying", peer_node=name, retry_s=BACKOFF_MIN_S)
                await _wait(wake, BACKOFF_MIN_S)
                continue
            except (OSError, TimeoutError, HandshakeError) as exc:
                level = log.warning if isinstance(exc, HandshakeError) else log.debug
                level("cannot link to a peer; retrying", peer_node=name, peer=f"{host}:{port}",
                      error=str(exc) or type(exc).__name__, retry_s=backoff)
                await _wait(wake, backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            if not self.active or self.records.get(name) is not record:
                await link.close("the peer's record changed while linking")
                continue
            up_at = loop.time()
            self._outbound.add(link)
            self._adopt(name, link)
            await link.wait_closed()
            if loop.time() - up_at >= BACKOFF_MAX_S:
                backoff = BACKOFF_MIN_S
            await _wait(wake, backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _accepted(self, link: Link) -> None:
        name = link.peer_node
        if not self.active:  # (before `start` the handshake refused it: PeerStarting)
            await link.close("this node is not in the cluster")
        elif self.dials(name):
            await link.close(f"'{self.node}' dials '{name}', not the other way round")
        else:
            self._adopt(name, link)

    def _adopt(self, name: str, link: Link) -> None:
        old = self.links.get(name)
        if old is not None and old is not link:
            self._close(old, "replaced by a new link")
        self.links[name] = link
        self.ever_linked.add(name)
        self._linked.set()
        self._linked = asyncio.Event()
        link.on_close(lambda closed: self._forget(name, closed))
        if link in self._outbound:  # the LinkServer logs the links it accepts
            log.info("cluster link up", peer_node=name, peer=link.peer_address,
                     direction="outbound")
        self._spawn(self._ping(name, link))

    def _forget(self, name: str, link: Link) -> None:
        self._outbound.discard(link)
        if self.links.get(name) is link:
            del self.links[name]
            self.pings.pop(name, None)
            log.info("cluster link down", peer_node=name, reason=link.close_reason)

    async def _ping(self, name: str, link: Link) -> None:
        try:
            answer = await link.call(PING, {"name": self.node}, timeout=PING_TIMEOUT_S)
        except LinkError as exc:
            if not link.closed:
                log.warning("cluster link: the peer did not answer a ping", peer_node=name,
                            error=str(exc))
                await link.close("no answer to node.ping")
            return
        if self.links.get(name) is link and isinstance(answer, dict):
            self.pings[name] = answer

    async def _answer_ping(self, link: Link, body: object) -> dict[str, Any]:
        return {"name": self.node, "version": self.version, "revision": self.revision}

    def _close(self, link: Link, reason: str) -> None:
        self._spawn(link.close(reason))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _address(info: object) -> tuple[str, int]:
    """(address, port) of a socket name; an IPv4-mapped address as the IPv4 one."""
    if isinstance(info, tuple) and len(info) >= 2:
        return listen.unmapped(str(info[0])), int(info[1])
    return "", 0


def _record(value: bytes) -> dict[str, Any]:
    try:
        record = json.loads(value)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Sleep `timeout_s`, or less if `event` is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
