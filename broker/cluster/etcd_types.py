"""The typed requests and results of the etcd client (`leveret.broker.cluster.etcd`).

Role: the dataclasses that callers build (Compare, Get, Put, Delete) and get back (KeyValue,
RangeResult, PutResult, DeleteResult, TxnResult, LeaseInfo, WatchEvent, LeaderKey), and their
conversion to and from the gateway's JSON: keys and values base64, int64 as strings, zero values
left out. Keys and values are bytes; a str is UTF-8 encoded.

It must not know HTTP, AMQP, queues or the model. Plain data: safe from any thread.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

KeyLike: TypeAlias = str | bytes
Json: TypeAlias = dict[str, Any]


def to_bytes(data: KeyLike) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def prefix_end(prefix: KeyLike) -> bytes:
    """The range end that covers every key starting with `prefix` (etcd's `\\0` means all)."""
    raw = bytearray(to_bytes(prefix))
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def as_int(value: str | int | None) -> int:
    return int(value) if value else 0


def key_range(key: KeyLike, range_end: KeyLike | None, prefix: bool) -> Json:
    body: Json = {"key": b64(to_bytes(key))}
    end = prefix_end(key) if prefix else (to_bytes(range_end) if range_end is not None else b"")
    if end:
        body["range_end"] = b64(end)
    return body


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, data: Json) -> KeyValue:
        return cls(unb64(data.get("key")), unb64(data.get("value")),
                   as_int(data.get("create_revision")), as_int(data.get("mod_revision")),
                   as_int(data.get("version")), as_int(data.get("lease")))


def kv_or_none(data: Json | None) -> KeyValue | None:
    return KeyValue.from_json(data) if data else None


def header_revision(data: Json) -> int:
    return as_int(data.get("header", {}).get("revision"))


@dataclass(frozen=True, slots=True)
class RangeResult:
    revision: int
    kvs: list[KeyValue]
    count: int
    more: bool

    @classmethod
    def from_json(cls, data: Json) -> RangeResult:
        kvs = [KeyValue.from_json(kv) for kv in data.get("kvs", [])]
        return cls(header_revision(data), kvs, as_int(data.get("count")), bool(data.get("more")))


@dataclass(frozen=True, slots=True)
class PutResult:
    revision: int
    prev_kv: KeyValue | None

    @classmethod
    def from_json(cls, data: Json) -> PutResult:
        return cls(header_revision(data), kv_or_none(data.get("prev_kv")))


@dataclass(frozen=True, slots=True)
class DeleteResult:
    revision: int
    deleted: int
    prev_kvs: list[KeyValue]

    @classmethod
    def from_json(cls, data: Json) -> DeleteResult:
        prev = [KeyValue.from_json(kv) for kv in data.get("prev_kvs", [])]
        return cls(header_revision(data), as_int(data.get("deleted")), prev)


@dataclass(frozen=True, slots=True)
class TxnResult:
    """`responses` holds one result per op of the branch that ran (success or failure)."""

    revision: int
    succeeded: bool
    responses: list[RangeResult | PutResult | DeleteResult]

    @classmethod
    def from_json(cls, data: Json) -> TxnResult:
        responses: list[RangeResult | PutResult | DeleteResult] = []
        for item in data.get("responses", []):
            if "response_range" in item:
                responses.append(RangeResult.from_json(item["response_range"]))
            elif "response_put" in item:
                responses.append(PutResult.from_json(item["response_put"]))
            elif "response_delete_range" in item:
                responses.append(DeleteResult.from_json(item["response_delete_range"]))
        return cls(header_revision(data), bool(data.get("succeeded")), responses)


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A lease's id and TTL in seconds (`ttl` is -1 once the lease is gone)."""

    id: int
    ttl: int
    granted_ttl: int = 0
    keys: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["PUT", "DELETE"]
    kv: KeyValue  # for a DELETE: the key and the deleting revision (mod_revision) only
    prev_kv: KeyValue | None


@dataclass(frozen=True, slots=True)
class LeaderKey:
    """Who holds an election: the key it was won with, its create revision and its lease.

    Fence a leader's writes with `Compare.create_revision(leader.key, "==", leader.rev)`."""

    name: bytes
    key: bytes
    rev: int
    lease: int

    def to_json(self) -> Json:
        return {"name": b64(self.name), "key": b64(self.key),
                "rev": str(self.rev), "lease": str(self.lease)}


Op: TypeAlias = Literal["==", "!=", "<", ">"]
_RESULTS = {"==": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a txn: `<target of key> <op> <operand>`. A missing key has version,
    create and mod revision 0 and lease 0; a value compare on a missing key is false."""

    key: bytes
    target: Literal["VALUE", "VERSION", "CREATE", "MOD", "LEASE"]
    op: Op
    operand: int | bytes
    range_end: bytes = b""  # set: the condition must hold for every key in [key, range_end)

    @classmethod
    def value(cls, key: KeyLike, op: Op, value: KeyLike) -> Compare:
        return cls(to_bytes(key), "VALUE", op, to_bytes(value))

    @classmethod
    def version(cls, key: KeyLike, op: Op, version: int) -> Compare:
        return cls(to_bytes(key), "VERSION", op, version)

    @classmethod
    def create_revision(cls, key: KeyLike, op: Op, revision: int) -> Compare:
        return cls(to_bytes(key), "CREATE", op, revision)

    @classmethod
    def mod_revision(cls, key: KeyLike, op: Op, revision: int) -> Compare:
        return cls(to_bytes(key), "MOD", op, revision)

    @classmethod
    def lease(cls, key: KeyLike, op: Op, lease_id: int) -> Compare:
        return cls(to_bytes(key), "LEASE", op, lease_id)

    def to_json(self) -> Json:
        field_name = {"VALUE": "value", "VERSION": "version", "CREATE": "create_revision",
                      "MOD": "mod_revision", "LEASE": "lease"}[self.target]
        operand = b64(self.operand) if isinstance(self.operand, bytes) else str(self.operand)
        body = {"key": b64(self.key), "target": self.target, "result": _RESULTS[self.op],
                field_name: operand}
        if self.range_end:
            body["range_end"] = b64(self.range_end)
        return body

    @classmethod
    def none_created_since(cls, prefix: KeyLike, revision: int) -> Compare:
        """No key under `prefix` was created after `revision` (true for an empty range)."""
        return cls(to_bytes(prefix), "CREATE", "<", revision + 1, prefix_end(prefix))


@dataclass(frozen=True, slots=True)
class Get:
    key: KeyLike
    range_end: KeyLike | None = None
    prefix: bool = False

    def to_json(self) -> Json:
        return {"request_range": key_range(self.key, self.range_end, self.prefix)}


@dataclass(frozen=True, slots=True)
class Put:
    key: KeyLike
    value: KeyLike
    lease: int = 0
    prev_kv: bool = False

    def to_json(self) -> Json:
        body: Json = {"key": b64(to_bytes(self.key)), "value": b64(to_bytes(self.value))}
        if self.lease:
            body["lease"] = str(self.lease)
        if self.prev_kv:
            body["prev_kv"] = True
        return {"request_put": body}


@dataclass(frozen=True, slots=True)
class Delete:
    key: KeyLike
    range_end: KeyLike | None = None
    prefix: bool = False
    prev_kv: bool = False

    def to_json(self) -> Json:
        body = key_range(self.key, self.range_end, self.prefix)
        if self.prev_kv:
            body["prev_kv"] = True
        return {"request_delete_range": body}


TxnOp: TypeAlias = Get | Put | Delete
