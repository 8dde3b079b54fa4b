"""The node-to-node link: authenticated, framed, bidirectional connections between cluster nodes.

Role: carry what one node asks of another (forwarded publishes, deliveries, replication) over
TCP. `LinkServer` listens on the cluster port (dual-stack `::` by default, as
broker/process/listen.py binds) and hands each authenticated peer to a callback; `connect()`
returns an authenticated `Link`. Both sides prove they hold the cluster's shared secret with a
mutual HMAC-SHA256 challenge-response; the secret itself never crosses the wire. A `Link`
offers request/response with correlation ids (`call`), one-way messages (`send`), raw chunk
frames (`send_chunk`), heartbeats, backpressure and a clean close. The byte layout is in
link_frames.py and docs/FORMAT.md (section 9); the protocol in docs/CLUSTER.md ("Node-to-node
link").

Failure contract: a malformed, oversized, CRC-damaged or unknown frame, a silent peer, or a
handler that breaks the protocol closes that one link, with one log line, never the process.
Calls outstanding on a closed link fail with `LinkClosed`. A refused handshake raises a typed
`HandshakeError` (`AuthenticationFailed`, `ClusterMismatch`, `VersionMismatch`, ...) whose
message is one line for the operator.

It must not know AMQP, queues, streams or etcd: requests and messages are a kind (a string) and
a JSON body, chunks are an epoch, a stream reference and bytes, tunnel frames an id and bytes.
Callers register handlers.

Threading: one event loop. Every method and callback runs on the loop that created the link;
one-way messages and chunks are handled in arrival order, one at a time, by the link's reader
task (a slow handler stops the reading, which is the backpressure); requests run as tasks,
at most `max_concurrent_requests` at once per link. What is sent in one turn of the loop
leaves in one write at the end of that turn (`_queue`), in the order it was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from leveret.broker.cluster import link_frames as lf
from leveret.broker.cluster.link_frames import Chunk, Frame, FrameError, FrameType
from leveret.broker.cluster.link_handshake import (
    AuthenticationFailed,
    ClusterMismatch,
    Handshake,
    HandshakeError,
    LinkConfig,
    LinkError,
    NodeNameRejected,
    PeerStarting,
    VersionMismatch,
)
from leveret.broker.process import listen, logs

__all__ = [
    "AuthenticationFailed", "CallTimeout", "Chunk", "ClusterMismatch", "Handlers",
    "HandshakeError", "Link", "LinkClosed", "LinkConfig", "LinkError", "LinkServer",
    "NodeNameRejected", "PeerStarting", "RemoteError", "VersionMismatch", "connect",
]

log = logs.get("leveret.cluster.link")
READ_SIZE = 256 * 1024
FLUSH_BYTES = 256 * 1024  # frames held for the end of the turn, at most
READ_LIMIT = 256 * 1024  # the StreamReader pauses reading at twice this
HEARTBEAT = lf.encode(FrameType.HEARTBEAT)


class LinkClosed(LinkError):
    def __init__(self, reason: str) -> None:
        super().__init__(f"cluster link closed: {reason}")
        self.reason = reason


class CallTimeout(LinkError):
    def __init__(self, kind: str, timeout_s: float) -> None:
        super().__init__(f"no reply to {kind!r} within {timeout_s} s")
        self.kind = kind
        self.timeout_s = timeout_s


class RemoteError(LinkError):
    """The peer's handler failed (or it has none for the kind); carries its error's type."""

    def __init__(self, kind: str, error_type: str, message: str) -> None:
        super().__init__(f"{kind!r} failed on the peer: {error_type}: {message}")
        self.kind = kind
        self.error_type = error_type
        self.remote_message = message


RequestHandler = Callable[["Link", Any], Awaitable[Any]]
MessageHandler = Callable[["Link", Any], Awaitable[None]]
ChunkHandler = Callable[["Link", Chunk], Awaitable[None]]
TunnelHandler = Callable[["Link", int, bytes], None]


class Handlers:
    """What a node answers on its links, by kind; shared by every link it is given to, and
    registered before the links exist, so that no frame arrives before its handler."""

    def __init__(self) -> None:
        self.requests: dict[str, RequestHandler] = {}
        self.messages: dict[str, MessageHandler] = {}
        self.chunk: ChunkHandler | None = None
        self.tunnel: TunnelHandler | None = None  # synchronous: it must not block the reader

    def on_request(self, kind: str, handler: RequestHandler) -> None:
        self.requests[kind] = handler

    def on_message(self, kind: str, handler: MessageHandler) -> None:
        self.messages[kind] = handler

    def on_chunk(self, handler: ChunkHandler) -> None:
        self.chunk = handler

    def on_tunnel(self, handler: TunnelHandler) -> None:
        self.tunnel = handler


class Link:
    """One authenticated connection to a peer node. Create with `connect()` or receive from a
    `LinkServer`; both return it after the handshake, with its reader running."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 config: LinkConfig, handlers: Handlers, peer_address: str) -> None:
        self.config = config
        self.handlers = handlers
        self.peer_address = peer_address
        self.peer_node = ""
        self.close_reason: str | None = None
        self._reader = reader
        self._writer = writer
        writer.transport.set_write_buffer_limits(high=config.write_high_water)
        self._decoder = lf.FrameDecoder(config.max_payload)
        self._pending: deque[Frame] = deque()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._call_slots = asyncio.Semaphore(config.max_outstanding_calls)
        self._request_slots = asyncio.Semaphore(config.max_concurrent_requests)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self._close_callbacks: list[Callable[[Link], None]] = []
        self._loop = asyncio.get_running_loop()
        self._last_rx = self._loop.time()
        self._waiting = False  # the reader is waiting on the socket (so silence is the peer's)
        self._out: list[bytes | bytearray | memoryview] = []  # frames of this turn, unwritten
        self._out_bytes = 0
        self._flush_at: asyncio.Handle | None = None

    def __repr__(self) -> str:
        return f"<Link to {self.peer_node or '?'} at {self.peer_address}>"

    @property
    def closed(self) -> bool:
        return self.close_reason is not None

    @property
    def outstanding_calls(self) -> int:
        return len(self._calls)

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for this link: the transport's unsent ones and the decoder's partial
        frame (the StreamReader adds at most 2 * READ_LIMIT before it pauses reading)."""
        return (self._writer.transport.get_write_buffer_size() + self._out_bytes
                + len(self._decoder))

    def get_extra_info(self, name: str) -> object:
        """The transport's information (`peername`, `sockname`, ...), as asyncio gives it."""
        return self._writer.get_extra_info(name)

    def on_close(self, callback: Callable[[Link], None]) -> None:
        if self.closed:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # -- sending

    async def call(self, kind: str, body: Any = None, timeout: float | None = None) -> Any:
        """Send a request and return the peer's reply body. Raises RemoteError if the peer's
        handler failed, CallTimeout, or LinkClosed if the link closes first."""
        timeout_s = self.config.call_timeout_s if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout_s):
                async with self._call_slots:
                    return await self._call(kind, body)
        except TimeoutError:
            raise CallTimeout(kind, timeout_s) from None

    async def _call(self, kind: str, body: Any) -> Any:
        self._check_open()
        call_id = next(self._ids)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._calls[call_id] = future
        try:
            await self._write(lf.encode_json(FrameType.REQUEST,
                                             {"id": call_id, "kind": kind, "body": body}))
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def send(self, kind: str, body: object = None) -> None:
        """One-way message; returns once it is queued below the write high-water mark."""
        await self._write(lf.encode_json(FrameType.MESSAGE, {"kind": kind, "body": body}))

    async def send_chunk(self, stream: str, epoch: int, data: bytes | memoryview) -> None:
        """Raw bytes (a storage chunk, as it is) with the sender's epoch, one-way."""
        frame = lf.encode_chunk(epoch, stream, data)
        if len(frame) - lf.HEADER_SIZE > self.config.max_payload:
            raise ValueError(f"chunk of {len(data)} bytes exceeds the link's frame limit")
        await self._write(frame)

    def post(self, kind: str, body: object = None) -> None:
        """A small one-way message queued at once, without waiting for the write buffer to
        drain (acknowledgements, commit notices). Raises LinkClosed if the link is closed."""
        self._check_open()
        self._queue(lf.encode_json(FrameType.MESSAGE, {"kind": kind, "body": body}))

    def send_tunnel(self, tunnel_id: int, data: bytes | memoryview) -> None:
        """Raw bytes of a tunnel, one-way, queued at once (no waiting: the caller watches
        `buffered_bytes` for backpressure). Raises LinkClosed if the link is closed."""
        self._check_open()
        self._queue(lf.encode_tunnel(tunnel_id, data))

    def flush(self) -> None:
        """Write what this turn queued now rather than at its end (a tunnel session's
        deliveries sent in the callback that committed them: `TunnelSession.flush_now`)."""
        if self.close_reason is None:
            self._flush()

    def _check_open(self) -> None:
        if self.close_reason is not None:
            raise LinkClosed(self.close_reason)

    def _queue(self, frame: bytes | bytearray | memoryview) -> None:
        """Frames sent in one turn of the loop leave in one write, at the end of the turn:
        with many queues, the chunks, acknowledgements and commit points of hundreds of logs
        to one peer were each a send(2) of their own, and each a wake-up of the peer."""
        self._out.append(frame)
        self._out_bytes += len(frame)
        if self._out_bytes >= FLUSH_BYTES:  # a big turn: what drain() waits on is written
            self._flush()
        elif self._flush_at is None:
            self._flush_at = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        out, self._out, self._out_bytes = self._out, [], 0
        if out and not self._writer.transport.is_closing():
            self._writer.write(out[0] if len(out) == 1 else b"".join(out))

    async def _write(self, frame: bytes) -> None:
        self._check_open()
        self._queue(frame)
        if self._writer.transport.get_write_buffer_size():  # the socket is behind anyway:
            self._flush()  # write now, so that drain() holds the sender back by these bytes
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._abort(f"write failed: {exc}")
        self._check_open()

    def send_control(self, frame_type: FrameType, obj: dict[str, Any]) -> None:
        """Queue a control frame without waiting (handshake, CLOSE)."""
        if not self._writer.transport.is_closing():
            self._flush()  # after what was sent before it
            self._writer.write(lf.encode_json(frame_type, obj))

    # -- closing

    async def close(self, reason: str = "closed by this node") -> None:
        """Tell the peer, close the connection and fail outstanding calls with LinkClosed."""
        if self.close_reason is None:
            self.send_control(FrameType.CLOSE, {"code": "normal", "message": reason})
            self._abort(reason)
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    def _abort(self, reason: str) -> None:
        if self.close_reason is not None:
            return
        self.close_reason = reason
        calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(LinkClosed(reason))
        self._flush()
        self._writer.close()
        # unsent bytes get close_grace_s to leave: a peer that reads nothing cannot hold the socket
        self._loop.call_later(self.config.close_grace_s, self._writer.transport.abort)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        self._closed.set()
        for callback in self._close_callbacks:
            callback(self)
        self._close_callbacks.clear()

    def _drop(self, message: str, reason: str) -> None:
        if self.close_reason is None:
            log.warning(message, peer_node=self.peer_node, peer=self.peer_address, reason=reason)
        self._abort(reason)

    async def read_frame(self) -> Frame:
        """The next frame, for the handshake (before the reader task runs)."""
        while not self._pending:
            if self._decoder.error is not None:
                raise self._decoder.error
            data = await self._reader.read(READ_SIZE)
            if not data:
                raise HandshakeError("connection closed during the handshake",
                                     self.peer_address)
            self._pending.extend(self._decoder.feed(data))
        return self._pending.popleft()

    async def _handshake(self, client: bool, admit: Callable[[], bool] | None = None) -> None:
        """Run one side of the handshake; any failure is a HandshakeError, and closes."""
        done = False
        try:
            async with asyncio.timeout(self.config.handshake_timeout_s):
                self.peer_node = await Handshake(self, self.config, client, admit).run()
            done = True
        except HandshakeError as exc:
            self._abort(str(exc))
            raise
        except FrameError as exc:
            self._abort(str(exc))
            raise HandshakeError(f"bad frame in the handshake: {exc}", self.peer_address) from None
        except TimeoutError:
            self._abort("handshake timeout")
            raise HandshakeError(f"no handshake within {self.config.handshake_timeout_s} s",
                                 self.peer_address) from None
        except (ConnectionError, OSError) as exc:
            self._abort(str(exc))
            raise HandshakeError(f"connection failed in the handshake: {exc}",
                                 self.peer_address) from None
        finally:
            if not done:
                self._abort("handshake cancelled")

    def _start(self) -> None:
        self._spawn(self._run())
        self._spawn(self._heartbeat())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- receiving

    async def _run(self) -> None:
        try:
            await self._read_loop()
        except FrameError as exc:  # tell the peer why, then close: the stream is out of sync
            self.send_control(FrameType.CLOSE, {"code": "frame", "message": str(exc)})
            self._drop("cluster link closed: bad frame", str(exc))
        except (ConnectionError, OSError) as exc:
            self._drop("cluster link closed: connection lost", str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the top of the link's task: close the link, not the node
            log.exception("cluster link closed: internal error", peer_node=self.peer_node)
            self._abort(f"internal error: {exc!r}")

    async def _read_loop(self) -> None:
        while self.close_reason is None:
            while self._pending and self.close_reason is None:
                await self._dispatch(self._pending.popleft())
            if self._decoder.error is not None:
                raise self._decoder.error
            self._waiting = True
            self._last_rx = self._loop.time()
            data = await self._reader.read(READ_SIZE)
            self._waiting = False
            if not data:
                self._drop("cluster link closed: connection lost", "peer closed the connection")
                return
            self._pending.extend(self._decoder.feed(data))

    async def _dispatch(self, frame: Frame) -> None:
        kind = frame.type
        if kind is FrameType.HEARTBEAT:
            return
        if kind is FrameType.CHUNK:
            chunk = lf.decode_chunk(frame.payload)
            if self.handlers.chunk is not None:
                await self._one_way("chunk", self.handlers.chunk(self, chunk))
            return
        if kind is FrameType.TUNNEL:
            tunnel_id, data = lf.decode_tunnel(frame.payload)
            if self.handlers.tunnel is not None:
                try:
                    self.handlers.tunnel(self, tunnel_id, data)
                except Exception:  # a handler's failure is its own; the link stays
                    log.exception("cluster link tunnel handler failed",
                                  peer_node=self.peer_node)
            return
        obj = lf.decode_json(frame)
        if kind is FrameType.REQUEST:
            call_id = lf.field(obj, "id", int, kind)
            name = lf.field(obj, "kind", str, kind)
            await self._request_slots.acquire()
            self._spawn(self._serve(call_id, name, obj.get("body")))
        elif kind is FrameType.REPLY:
            self._reply(obj)
        elif kind is FrameType.MESSAGE:
            name = lf.field(obj, "kind", str, kind)
            handler = self.handlers.messages.get(name)
            if handler is not None:
                await self._one_way(name, handler(self, obj.get("body")))
        elif kind is FrameType.CLOSE:
            log.info("cluster link closed by the peer", peer_node=self.peer_node,
                     reason=obj.get("message"))
            self._abort(f"closed by the peer: {obj.get('message')}")
        else:
            raise lf.UnexpectedFrame(f"{kind.name} frame after the handshake")

    async def _one_way(self, name: str, handling: Awaitable[None]) -> None:
        try:
            await handling
        except Exception:  # a handler's failure is its own; the link stays
            log.exception("cluster link handler failed", kind=name, peer_node=self.peer_node)

    def _reply(self, obj: dict[str, Any]) -> None:
        future = self._calls.get(lf.field(obj, "id", int, FrameType.REPLY))
        if future is None or future.done():
            return  # the call timed out or was cancelled: a late reply is dropped
        error = obj.get("error")
        if isinstance(error, dict):
            future.set_exception(RemoteError(str(obj.get("kind")), str(error.get("type")),
                                             str(error.get("message"))))
        else:
            future.set_result(obj.get("body"))

    async def _serve(self, call_id: int, kind: str, body: object) -> None:
        try:
            reply: dict[str, Any] = {"id": call_id, "kind": kind}
            handler = self.handlers.requests.get(kind)
            try:
                if handler is None:
                    raise LookupError(f"no handler for {kind!r}")
                reply["body"] = await handler(self, body)
                frame = lf.encode_json(FrameType.REPLY, reply)
            except Exception as exc:  # noqa: BLE001 - a handler failure is the caller's answer
                reply.pop("body", None)
                reply["error"] = {"type": type(exc).__name__, "message": str(exc)}
                frame = lf.encode_json(FrameType.REPLY, reply)
            with contextlib.suppress(LinkClosed):
                await self._write(frame)
        finally:
            self._request_slots.release()

    async def _heartbeat(self) -> None:
        """Send a HEARTBEAT every interval while nothing else waits to be sent, and drop the
        link once the reader has waited on the socket `heartbeat_timeout_s` with nothing
        arriving. Any frame counts, not only heartbeats (a link busy with chunks sends none),
        and a reader held up by a slow handler is not the peer's silence. A tick that wakes an
        interval late means this node's own loop stalled (a pause, a long synchronous call):
        what the peer sent meanwhile may still be unread, so the peer gets one more interval
        before its silence counts."""
        interval = self.config.heartbeat_interval_s
        timeout = self.config.heartbeat_timeout_s
        loop = self._loop
        beat_at = loop.time() + interval
        grace_until = 0.0
        while self.close_reason is None:
            now = loop.time()
            if self._waiting and now >= grace_until and now - self._last_rx >= timeout:
                self._drop("cluster link closed: peer silent",
                           f"nothing received for {timeout:g} s (heartbeat timeout)")
                return
            if now >= beat_at:
                transport = self._writer.transport
                if (not transport.is_closing() and transport.get_write_buffer_size() == 0
                        and not self._out):
                    self._writer.write(HEARTBEAT)  # unsent bytes would not reach the peer sooner
                beat_at = now + interval
            wake = beat_at
            if self._waiting:
                wake = min(wake, max(self._last_rx + timeout, grace_until))
            await asyncio.sleep(max(0.0, wake - now))
            woke = loop.time()
            if woke - max(wake, now) > interval:
                grace_until = woke + interval


async def connect(host: str, port: int, config: LinkConfig, handlers: Handlers) -> Link:
    """Connect to a peer's LinkServer and return the authenticated Link. Raises a
    HandshakeError subclass if either side refuses, OSError if the connection fails."""
    async with asyncio.timeout(config.handshake_timeout_s):
        reader, writer = await asyncio.open_connection(host, port, limit=READ_LIMIT)
    link = Link(reader, writer, config, handlers, f"{host}:{port}")
    await link._handshake(client=True)
    link._start()
    return link


class LinkServer:
    """Listens on the cluster port; each peer that passes the handshake is handed to
    `on_link`. A refused peer is logged as one line and given to `on_refused`, if set. While
    `admit()` answers False (the node is starting), peers are refused with `PeerStarting`
    (logged at debug level: the dialer tries again soon)."""

    def __init__(self, config: LinkConfig, handlers: Handlers,
                 on_link: Callable[[Link], Awaitable[None]] | None = None, *,
                 on_refused: Callable[[HandshakeError], None] | None = None,
                 host: str = listen.DUAL_STACK, port: int = 0,
                 admit: Callable[[], bool] | None = None) -> None:
        self.config = config
        self.handlers = handlers
        self.admit = admit
        self.host = host
        self.links: set[Link] = set()
        self._port = port
        self._on_link = on_link
        self._on_refused = on_refused
        self._server: asyncio.Server | None = None
        self._closing = False

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one the system chose for 0)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        sock = listen.socket_for(self.host, self._port)
        if sock is not None:
            self._server = await asyncio.start_server(self._accept, sock=sock, limit=READ_LIMIT)
        else:
            self._server = await asyncio.start_server(self._accept, self.host, self._port,
                                                      limit=READ_LIMIT)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        address = f"{listen.unmapped(str(peername[0]))}:{peername[1]}" if peername else "?"
        link = Link(reader, writer, self.config, self.handlers, address)
        try:
            await link._handshake(client=False, admit=self.admit)
        except HandshakeError as exc:
            level = log.debug if isinstance(exc, PeerStarting) else log.warning
            level("cluster link refused", peer=address, code=exc.code, reason=str(exc))
            if self._on_refused is not None:
                self._on_refused(exc)
            return
        if self._closing:
            await link.close("node stopping")
            return
        self.links.add(link)
        link.on_close(self.links.discard)
        link._start()
        log.info("cluster link up", peer_node=link.peer_node, peer=address)
        if self._on_link is not None:
            await self._on_link(link)

    async def close(self) -> None:
        """Stop listening and close every link (a handshake that ends later is closed too)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            await link.close("node stopping")
        if self._server is not None:
            await self._server.wait_closed()
