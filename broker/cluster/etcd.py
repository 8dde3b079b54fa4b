"""An asyncio client for etcd's v3 JSON gateway (`/v3/...` on etcd's client port, etcd 3.4+).

Role: the only module that speaks to etcd. It covers kv (range, put, delete, txn with compares),
leases (grant, keepalive, revoke, time-to-live), watch (a streaming response that resumes on
another endpoint from the next revision), and elections (campaign, leader, proclaim, resign).
Keys and values are bytes (a str is UTF-8 encoded); the gateway's base64 and its int64-as-string
JSON stay inside. Results are typed dataclasses; failures are typed errors: `EtcdUnavailable`
when no endpoint answers, `EtcdError` with etcd's gRPC code and message when one refuses.

Endpoints: a request goes to the endpoint that last answered; on a connection error it fails
over to the next one. A request that was sent and got no answer (a timeout, a cut connection)
is retried elsewhere only when repeating it is harmless; `txn`, `campaign` and `proclaim` then
raise `EtcdUnavailable(maybe_applied=True)` instead, and the caller must read to find out.

It must not know AMQP, queues, exchanges, the model or what any key means.

Threading: one client belongs to the event loop it is first used on (its aiohttp session is
bound to it) and is used from that loop only; it is not thread-safe. Every method is a
coroutine; cancelling one abandons its HTTP request (a cancelled campaign withdraws on etcd).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from typing import Literal

import aiohttp

from leveret.broker.cluster.etcd_types import (
    Compare,
    Delete,
    DeleteResult,
    Get,
    Json,
    KeyLike,
    KeyValue,
    LeaderKey,
    LeaseInfo,
    Put,
    PutResult,
    RangeResult,
    TxnOp,
    TxnResult,
    WatchEvent,
    as_int,
    b64,
    header_revision,
    key_range,
    kv_or_none,
    prefix_end,
    to_bytes,
    unb64,
)

__all__ = [
    "Compare", "Delete", "DeleteResult", "EtcdClient", "EtcdClosed", "EtcdCompacted", "EtcdError",
    "EtcdException", "EtcdUnavailable", "Get", "KeyLike", "KeyValue", "LeaderKey", "LeaseInfo",
    "Put", "PutResult", "RangeResult", "TxnOp", "TxnResult", "WatchEvent", "prefix_end",
]

NOT_FOUND = 5  # gRPC codes, as etcd's gateway returns them in "code"
UNAVAILABLE = 14
MAX_STREAM_LINE_BYTES = 64 * 1024 * 1024
WATCH_RECONNECT_PAUSE_S = 0.2
CLIENT_TIMEOUT = -1.0  # as a timeout_s argument: the client's timeout_s


class EtcdException(Exception):
    """Anything this client raises about etcd."""


class EtcdError(EtcdException):
    """etcd answered and refused the request: its gRPC code and message, and the HTTP status."""

    def __init__(self, code: int, message: str, http_status: int = 0) -> None:
        super().__init__(f"etcd error {code}: {message}")
        self.code = code
        self.message = message
        self.http_status = http_status


class EtcdCompacted(EtcdError):
    """A watch or read asked for a revision that etcd has compacted away."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(11, f"revision compacted up to {compact_revision}")
        self.compact_revision = compact_revision


class EtcdClosed(EtcdException):
    """The client was closed: a bug in its owner, or a shutdown racing a request."""


class EtcdUnavailable(EtcdException):
    """No endpoint answered. `maybe_applied`: the request was sent and may have taken effect."""

    def __init__(self, endpoints: Sequence[str], causes: Sequence[str],
                 maybe_applied: bool = False) -> None:
        detail = "; ".join(causes) or "no endpoint"
        super().__init__(f"etcd unavailable at {', '.join(endpoints)}: {detail}")
        self.endpoints = list(endpoints)
        self.causes = list(causes)
        self.maybe_applied = maybe_applied


def _refusal(status: int, data: Json) -> EtcdError | None:
    if status == 200 and "error" not in data:
        return None
    message = str(data.get("message") or data.get("error") or f"HTTP {status}")
    return EtcdError(as_int(data.get("code")), message, status)


class EtcdClient:
    """An etcd client over one or more gateway URLs (`http://host:2379`, or comma-separated)."""

    def __init__(self, endpoints: Sequence[str] | str, *, timeout_s: float = 5.0,
                 connect_timeout_s: float = 2.0) -> None:
        urls = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
        self.endpoints = [url.strip().rstrip("/") for url in urls if url.strip()]
        if not self.endpoints:
            raise ValueError("no etcd endpoint given")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._current = 0
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session; any later call raises EtcdClosed."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise EtcdClosed("the etcd client is closed")
        if self._session is None:
            # A fresh connection per request: a pooled one that died with its etcd would make a
            # request fail after it was "sent", and a txn could not then be retried.
            connector = aiohttp.TCPConnector(force_close=True)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _order(self) -> list[int]:
        count = len(self.endpoints)
        return [(self._current + step) % count for step in range(count)]

    async def _call(self, path: str, body: Json, *, resend: bool = True,
                    timeout_s: float | None = CLIENT_TIMEOUT) -> Json:
        """POST to the first endpoint that answers; see the module docstring for failover."""
        total = self.timeout_s if timeout_s == CLIENT_TIMEOUT else timeout_s
        timeout = aiohttp.ClientTimeout(total=total, connect=self.connect_timeout_s)
        causes: list[str] = []
        for index in self._order():
            url = self.endpoints[index] + path
            try:
                async with self._http().post(url, json=body, timeout=timeout) as response:
                    data = await response.json(content_type=None)
                    status = response.status
            except aiohttp.ClientConnectorError as exc:
                causes.append(f"{url}: {exc}")
                continue
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                causes.append(f"{url}: {type(exc).__name__} {exc}".rstrip())
                if not resend:
                    raise EtcdUnavailable(self.endpoints, causes, maybe_applied=True) from exc
                continue
            if not isinstance(data, dict):
                raise EtcdError(0, f"unexpected answer from {url}: {data!r:.80}", status)
            refusal = _refusal(status, data)
            if refusal is not None and refusal.code == UNAVAILABLE:  # no leader, timed out
                causes.append(f"{url}: {refusal.message}")
                if not resend:
                    raise EtcdUnavailable(self.endpoints, causes, maybe_applied=True)
                continue
            if refusal is not None:
                raise refusal
            self._current = index
            return data
        raise EtcdUnavailable(self.endpoints, causes)

    # -- kv ------------------------------------------------------------------------------------

    async def range(self, key: KeyLike, range_end: KeyLike | None = None, *,
                    prefix: bool = False, revision: int = 0, limit: int = 0,
                    keys_only: bool = False, count_only: bool = False) -> RangeResult:
        """Keys in [key, range_end), or those starting with `key` if `prefix`, sorted by key."""
        body = key_range(key, range_end, prefix)
        if revision:
            body["revision"] = str(revision)
        if limit:
            body["limit"] = str(limit)
        if keys_only:
            body["keys_only"] = True
        if count_only:
            body["count_only"] = True
        try:
            return RangeResult.from_json(await self._call("/v3/kv/range", body))
        except EtcdError as exc:
            raise _compacted(exc) from None

    async def get(self, key: KeyLike) -> KeyValue | None:
        result = await self.range(key)
        return result.kvs[0] if result.kvs else None

    async def put(self, key: KeyLike, value: KeyLike, *, lease: int = 0,
                  prev_kv: bool = False) -> PutResult:
        body = Put(key, value, lease, prev_kv).to_json()["request_put"]
        return PutResult.from_json(await self._call("/v3/kv/put", body))

    async def delete(self, key: KeyLike, range_end: KeyLike | None = None, *,
                     prefix: bool = False, prev_kv: bool = False) -> DeleteResult:
        body = Delete(key, range_end, prefix, prev_kv).to_json()["request_delete_range"]
        return DeleteResult.from_json(await self._call("/v3/kv/deleterange", body))

    async def txn(self, compare: Iterable[Compare], success: Iterable[TxnOp] = (),
                  failure: Iterable[TxnOp] = ()) -> TxnResult:
        """If every compare holds, run `success`, else `failure`: atomically, at one revision."""
        body = {"compare": [c.to_json() for c in compare],
                "success": [op.to_json() for op in success],
                "failure": [op.to_json() for op in failure]}
        return TxnResult.from_json(await self._call("/v3/kv/txn", body, resend=False))

    # -- leases --------------------------------------------------------------------------------

    async def lease_grant(self, ttl_s: int, lease_id: int = 0) -> LeaseInfo:
        """A new lease. etcd may raise the TTL to its minimum (2 s with default settings)."""
        body: Json = {"TTL": str(ttl_s), "ID": str(lease_id)}
        data = await self._call("/v3/lease/grant", body)
        return LeaseInfo(as_int(data.get("ID")), as_int(data.get("TTL")), as_int(data.get("TTL")))

    async def lease_keepalive(self, lease_id: int,
                              timeout_s: float | None = CLIENT_TIMEOUT) -> int:
        """Renew a lease once; returns its new TTL in seconds, 0 if the lease is gone."""
        data = await self._call("/v3/lease/keepalive", {"ID": str(lease_id)},
                                timeout_s=timeout_s)
        if "error" in data:
            raise _stream_error(data)
        result: Json = data.get("result", data)
        return as_int(result.get("TTL"))

    async def lease_revoke(self, lease_id: int) -> bool:
        """Revoke a lease and delete its keys; False if it was already gone."""
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease_id)})
        except EtcdError as exc:
            if exc.code == NOT_FOUND:
                return False
            raise
        return True

    async def lease_time_to_live(self, lease_id: int, keys: bool = False) -> LeaseInfo:
        data = await self._call("/v3/lease/timetolive", {"ID": str(lease_id), "keys": keys})
        ttl = int(data.get("TTL", 0))
        return LeaseInfo(lease_id, ttl, as_int(data.get("grantedTTL")),
                         [unb64(k) for k in data.get("keys", [])])

    # -- watch ---------------------------------------------------------------------------------

    async def watch(self, key: KeyLike, range_end: KeyLike | None = None, *,
                    prefix: bool = False, start_revision: int = 0, prev_kv: bool = False,
                    reconnect_s: float | None = None) -> AsyncGenerator[WatchEvent, None]:
        """Events on the key range in revision order, from `start_revision` (0: from now).

        A broken stream is reopened, on any endpoint that answers within `reconnect_s` (default:
        the client's timeout), from the revision after the last event: none is lost or repeated.
        Raises EtcdCompacted if that revision is compacted, and EtcdUnavailable when no endpoint
        answers. A paused etcd is not detected here: a Lease (`leveret.broker.cluster.lease`)
        notices that."""
        next_revision = start_revision
        opened = False
        while True:
            body = key_range(key, range_end, prefix)
            if next_revision:
                body["start_revision"] = str(next_revision)
            if prev_kv:
                body["prev_kv"] = True
            request = {"create_request": body}
            response = await (self._reopen("/v3/watch", request, reconnect_s) if opened
                              else self._open_stream("/v3/watch", request))
            opened = True
            try:
                async for message in _json_lines(response):
                    result = _watch_result(message)
                    if result.get("created") and not next_revision:
                        next_revision = header_revision(result) + 1
                    for item in result.get("events", []):
                        event = _event(item)
                        next_revision = event.kv.mod_revision + 1
                        yield event
            except (aiohttp.ClientError, TimeoutError):
                pass  # the stream broke: reopen from next_revision
            finally:
                response.close()
            await asyncio.sleep(WATCH_RECONNECT_PAUSE_S)

    async def _reopen(self, path: str, body: Json,
                      reconnect_s: float | None) -> aiohttp.ClientResponse:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + (self.timeout_s if reconnect_s is None else reconnect_s)
        while True:
            try:
                return await self._open_stream(path, body)
            except EtcdUnavailable:
                if loop.time() >= give_up:
                    raise
            await asyncio.sleep(WATCH_RECONNECT_PAUSE_S)

    async def _open_stream(self, path: str, body: Json) -> aiohttp.ClientResponse:
        timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout_s,
                                        sock_connect=self.connect_timeout_s)
        causes: list[str] = []
        for index in self._order():
            url = self.endpoints[index] + path
            try:
                response = await self._http().post(url, json=body, timeout=timeout)
            except (aiohttp.ClientError, TimeoutError) as exc:
                causes.append(f"{url}: {type(exc).__name__} {exc}".rstrip())
                continue
            if response.status != 200:
                data = await response.json(content_type=None)
                response.close()
                raise _refusal(response.status, data) or EtcdError(0, "stream refused")
            self._current = index
            return response
        raise EtcdUnavailable(self.endpoints, causes)

    # -- elections -----------------------------------------------------------------------------

    async def campaign(self, name: KeyLike, lease: int, value: KeyLike, *,
                       timeout_s: float | None = None) -> LeaderKey:
        """Wait until this lease leads election `name`; its key is `<name>/<lease in hex>`."""
        body = {"name": b64(to_bytes(name)), "lease": str(lease),
                "value": b64(to_bytes(value))}
        data = await self._call("/v3/election/campaign", body, resend=False, timeout_s=timeout_s)
        leader = data.get("leader", {})
        return LeaderKey(unb64(leader.get("name")), unb64(leader.get("key")),
                         as_int(leader.get("rev")), as_int(leader.get("lease")))

    async def leader(self, name: KeyLike) -> KeyValue | None:
        """The current leader's key and value, or None when the election has no leader."""
        try:
            data = await self._call("/v3/election/leader", {"name": b64(to_bytes(name))})
        except EtcdError as exc:
            if "no leader" in exc.message:
                return None
            raise
        return kv_or_none(data.get("kv"))

    async def proclaim(self, leader: LeaderKey, value: KeyLike) -> None:
        """Change the leader's value, only while `leader` still holds the election."""
        body = {"leader": leader.to_json(), "value": b64(to_bytes(value))}
        await self._call("/v3/election/proclaim", body, resend=False)

    async def resign(self, leader: LeaderKey) -> None:
        """Give up the election (a no-op if `leader` no longer holds it)."""
        await self._call("/v3/election/resign", {"leader": leader.to_json()})


def _compacted(exc: EtcdError) -> EtcdError:
    return EtcdCompacted(0) if "compacted" in exc.message else exc


def _stream_error(message: Json) -> EtcdError:
    """A gateway stream's error line: {"error": {"grpc_code", "message", ...}} or flat."""
    error = message.get("error")
    detail: Json = error if isinstance(error, dict) else message
    code = as_int(detail.get("grpc_code") or detail.get("code"))
    return EtcdError(code, str(detail.get("message") or error or "stream failed"),
                     as_int(detail.get("http_code")))


def _watch_result(message: Json) -> Json:
    if "error" in message:
        raise _stream_error(message)
    result: Json = message.get("result", {})
    if result.get("canceled"):
        compact = as_int(result.get("compact_revision"))
        if compact:
            raise EtcdCompacted(compact)
        raise EtcdError(0, str(result.get("cancel_reason") or "watch canceled by etcd"))
    return result


def _event(item: Json) -> WatchEvent:
    kind: Literal["PUT", "DELETE"] = "DELETE" if item.get("type") == "DELETE" else "PUT"
    return WatchEvent(kind, KeyValue.from_json(item.get("kv", {})),
                      kv_or_none(item.get("prev_kv")))


async def _json_lines(response: aiohttp.ClientResponse) -> AsyncIterator[Json]:
    """The newline-delimited JSON messages of a gateway stream."""
    buffer = bytearray()
    async for chunk in response.content.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[:end + 1]
            if line.strip():
                try:
                    message = json.loads(line)
                except ValueError:
                    raise EtcdError(0, f"not JSON from etcd: {line[:80]!r}") from None
                yield message if isinstance(message, dict) else {}
        if len(buffer) > MAX_STREAM_LINE_BYTES:
            raise EtcdError(0, f"stream message over {MAX_STREAM_LINE_BYTES} bytes")
