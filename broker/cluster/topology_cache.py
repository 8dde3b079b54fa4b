"""Every node's copy of the cluster's topology, kept current by an etcd watch.

Role: `start()` loads every topology key with one range read at a revision R, then follows a
watch from R + 1. The cache keeps plain records per kind (`topology_records`), keyed by their
etcd key, and `revision`, the last etcd revision it has fully applied. `wait_for(revision)`
returns once that revision is applied here: a declaring node has its peers wait for its txn's
revision before it sends the `-ok`, so a declaration is visible on every node first.
`on_put`/`on_delete` callbacks (per kind) let the broker apply each change to its model, in
revision order; the initial load calls `on_put` for every record. A compacted watch reloads by
range and reports the difference through the same callbacks. When etcd cannot be reached the
cache keeps what it has and keeps trying.

Applied means applied as a whole: the events of one txn arrive in one watch message and are
all applied before the task next waits for I/O; `revision` moves (and waiters wake) in a
`call_soon` after them, so nobody sees half a txn as applied.

It must not know the model's runtime classes, sessions or AMQP. Asyncio: one event loop;
callbacks run in the cache's task and must not block or raise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from leveret.broker.cluster.etcd import EtcdClient, EtcdCompacted, EtcdException
from leveret.broker.cluster.etcd_types import KeyValue, WatchEvent
from leveret.broker.cluster.topology_keys import KINDS, Kind, TopologyKeys
from leveret.broker.cluster.topology_records import (
    BindingRecord,
    ExchangeRecord,
    QueueRecord,
    Record,
    VHostRecord,
    decode,
)
from leveret.broker.process import logs

log = logs.get("leveret.cluster.topology")
Callback = Callable[[Record], None]
RETRY_PAUSE_S = 1.0


class CacheClosed(Exception):
    """The cache was closed while someone waited for a revision."""


class TopologyCache:
    def __init__(self, client: EtcdClient, keys: TopologyKeys) -> None:
        self.client = client
        self.keys = keys
        self.records: dict[Kind, dict[bytes, Record]] = {kind: {} for kind in KINDS}
        self.revision = 0  # the last revision fully applied
        self._seen = 0  # the last revision whose events were received
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._on_put: dict[Kind, list[Callback]] = {kind: [] for kind in KINDS}
        self._on_delete: dict[Kind, list[Callback]] = {kind: [] for kind in KINDS}
        self._task: asyncio.Task[None] | None = None

    def on_put(self, kind: Kind, callback: Callback) -> None:
        self._on_put[kind].append(callback)

    def on_delete(self, kind: Kind, callback: Callback) -> None:
        self._on_delete[kind].append(callback)

    async def start(self) -> int:
        """Load everything, then follow the watch; returns the revision loaded at."""
        await self._load()
        self._task = asyncio.create_task(self._follow(), name="topology-cache")
        return self.revision

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(CacheClosed("the topology cache is closed"))
        self._waiters.clear()

    async def wait_for(self, revision: int, timeout_s: float | None = None) -> None:
        """Return once `revision` is applied here (at once if it already is); TimeoutError
        after `timeout_s`. Wait only for revisions that changed topology keys: those are
        the ones a store operation returns."""
        if self.revision >= revision:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((revision, waiter))
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        finally:
            if not waiter.done():
                waiter.cancel()
            self._waiters = [(r, w) for r, w in self._waiters if w is not waiter]

    # -- reading ----------------------------------------------------------------------------------

    def all(self, kind: Kind) -> list[Record]:
        return list(self.records[kind].values())

    def vhost(self, name: str) -> VHostRecord | None:
        record = self.records["vhosts"].get(self.keys.vhost(name))
        assert record is None or isinstance(record, VHostRecord)
        return record

    def queue(self, vhost: str, name: str) -> QueueRecord | None:
        record = self.records["queues"].get(self.keys.queue(vhost, name))
        assert record is None or isinstance(record, QueueRecord)
        return record

    def exchange(self, vhost: str, name: str) -> ExchangeRecord | None:
        record = self.records["exchanges"].get(self.keys.exchange(vhost, name))
        assert record is None or isinstance(record, ExchangeRecord)
        return record

    def bindings(self, vhost: str) -> list[BindingRecord]:
        return [r for r in self.records["bindings"].values()
                if isinstance(r, BindingRecord) and r.vhost == vhost]

    # -- applying ---------------------------------------------------------------------------------

    async def _load(self) -> None:
        """Read every key at one revision and apply the difference from what the cache holds."""
        result = await self.client.range(self.keys.everything(), prefix=True)
        fresh: dict[Kind, dict[bytes, Record]] = {kind: {} for kind in KINDS}
        for kv in result.kvs:
            decoded = self._decode(kv)
            if decoded is not None:
                fresh[decoded[0]][kv.key] = decoded[1]
        for kind in KINDS:
            current = self.records[kind]
            for key in [k for k in current if k not in fresh[kind]]:
                self._emit(self._on_delete[kind], current.pop(key))
            for key, record in fresh[kind].items():
                old = current.get(key)
                if old is None or old.mod_revision != record.mod_revision:
                    current[key] = record
                    self._emit(self._on_put[kind], record)
        self._seen = max(self._seen, result.revision)
        self._settle(result.revision)

    async def _follow(self) -> None:
        while True:
            try:
                async for event in self.client.watch(self.keys.everything(), prefix=True,
                                                     start_revision=self._seen + 1):
                    self._apply(event)
            except EtcdCompacted:
                log.warning("topology watch compacted; reloading", revision=self._seen)
                await self._reload()
            except EtcdException as exc:
                log.warning("topology watch failed; retrying", error=str(exc))
                await asyncio.sleep(RETRY_PAUSE_S)

    async def _reload(self) -> None:
        while True:
            try:
                await self._load()
                return
            except EtcdException as exc:
                log.warning("topology reload failed; retrying", error=str(exc))
                await asyncio.sleep(RETRY_PAUSE_S)

    def _apply(self, event: WatchEvent) -> None:
        revision = event.kv.mod_revision
        parsed = self.keys.parse(event.kv.key)
        if parsed is not None:
            kind = parsed[0]
            if event.type == "PUT":
                decoded = self._decode(event.kv)
                if decoded is not None:
                    self.records[kind][event.kv.key] = decoded[1]
                    self._emit(self._on_put[kind], decoded[1])
            else:
                old = self.records[kind].pop(event.kv.key, None)
                if old is not None:
                    self._emit(self._on_delete[kind], old)
        self._seen = max(self._seen, revision)
        asyncio.get_running_loop().call_soon(self._settle, revision)

    def _decode(self, kv: KeyValue) -> tuple[Kind, Record] | None:
        parsed = self.keys.parse(kv.key)
        if parsed is None:
            return None
        try:
            return parsed[0], decode(parsed[0], kv)
        except (ValueError, TypeError, KeyError) as exc:  # not written by this version
            log.error("unreadable topology record", key=kv.key.decode(errors="replace"),
                      error=str(exc))
            return None

    @staticmethod
    def _emit(callbacks: list[Callback], record: Record) -> None:
        for callback in callbacks:
            callback(record)

    def _settle(self, revision: int) -> None:
        if revision <= self.revision:
            return
        self.revision = revision
        ready = [w for r, w in self._waiters if r <= revision]
        self._waiters = [(r, w) for r, w in self._waiters if r > revision]
        for waiter in ready:
            if not waiter.done():
                waiter.set_result(None)
