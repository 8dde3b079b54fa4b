"""The cluster's topology store: vhosts, users, permissions, policies, exchanges, queues and
bindings in etcd, each change one etcd transaction.

Role: the writes that two nodes may race on. A declaration is one txn that creates the key if
it is absent and otherwise reads it back at the same revision, so two nodes declaring the same
queue at the same moment get one `Created` and one `Existing` (or RabbitMQ's 406, from the
model's own equivalence check, `leveret.broker.model.equivalence`). A delete takes its bindings
with it in the same txn; a vhost delete takes everything under it. Entities that must vanish
with their node (exclusive, auto-delete or transient ones) are put with the holding node's
lease, which the caller passes in. The rules on names (the default exchange, `amq.*`) and the
validation of arguments stay in the model: the session runs them before calling this store.

Every result carries the etcd revision at which the change (or the record found) became
visible; a peer's `TopologyCache.wait_for(revision)` returns once that node has applied it.

It must not know AMQP frames, sessions or the model's runtime objects (records only). Asyncio:
one event loop; the store keeps no state of its own, so concurrent calls are safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Generic, TypeAlias, TypeVar

from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.etcd_types import (
    Compare,
    Delete,
    DeleteResult,
    Get,
    KeyValue,
    Put,
    RangeResult,
    TxnOp,
    TxnResult,
)
from leveret.broker.cluster.topology_keys import DestinationType, TopologyKeys
from leveret.broker.cluster.topology_records import (
    BindingRecord,
    ExchangeRecord,
    PermissionRecord,
    PolicyRecord,
    QueueRecord,
    UserRecord,
    VHostRecord,
    decode,
    encode,
)
from leveret.broker.model import equivalence
from leveret.broker.model.errors import InternalError, NotFound
from leveret.broker.model.vhost import PREDECLARED

if TYPE_CHECKING:
    from leveret.broker.cluster.stream_leadership import StreamLeaderships

R = TypeVar("R")
MAX_ATTEMPTS = 32  # a txn lost to concurrent changes of the same keys is tried again


@dataclass(frozen=True)
class Created(Generic[R]):
    record: R
    revision: int


@dataclass(frozen=True)
class Existing(Generic[R]):
    """The entity was there already and matches; `revision` is when its record was written."""

    record: R
    revision: int


ExchangeResult: TypeAlias = "Created[ExchangeRecord] | Existing[ExchangeRecord]"
QueueResult: TypeAlias = "Created[QueueRecord] | Existing[QueueRecord]"
BindingResult: TypeAlias = "Created[BindingRecord] | Existing[BindingRecord]"


def no_vhost(vhost: str) -> NotFound:
    return NotFound(f"no vhost '{vhost}'")


def no_entity(kind: DestinationType, name: str, vhost: str) -> NotFound:
    return NotFound(f"no {kind} '{name}' in vhost '{vhost}'")


def _kvs(result: TxnResult) -> list[KeyValue | None]:
    """The one key each Get of a txn's branch found (None where it found nothing)."""
    found: list[KeyValue | None] = []
    for response in result.responses:
        if isinstance(response, RangeResult):
            found.append(response.kvs[0] if response.kvs else None)
    return found


def _leased(durable: bool, auto_delete: bool, exclusive: bool = False) -> bool:
    return exclusive or auto_delete or not durable


class TopologyStore:
    def __init__(self, client: EtcdClient, keys: TopologyKeys) -> None:
        self.client = client
        self.keys = keys
        # replicated streams' leadership keys: created with the queue's record, in its txn,
        # and deleted with it (set by broker/cluster/stream_replication.py)
        self.streams: StreamLeaderships | None = None

    async def _txn(self, compare: Iterable[Compare], success: Iterable[TxnOp] = (),
                   failure: Iterable[TxnOp] = ()) -> TxnResult:
        return await self.client.txn(list(compare), list(success), list(failure))

    # -- vhosts, users, permissions, policies ---------------------------------------------------

    async def put_vhost(self, record: VHostRecord) -> int:
        """Create or update a vhost; a new one gets the predeclared `amq.*` exchanges too."""
        key = self.keys.vhost(record.name)
        exchanges = [Put(self.keys.exchange(record.name, name),
                         encode(ExchangeRecord(record.name, name, type_)))
                     for name, type_ in PREDECLARED if name]
        put = Put(key, encode(record))
        result = await self._txn([Compare.version(key, "==", 0)], [put, *exchanges], [put])
        return result.revision

    async def delete_vhost(self, name: str) -> int | None:
        """Delete a vhost and everything under it (permissions included) in one txn; the
        revision, or None if there was no such vhost."""
        key = self.keys.vhost(name)
        scopes = [self.keys.in_vhost(kind, name)
                  for kind in ("policies", "exchanges", "queues", "bindings")]
        for _ in range(MAX_ATTEMPTS):
            permissions = self.keys.kind_prefix("permissions")
            listing = await self.client.range(permissions, prefix=True, keys_only=True)
            mine = [kv.key for kv in listing.kvs
                    if (parsed := self.keys.parse(kv.key)) and parsed[1][1:] == [name]]
            result = await self._txn(
                [Compare.version(key, ">", 0),
                 Compare.none_created_since(permissions, listing.revision)],
                [_delete(key), *(_delete(scope, prefix=True) for scope in scopes),
                 *(_delete(k) for k in mine),
                 *([_delete(self.streams.vhost_prefix(name), prefix=True)]
                   if self.streams is not None else [])],
                [Get(key)])
            if result.succeeded:
                return result.revision
            if _kvs(result) == [None]:
                return None
        raise _busy("vhost", name)

    async def put_user(self, record: UserRecord) -> int:
        result = await self._txn([], [Put(self.keys.user(record.name), encode(record))])
        return result.revision

    async def delete_user(self, name: str) -> int | None:
        """Delete a user and its permissions; None if there was no such user."""
        result = await self._txn([], [_delete(self.keys.user(name)),
                                      _delete(self.keys.permissions_of(name), prefix=True)])
        first = result.responses[0]
        return result.revision if isinstance(first, DeleteResult) and first.deleted else None

    async def put_permission(self, record: PermissionRecord) -> int:
        """Set a user's permissions on a vhost; NotFound if either is missing."""
        vhost, user = self.keys.vhost(record.vhost), self.keys.user(record.user)
        result = await self._txn(
            [Compare.version(vhost, ">", 0), Compare.version(user, ">", 0)],
            [Put(self.keys.permission(record.user, record.vhost), encode(record))],
            [Get(vhost)])
        if not result.succeeded:
            raise (no_vhost(record.vhost) if _kvs(result) == [None]
                   else NotFound(f"no user '{record.user}'"))
        return result.revision

    async def delete_permission(self, user: str, vhost: str) -> int | None:
        return await self._delete_one(self.keys.permission(user, vhost))

    async def put_policy(self, record: PolicyRecord) -> int:
        vhost = self.keys.vhost(record.vhost)
        result = await self._txn(
            [Compare.version(vhost, ">", 0)],
            [Put(self.keys.policy(record.vhost, record.name), encode(record))])
        if not result.succeeded:
            raise no_vhost(record.vhost)
        return result.revision

    async def delete_policy(self, vhost: str, name: str) -> int | None:
        return await self._delete_one(self.keys.policy(vhost, name))

    async def _delete_one(self, key: bytes) -> int | None:
        result = await self._txn([], [_delete(key)])
        first = result.responses[0]
        return result.revision if isinstance(first, DeleteResult) and first.deleted else None

    # -- exchanges and queues ---------------------------------------------------------------------

    async def declare_exchange(self, record: ExchangeRecord, lease: int = 0) -> ExchangeResult:
        """Create the exchange, or check it against the one that exists (406 on a mismatch).
        An auto-delete or transient exchange is put with `lease` (the holding node's)."""
        key = self.keys.exchange(record.vhost, record.name)
        use = lease if _leased(record.durable, record.auto_delete) else 0
        revision, found = await self._declare(key, record, use)
        if found is None:
            return Created(replace(record, mod_revision=revision, lease=use), revision)
        existing = decode("exchanges", found)
        assert isinstance(existing, ExchangeRecord)
        equivalence.check_exchange(existing, existing.resource, record.type, record.durable,
                                   record.auto_delete, record.internal, record.arguments)
        return Existing(existing, existing.mod_revision)

    async def declare_queue(self, record: QueueRecord, lease: int = 0) -> QueueResult:
        """Create the queue, or check it against the one that exists: 405 if it is exclusive to
        another owner (or the exclusive flags differ), 406 with RabbitMQ's text if it differs.
        Exclusive, auto-delete and transient queues are put with `lease`. A replicated stream
        (`members`) gets its leadership key (the first leader, epoch 1) in the same txn."""
        record = replace(record, durable=record.durable and not record.exclusive)
        key = self.keys.queue(record.vhost, record.name)
        use = lease if _leased(record.durable, record.auto_delete, record.exclusive) else 0
        also: list[TxnOp] = []
        if record.members and self.streams is not None:
            also.append(self.streams.create_op(record.vhost, record.name, list(record.members)))
        revision, found = await self._declare(key, record, use, also)
        if found is None:
            return Created(replace(record, mod_revision=revision, lease=use), revision)
        existing = decode("queues", found)
        assert isinstance(existing, QueueRecord)
        wanted_owner = record.exclusive_owner if record.exclusive else None
        if existing.exclusive_owner != wanted_owner:
            raise equivalence.exclusive_locked(existing.resource)
        equivalence.check_queue(existing, record.durable, record.auto_delete, record.arguments)
        return Existing(existing, existing.mod_revision)

    async def _declare(self, key: bytes, record: ExchangeRecord | QueueRecord,
                       lease: int, also: Iterable[TxnOp] = ()) -> tuple[int, KeyValue | None]:
        """One txn: put the record if the key is absent (and its vhost exists), else read it
        at the same revision. The txn's revision, and the key found (None: created)."""
        vhost = self.keys.vhost(record.vhost)
        result = await self._txn(
            [Compare.version(key, "==", 0), Compare.version(vhost, ">", 0)],
            [Put(key, encode(record), lease), *also],
            [Get(key), Get(vhost)])
        if result.succeeded:
            return result.revision, None
        found, vhost_kv = _kvs(result)
        if found is None or vhost_kv is None:
            raise no_vhost(record.vhost)
        return result.revision, found

    async def delete_exchange(self, vhost: str, name: str, if_revision: int = 0) -> int | None:
        """Delete an exchange and every binding from or to it, in one txn. With `if_revision`,
        only the exchange written at that revision. The txn's revision, or None if nothing
        (or a newer exchange) was there."""
        return await self._delete_entity("exchange", vhost, name, if_revision)

    async def delete_queue(self, vhost: str, name: str, if_revision: int = 0) -> int | None:
        """Delete a queue and every binding to it, in one txn (see delete_exchange)."""
        return await self._delete_entity("queue", vhost, name, if_revision)

    async def _delete_entity(self, kind: DestinationType, vhost: str, name: str,
                             if_revision: int) -> int | None:
        key = self.keys.destination(vhost, kind, name)
        check = (Compare.mod_revision(key, "==", if_revision) if if_revision
                 else Compare.version(key, ">", 0))
        scope = self.keys.in_vhost("bindings", vhost)
        for _ in range(MAX_ATTEMPTS):
            listing = await self.client.range(scope, prefix=True, keys_only=True)
            into = [kv.key for kv in listing.kvs
                    if self.keys.binding_destination(kv.key) == (kind, name)]
            ops: list[TxnOp] = [_delete(key), *(_delete(k) for k in into)]
            if kind == "exchange":
                ops.append(_delete(self.keys.bindings_from(vhost, name), prefix=True))
            elif self.streams is not None:  # a replicated stream's leadership goes with it
                ops.append(_delete(self.streams.key(vhost, name)))
            result = await self._txn(
                [check, Compare.none_created_since(scope, listing.revision)], ops, [Get(key)])
            if result.succeeded:
                return result.revision
            found = _kvs(result)[0]
            if found is None or (if_revision and found.mod_revision != if_revision):
                return None
        raise _busy(kind, name)

    # -- bindings ---------------------------------------------------------------------------------

    async def bind(self, record: BindingRecord) -> BindingResult:
        """Add a binding, in one txn that checks its source and destination still exist (404
        with RabbitMQ's text otherwise, the source first). A binding to or from a leased entity
        takes that lease (the destination's first), so it vanishes with it."""
        v = record.vhost
        source = self.keys.exchange(v, record.source)
        target = self.keys.destination(v, record.destination_type, record.destination)
        key = self.keys.binding(v, record.source, record.destination_type, record.destination,
                                record.routing_key, record.arguments)
        reads = await self._txn([], [Get(source), Get(target), Get(key)])
        for _ in range(MAX_ATTEMPTS):
            src, dst, found = _kvs(reads)
            if src is None:
                raise no_entity("exchange", record.source, v)
            if dst is None:
                raise no_entity(record.destination_type, record.destination, v)
            if found is not None:
                existing = decode("bindings", found)
                assert isinstance(existing, BindingRecord)
                return Existing(existing, found.mod_revision)
            lease = dst.lease or src.lease
            result = await self._txn(
                [Compare.mod_revision(source, "==", src.mod_revision),
                 Compare.mod_revision(target, "==", dst.mod_revision),
                 Compare.version(key, "==", 0)],
                [Put(key, encode(record), lease)],
                [Get(source), Get(target), Get(key)])
            if result.succeeded:
                stored = replace(record, mod_revision=result.revision, lease=lease)
                return Created(stored, result.revision)
            reads = result
        raise _busy("binding", record.source)

    async def unbind(self, record: BindingRecord) -> int | None:
        """Remove a binding; None if it did not exist (not an error, as in RabbitMQ)."""
        return await self._delete_one(self.keys.binding(
            record.vhost, record.source, record.destination_type, record.destination,
            record.routing_key, record.arguments))

    # -- reads ------------------------------------------------------------------------------------

    async def get_queue(self, vhost: str, name: str) -> QueueRecord | None:
        """Read a queue straight from etcd (for a cache miss); None if there is none."""
        kv = await self.client.get(self.keys.queue(vhost, name))
        record = decode("queues", kv) if kv is not None else None
        assert record is None or isinstance(record, QueueRecord)
        return record

    async def get_exchange(self, vhost: str, name: str) -> ExchangeRecord | None:
        kv = await self.client.get(self.keys.exchange(vhost, name))
        record = decode("exchanges", kv) if kv is not None else None
        assert record is None or isinstance(record, ExchangeRecord)
        return record


def _delete(key: bytes, prefix: bool = False) -> TxnOp:
    return Delete(key, prefix=prefix)


def _busy(kind: str, name: str) -> InternalError:
    return InternalError(f"{kind} '{name}': the topology kept changing; gave up after "
                         f"{MAX_ATTEMPTS} attempts")
