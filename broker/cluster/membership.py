"""Cluster membership: a node's record in etcd, bound to its lease, and the cluster's members.

Role: in cluster mode, join the cluster at start-up and stay in it. Under `/leveret/<cluster>/`:

- `secret`: HMAC-SHA256 of a fixed label keyed with the shared secret (never the secret), put by
  the first node; a node whose secret gives another digest is refused.
- `nodes/<name>`: the node's record (JSON: name, version, advertise host, ports, started_at,
  alarms), bound to its lease. It exists while the node is alive; a clean stop revokes the lease
  and the record goes at once, a crashed node's goes when etcd expires the lease.
- `members/<name>`: the same record with no lease, put at every join: the nodes the cluster
  knows, so that one whose `nodes/` record is gone shows as down.

A node registers with a txn that puts both only if no `nodes/<name>` exists: a live node of the
same name refuses the newcomer (after waiting one TTL, in case it is this node's own record left
by a `kill -9`). When the lease is lost the node stops acting for the cluster (`in_cluster` is
False, and `listeners` are told) and registers again, with a new lease, once etcd answers.

It must not know AMQP, the model or the broker: the caller gives the record's fields and pushes
alarm changes with `set_alarms`.

Threading: one event loop. `join` and `close` are coroutines of that loop; `set_alarms` is a
plain call from it; the keeper task (lease loss, record updates, rejoining) runs on it too.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from leveret.broker.cluster.etcd import (
    Compare,
    EtcdClient,
    EtcdException,
    EtcdUnavailable,
    Get,
    KeyValue,
    Put,
    RangeResult,
)
from leveret.broker.cluster.lease import Lease
from leveret.broker.process import logs

log = logs.get("leveret.cluster")
SECRET_LABEL = b"leveret cluster secret v1"
REJOIN_PAUSE_S = 1.0
CONFLICT_POLL_S = 0.5
STATUS_FIELDS = ("name", "state", "version", "advertise_host", "amqp_port", "cluster_port",
                 "management_port", "started_at", "alarms")


class MembershipError(Exception):
    """The node cannot join its cluster; the message is one line for the operator."""


def parse_endpoints(urls: Iterable[str]) -> list[str]:
    """etcd URLs from settings (each item may hold several, comma-separated), checked."""
    endpoints = [u.strip().rstrip("/") for item in urls for u in item.split(",") if u.strip()]
    if not endpoints:
        raise MembershipError("no etcd URL given; pass --etcd http://HOST:2379")
    for url in endpoints:
        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            parts = urlsplit("")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise MembershipError(
                f"invalid etcd URL '{url}'; expected e.g. http://127.0.0.1:2379")
    return endpoints


def read_secret(secret: str, secret_file: Path | None) -> str:
    """The shared secret: the file's content (stripped) if a file is set, else the setting."""
    if secret_file is not None:
        try:
            text = secret_file.read_text().strip()
        except OSError as exc:
            raise MembershipError(
                f"cannot read the cluster secret file {secret_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise MembershipError(
                f"the cluster secret file {secret_file} is not UTF-8 text") from None
        if not text:
            raise MembershipError(f"the cluster secret file {secret_file} is empty")
        return text
    if secret:
        return secret
    raise MembershipError("cluster mode needs a shared secret: pass --cluster-secret-file PATH "
                          "or set LEVERET_CLUSTER_SECRET")


def secret_digest(secret: str) -> str:
    return hmac.new(secret.encode(), SECRET_LABEL, hashlib.sha256).hexdigest()


def unreachable(exc: EtcdUnavailable) -> MembershipError:
    cause = f" ({exc.causes[0]})" if exc.causes else ""
    return MembershipError(
        f"cannot reach etcd at {', '.join(exc.endpoints)}; is it running?{cause}")


@dataclass(frozen=True)
class ClusterKeys:
    cluster: str

    @property
    def root(self) -> str:
        return f"/leveret/{self.cluster}/"

    @property
    def secret(self) -> str:
        return self.root + "secret"

    @property
    def nodes(self) -> str:
        return self.root + "nodes/"

    @property
    def members(self) -> str:
        return self.root + "members/"

    def node(self, name: str) -> str:
        return self.nodes + name

    def member(self, name: str) -> str:
        return self.members + name


def _records(result: RangeResult, prefix: str) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    for kv in result.kvs:
        name = kv.key.decode(errors="replace")[len(prefix):]
        try:
            record = json.loads(kv.value)
        except ValueError:
            record = {}
        records[name] = record if isinstance(record, dict) else {}
    return records


async def cluster_nodes(client: EtcdClient, cluster: str) -> list[dict[str, Any]]:
    """Every node the cluster knows, sorted by name: `running` with a live record, else
    `down` (its last record, without alarms). Raises what the client raises."""
    keys = ClusterKeys(cluster)
    live = _records(await client.range(keys.nodes, prefix=True), keys.nodes)
    known = _records(await client.range(keys.members, prefix=True), keys.members)
    nodes = []
    for name in sorted(set(live) | set(known)):
        record = live.get(name) or known.get(name, {})
        row = {field: record.get(field) for field in STATUS_FIELDS}
        row["name"] = name
        row["state"] = "running" if name in live else "down"
        row["alarms"] = list(record.get("alarms") or []) if name in live else []
        nodes.append(row)
    return nodes


class Membership:
    """One node's place in its cluster: `await join()`, `set_alarms(...)`, `await close()`."""

    def __init__(self, client: EtcdClient, cluster: str, name: str, secret: str, ttl_s: int,
                 record: dict[str, Any]) -> None:
        self.client = client
        self.keys = ClusterKeys(cluster)
        self.name = name
        self.ttl_s = ttl_s
        self._digest = secret_digest(secret)
        self.record: dict[str, Any] = {"name": name, **record, "alarms": []}
        self.record.setdefault("started_at", int(time.time() * 1000))
        self.lease: Lease | None = None
        self.in_cluster = False
        # told `in_cluster` each time it changes (joined, lease lost, rejoined, left)
        self.listeners: list[Callable[[bool], None]] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def join(self) -> None:
        """Check the secret and register, or raise MembershipError (and leave nothing)."""
        try:
            await self._check_secret()
            registered = await self._register(wait_s=self.ttl_s + 1.0)
        except EtcdUnavailable as exc:
            await self._drop_lease()
            raise unreachable(exc) from None
        except EtcdException as exc:
            await self._drop_lease()
            raise MembershipError(f"etcd refused to register this node: {exc}") from None
        if not registered:
            raise MembershipError(
                f"a node named '{self.name}' is already running in cluster "
                f"'{self.keys.cluster}'; give this one another --node-name")
        log.info("joined the cluster", cluster=self.keys.cluster, node=self.name,
                 lease=f"{self.lease.id:x}" if self.lease else "")
        self._task = asyncio.create_task(self._keep(), name="cluster-membership")

    async def _check_secret(self) -> None:
        key = self.keys.secret
        result = await self.client.txn([Compare.version(key, "==", 0)],
                                       [Put(key, self._digest)], [Get(key)])
        if result.succeeded:
            return
        existing = result.responses[0]
        stored = existing.kvs[0].value if isinstance(existing, RangeResult) and existing.kvs \
            else b""
        if not hmac.compare_digest(stored, self._digest.encode()):
            raise MembershipError(
                f"the cluster secret does not match cluster '{self.keys.cluster}': this node "
                "is refused; use the cluster's --cluster-secret-file or LEVERET_CLUSTER_SECRET")

    async def _register(self, wait_s: float) -> bool:
        """Grant a lease and put this node's records, if no live node has its name. Waits up
        to `wait_s` for such a record to expire; False if it does not."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait_s
        lease = Lease(self.client, self.ttl_s)
        await lease.start()
        self.lease = lease
        node_key = self.keys.node(self.name)
        while True:
            body = json.dumps(self.record, sort_keys=True)
            try:
                result = await self.client.txn(
                    [Compare.version(node_key, "==", 0)],
                    [Put(node_key, body, lease.id), Put(self.keys.member(self.name), body)],
                    [Get(node_key)])
                existing = _first_kv(result.responses)
            except EtcdUnavailable as exc:
                if not exc.maybe_applied:
                    raise
                existing = await self.client.get(node_key)  # applied or not: read it back
                result = None
            if (result is not None and result.succeeded) or \
                    (existing is not None and existing.lease == lease.id):
                self._set_in_cluster(True)
                return True
            if loop.time() >= give_up:
                await self._drop_lease()
                return False
            await asyncio.sleep(CONFLICT_POLL_S)

    def _set_in_cluster(self, value: bool) -> None:
        if value != self.in_cluster:
            self.in_cluster = value
            for listener in list(self.listeners):
                listener(value)

    async def _drop_lease(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.close()

    def set_alarms(self, alarms: list[str]) -> None:
        """The node's resource alarms changed: its record follows (from the keeper task)."""
        if alarms != self.record["alarms"]:
            self.record["alarms"] = list(alarms)
            self._changed.set()

    async def _keep(self) -> None:
        """Put record changes while in the cluster; on a lost lease, leave and rejoin."""
        while True:
            lease = self.lease
            if lease is None or lease.lost.is_set():
                await self._rejoin()
                continue
            lost = asyncio.ensure_future(lease.lost.wait())
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait([lost, changed], return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                changed.cancel()
            if lease.lost.is_set():
                continue
            self._changed.clear()
            body = json.dumps(self.record, sort_keys=True)
            try:
                await self.client.put(self.keys.node(self.name), body, lease=lease.id)
            except EtcdException as exc:
                log.warning("cannot update this node's record in etcd", error=str(exc))

    async def _rejoin(self) -> None:
        """Out of the cluster until etcd answers and a new lease holds the node's record."""
        lease, self.lease = self.lease, None
        self._set_in_cluster(False)
        reason = lease.lost_reason if lease is not None else "no lease"
        log.warning("lost the etcd lease: this node no longer acts for the cluster",
                    cluster=self.keys.cluster, node=self.name, reason=reason)
        while True:
            await asyncio.sleep(REJOIN_PAUSE_S)
            try:
                if lease is not None:
                    await self.client.lease_revoke(lease.id)  # its record, if etcd kept it
                if await self._register(wait_s=self.ttl_s + 1.0):
                    break
                log.warning("cannot rejoin: another node holds this node's name",
                            node=self.name)
            except EtcdException as exc:
                await self._drop_lease()
                log.debug("etcd still unavailable", error=str(exc))
        self._changed.clear()
        log.info("rejoined the cluster", cluster=self.keys.cluster, node=self.name,
                 lease=f"{self.lease.id:x}" if self.lease else "")

    async def nodes(self) -> list[dict[str, Any]]:
        return await cluster_nodes(self.client, self.keys.cluster)

    async def close(self) -> None:
        """Leave: stop the keeper, revoke the lease (the record goes at once), close etcd."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        self._set_in_cluster(False)
        await self._drop_lease()
        await self.client.close()


def _first_kv(responses: Iterable[object]) -> KeyValue | None:
    for response in responses:
        if isinstance(response, RangeResult) and response.kvs:
            return response.kvs[0]
    return None
