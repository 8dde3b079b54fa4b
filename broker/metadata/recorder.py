"""Connects the model to the metadata store: records durable changes, and restores them at boot.

MetadataRecorder is the vhosts' Observer: every durable exchange, queue and binding, and every
policy, is written as it changes. `restore` rebuilds vhosts, users, permissions, policies,
exchanges, queues and bindings from the store when the broker starts, before any client
connects. Transient entities are never written, so they are gone after a restart.

It must not know the sessions, the cluster or the composing `broker.Broker` (which it sees
through the `Broker` Protocol).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from leveret.broker.access.auth import Permission, Users
from leveret.broker.metadata.store import Metastore, MetastoreError, load_table
from leveret.broker.model.binding import Binding
from leveret.broker.model.errors import BrokerError, InternalError
from leveret.broker.model.exchange import Exchange
from leveret.broker.model.policy import Policy
from leveret.broker.model.queue import Queue
from leveret.broker.model.vhost import Observer, VHost
from leveret.broker.process import logs
from leveret.storage import StorageError

log = logs.get("leveret.metadata")


class Broker(Protocol):
    """What `restore` rebuilds (`broker.Broker`): a Protocol, so that this module does not
    import the broker that imports it."""

    @property
    def users(self) -> Users: ...

    @property
    def vhosts(self) -> dict[str, VHost]: ...

    def add_vhost(self, name: str, persist: bool = True,
                  default_queue_type: str | None = None) -> VHost: ...


class RestoreError(Exception):
    """A durable queue's data cannot be opened at boot (damaged in the middle of its log, or
    its files cannot be read); the message names the queue and the file."""


@contextmanager
def _recording() -> Iterator[None]:
    """A metadata write that fails (a full disk) reaches the client as an internal error
    with the database's own words, not as a crash; the model undoes what it was recording."""
    try:
        yield
    except MetastoreError as exc:
        log.error("metadata write failed", error=str(exc))
        raise InternalError(str(exc)) from None


class MetadataRecorder(Observer):
    def __init__(self, store: Metastore) -> None:
        self.store = store

    def exchange_declared(self, exchange: Exchange) -> None:
        with _recording():
            self.store.put_exchange(
                exchange.vhost,
                exchange.name,
                exchange.type,
                exchange.auto_delete,
                exchange.internal,
                exchange.arguments,
            )

    def exchange_deleted(self, exchange: Exchange) -> None:
        with _recording():
            self.store.delete_exchange(exchange.vhost, exchange.name)

    def queue_declared(self, queue: Queue) -> None:
        with _recording():
            self.store.put_queue(
                queue.vhost.name,
                queue.name,
                queue.type,
                queue.auto_delete,
                queue.arguments,
                getattr(queue, "storage_id", None),
            )

    def queue_deleted(self, queue: Queue) -> None:
        with _recording():
            self.store.delete_queue(queue.vhost.name, queue.name)

    def binding_added(self, binding: Binding) -> None:
        with _recording():
            self.store.put_binding(*_binding_row(binding))

    def binding_removed(self, binding: Binding) -> None:
        with _recording():
            self.store.delete_binding(*_binding_row(binding))

    def policy_set(self, vhost: VHost, policy: Policy) -> None:
        with _recording():
            self.store.put_policy(
                vhost.name,
                policy.name,
                policy.pattern,
                policy.apply_to,
                policy.priority,
                policy.definition,
            )

    def policy_cleared(self, vhost: VHost, policy: Policy) -> None:
        with _recording():
            self.store.delete_policy(vhost.name, policy.name)


def _binding_row(binding: Binding) -> tuple[str, str, str, str, str, dict[str, Any]]:
    destination = binding.destination
    return (
        binding.source.vhost,
        binding.source.name,
        destination.kind,
        destination.name,
        binding.routing_key,
        binding.arguments,
    )


def restore(broker: Broker, store: Metastore) -> None:
    """Rebuild the durable state; a row that no longer loads is logged and skipped."""
    for row in store.rows("vhosts"):  # default_queue_type NULL: the server's (recorded < v2)
        broker.add_vhost(row["name"], persist=False,
                         default_queue_type=row["default_queue_type"])
    for row in store.rows("users"):
        broker.users.add(
            row["name"], password_hash=row["password_hash"], tags=json.loads(row["tags"])
        )
    for row in store.rows("permissions"):
        if row["user"] in broker.users.users:
            broker.users.set_permissions(
                row["user"], row["vhost"], Permission(row["configure"], row["write"], row["read"])
            )
    for row in store.rows("policies"):
        vhost = broker.vhosts.get(row["vhost"])
        if vhost is not None:
            vhost.policies[row["name"]] = Policy(
                row["name"],
                row["pattern"],
                json.loads(row["definition"]),
                row["apply_to"],
                row["priority"],
            )
    # What is restored is already stored: the vhosts record nothing while it is rebuilt
    # (rewriting every row would slow a restart, and fail on a full disk).
    recorders = {name: vhost.observer for name, vhost in broker.vhosts.items()}
    for vhost in broker.vhosts.values():
        vhost.observer = Observer()
    try:
        for row in store.rows("exchanges"):
            _restore(
                row,
                "exchange",
                lambda v, r: v.declare_exchange(
                    r["name"],
                    r["type"],
                    durable=True,
                    auto_delete=bool(r["auto_delete"]),
                    internal=bool(r["internal"]),
                    arguments=load_table(r["arguments"]),
                ),
                broker,
            )
        for row in store.rows("queues"):
            _restore(
                row,
                "queue",
                lambda v, r: v.restore_queue(
                    r["name"],
                    r["type"],
                    auto_delete=bool(r["auto_delete"]),
                    arguments=load_table(r["arguments"]),
                    storage_id=r["storage_id"],
                ),
                broker,
            )
        for row in store.rows("bindings"):
            _restore(
                row,
                "binding",
                lambda v, r: v.bind(
                    r["source"],
                    r["destination_type"],
                    r["destination"],
                    r["routing_key"],
                    load_table(r["arguments"]),
                ),
                broker,
            )
        for vhost in broker.vhosts.values():
            for exchange in vhost.exchanges.values():
                exchange.restored()
    finally:
        for name, recorder in recorders.items():
            broker.vhosts[name].observer = recorder


def _restore(row: Any, kind: str, action: Any, broker: Broker) -> None:
    vhost = broker.vhosts.get(row["vhost"])
    if vhost is None:
        return
    try:
        action(vhost, row)
    except StorageError as exc:
        raise RestoreError(
            f"{kind} '{row['name']}' in vhost '{row['vhost']}' cannot be recovered: {exc}"
        ) from exc
    except (BrokerError, OSError, ValueError) as exc:
        log.error(
            "could not restore a durable entity",
            kind=kind,
            vhost=row["vhost"],
            name=row["source"] if kind == "binding" else row["name"],
            error=str(exc),
        )
