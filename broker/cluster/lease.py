"""A node's etcd lease, kept alive in a task, and the signal that it is lost.

Role: grant a lease, renew it every TTL/3, and say once, through the `lost` event and an optional
callback, that it is lost: etcd answered that it is gone (TTL 0: expired or revoked), or no
keepalive has been answered for so long that etcd may have expired it. The local deadline is
the send time of the last answered keepalive plus the granted TTL, less a safety margin. etcd
can expire the lease no earlier than that send time plus the TTL, and only then can another
node take over what the lease held; so a node that stops acting for the cluster when `lost` is
set has stopped first. A lost lease stays lost: rejoining means a new Lease.

It must not know what the lease's keys mean, nor AMQP, queues or the model.

Threading: runs on one event loop, with the EtcdClient it is given; `lost` is an asyncio.Event
of that loop and the callback is called from the keepalive task (it must not block or raise).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from leveret.broker.cluster.etcd import EtcdClient, EtcdException
from leveret.broker.process import logs

log = logs.get("leveret.cluster.lease")
RETRY_S = 0.25  # pause between keepalives while etcd does not answer


class Lease:
    """`async with Lease(client, ttl_s=10) as lease:` put keys with `lease=lease.id`, and watch
    `lease.lost`. Leaving the block revokes the lease (so its keys go at once)."""

    def __init__(self, client: EtcdClient, ttl_s: int, *, margin_s: float | None = None,
                 on_lost: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.requested_ttl_s = ttl_s
        self.id = 0
        self.ttl_s = 0  # as granted: etcd raises a TTL below its minimum
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self._margin_s = margin_s
        self._on_lost = on_lost
        self.renewed_at = 0.0  # loop time at which the last answered grant/keepalive was sent
        self._deadline = 0.0
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def __aenter__(self) -> Lease:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def margin_s(self) -> float:
        """How long before etcd's earliest expiry the lease counts as lost."""
        return self._margin_s if self._margin_s is not None else min(1.0, self.ttl_s / 4)

    @property
    def alive(self) -> bool:
        return self.id != 0 and not self.lost.is_set() and not self._closed

    def remaining_s(self) -> float:
        """Seconds until the local deadline; 0 once lost."""
        if not self.alive:
            return 0.0
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def start(self) -> Lease:
        """Grant the lease and start keeping it alive. Raises what lease_grant raises."""
        sent = asyncio.get_running_loop().time()
        info = await self.client.lease_grant(self.requested_ttl_s)
        self.id, self.ttl_s = info.id, info.ttl
        self._renewed(sent, info.ttl)
        self._task = asyncio.create_task(self._keep_alive(), name=f"etcd-lease-{self.id:x}")
        return self

    async def close(self, revoke: bool = True) -> None:
        """Stop renewing; revoke the lease unless it is lost already (best effort)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # our own cancellation still propagates
        if revoke and self.id and not self.lost.is_set():
            try:
                await self.client.lease_revoke(self.id)
            except EtcdException as exc:
                log.info("etcd lease not revoked; it will expire", lease=f"{self.id:x}",
                         error=str(exc))

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.ttl_s / 3
        next_at = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, min(next_at, self._deadline) - loop.time()))
            if loop.time() >= self._deadline:
                self._lose(f"no keepalive answered within the lease's {self.ttl_s}s TTL")
                return
            sent = loop.time()
            try:
                async with asyncio.timeout_at(self._deadline):
                    ttl = await self.client.lease_keepalive(self.id)
            except (EtcdException, TimeoutError) as exc:
                log.debug("etcd keepalive failed", lease=f"{self.id:x}", error=str(exc))
                next_at = loop.time() + min(interval, RETRY_S)
                continue
            if ttl <= 0:
                self._lose("etcd says the lease is gone (expired or revoked)")
                return
            self._renewed(sent, ttl)
            next_at = sent + interval

    def _renewed(self, sent: float, ttl_s: int) -> None:
        """etcd cannot expire the lease before sent + ttl_s: be lost a margin earlier."""
        self.renewed_at = sent
        self._deadline = sent + ttl_s - self.margin_s

    def _lose(self, reason: str) -> None:
        if self.lost.is_set() or self._closed:
            return
        self.lost_reason = reason
        self.lost.set()
        log.warning("etcd lease lost", lease=f"{self.id:x}", reason=reason)
        if self._on_lost is not None:
            self._on_lost(reason)
