"""The plain records of the cluster's topology, and their JSON values in etcd.

Role: one frozen dataclass per kind of key in `topology_keys` (vhost, user, permission, policy,
exchange, queue, binding), and `encode`/`decode` between a record and its etcd value. AMQP
tables (`arguments`, a policy's `definition`) go through the metastore's typed JSON, so that
timestamps, decimals, byte arrays, floats and nested tables come back with their types.
`mod_revision` and `lease` come from etcd's KeyValue and are not part of a record's value or
equality.

It must not know etcd's client, the model's runtime classes or AMQP frames. Plain data: any
thread.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from leveret.broker.cluster.etcd_types import KeyValue
from leveret.broker.cluster.topology_keys import DestinationType, Kind
from leveret.broker.metadata.store import decode_value, encode_value

_TABLES = ("arguments", "definition")
_META = ("mod_revision", "lease")


@dataclass(frozen=True)
class VHostRecord:
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    default_queue_type: str = ""  # "": the nodes' setting (a record written before it existed)
    mod_revision: int = field(default=0, compare=False)
    lease: int = field(default=0, compare=False)


@dataclass(frozen=True)
class UserRecord:
    name: str
    password_hash: str
    hashing_algorithm: str
    tags: tuple[str, ...] = ()
    mod_revision: int = field(default=0, compare=False)
    lease: int = field(default=0, compare=False)


@dataclass(frozen=True)
class PermissionRecord:
    user: str
    vhost: str
    configure: str
    write: str
    read: str
    mod_revision: int = field(default=0, compare=False)
    lease: int = field(default=0, compare=False)


@dataclass(frozen=True)
class PolicyRecord:
    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: dict[str, Any]
    mod_revision: int = field(default=0, compare=False)
    lease: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ExchangeRecord:
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    mod_revision: int = field(default=0, compare=False)
    lease: int = field(default=0, compare=False)

    @property
    def resource(self) -> str:
        return f"exchange '{self.name}' in vhost '{self.vhost}'"


@dataclass(frozen=True)
class QueueRecord:
    """A queue: `node` holds it; `storage_id` names its storage folder there; an exclusive
    queue has its owning connection's id (`exclusive_owner`, opaque) and node (`owner_node`).
    A replicated stream names its members (the leader, `node`, first); `()` for every other
    queue, and left out of the value then (records written before it read the same)."""

    vhost: str
    name: str
    type: str = "classic"
    durable: bool = False
    auto_delete: bool = False
    exclusive: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    node: str = ""
    storage_id: str | None = None
    owner_node: str | None = None
    exclusive_owner: str | None = None
    members: tuple[str, ...] = ()
    mod_revision: int = field(default=0, compare=False)
    lease: int = field(default=0, compare=False)

    @property
    def resource(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost}'"


@dataclass(frozen=True)
class BindingRecord:
    vhost: str
    source: str
    destination_type: DestinationType
    destination: str
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    mod_revision: int = field(default=0, compare=False)
    lease: int = field(default=0, compare=False)


Record: TypeAlias = (VHostRecord | UserRecord | PermissionRecord | PolicyRecord | ExchangeRecord
                     | QueueRecord | BindingRecord)
RECORD_TYPES: dict[Kind, type[Any]] = {
    "vhosts": VHostRecord, "users": UserRecord, "permissions": PermissionRecord,
    "policies": PolicyRecord, "exchanges": ExchangeRecord, "queues": QueueRecord,
    "bindings": BindingRecord,
}


def encode(record: Record) -> bytes:
    """A record's etcd value: JSON, tables typed, without its etcd metadata."""
    body: dict[str, Any] = {}
    for item in dataclasses.fields(record):
        if item.name in _META:
            continue
        value = getattr(record, item.name)
        if item.name == "members" and not value:
            continue  # only replicated streams carry it
        if item.name in _TABLES:
            value = {k: encode_value(v) for k, v in value.items()}
        elif isinstance(value, tuple):
            value = list(value)
        body[item.name] = value
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode(
        "utf-8", "surrogatepass")


def decode(kind: Kind, kv: KeyValue) -> Record:
    """The record of kind `kind` held by `kv` (its mod_revision and lease filled in)."""
    cls = RECORD_TYPES[kind]
    body = json.loads(kv.value.decode("utf-8", "surrogatepass"))
    for name in _TABLES:
        if name in body:
            body[name] = {k: decode_value(v) for k, v in body[name].items()}
    for name in ("tags", "members"):
        if name in body:
            body[name] = tuple(body[name])
    record: Record = cls(**body, mod_revision=kv.mod_revision, lease=kv.lease)
    return record
