"""One blocking AMQP 0-9-1 connection with one channel: pamqp for setup, struct for the rest.

Role: the slow path (handshake, declare, qos, consume, confirm.select, delete, close) encodes
and decodes with pamqp; the hot paths live in publish.py and consume.py and share this object's
socket and read buffer. Heartbeats are negotiated off (tune-ok heartbeat 0), so nothing but the
benchmark's own traffic crosses the socket.

It must not know scenarios or any broker's internals. Threading contract: one thread.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from pamqp import commands
from pamqp import frame as pframe

from loadgen import wire

CLIENT_PROPERTIES = {
    "product": "leveret-bench",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    },
}


class BrokerError(Exception):
    """The broker closed the channel or connection, cancelled a consumer, or went away."""


class Connection:
    """A TCP connection, handshaken, with channel 1 open."""

    channel = 1

    def __init__(
        self,
        host: str,
        port: int,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        timeout: float = 30.0,
    ) -> None:
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""  # bytes received and not yet consumed, shared with the hot loops
        self.frame_max = 131072
        self.published = 0  # delivery tags handed out on channel 1 in confirm mode
        self._handshake(user, password, vhost)

    # ---- bytes in and out

    def recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if not data:
            raise BrokerError("the broker closed the TCP connection")
        return data

    def send(self, data: bytes | bytearray) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> tuple[int, int, bytes]:
        """(type, channel, payload) of the next whole frame (slow path)."""
        while True:
            if len(self.buf) >= 7:
                ftype, channel, size = wire.FRAME_HEAD.unpack_from(self.buf, 0)
                end = 7 + size
                if len(self.buf) > end:
                    if self.buf[end] != wire.FRAME_END:
                        raise BrokerError(f"bad frame end octet in frame type {ftype}")
                    payload = self.buf[7:end]
                    self.buf = self.buf[end + 1 :]
                    return ftype, channel, payload
            self.buf += self.recv()

    # ---- methods (slow path)

    def send_method(self, method: Any, channel: int | None = None) -> None:
        self.send(pframe.marshal(method, self.channel if channel is None else channel))

    def wait_for(self, *names: str) -> Any:
        """Read until a method with one of these names (e.g. "Queue.DeclareOk") arrives.

        Content frames, deliveries and confirms in between are dropped: this is for setup and
        teardown only. A close or a cancel from the broker raises BrokerError."""
        while True:
            ftype, channel, payload = self.read_frame()
            if ftype != wire.FRAME_METHOD:
                continue
            method = decode_method(payload)
            if method.name in names:
                return method
            if method.name == "Connection.Close":
                self._reply_close_ok(0)
                raise BrokerError(f"connection closed: {method.reply_code} {method.reply_text}")
            if method.name == "Channel.Close":
                self._reply_close_ok(channel)
                raise BrokerError(f"channel closed: {method.reply_code} {method.reply_text}")

    def rpc(self, method: Any, *reply: str, channel: int | None = None) -> Any:
        self.send_method(method, channel)
        return self.wait_for(*reply)

    def _reply_close_ok(self, channel: int) -> None:
        ok = commands.Connection.CloseOk() if channel == 0 else commands.Channel.CloseOk()
        try:
            self.send_method(ok, channel)
        except OSError:
            pass

    def _handshake(self, user: str, password: str, vhost: str) -> None:
        self.send(wire.PROTOCOL_HEADER)
        start = self.wait_for("Connection.Start")
        self.server_properties = dict(start.server_properties or {})
        response = f"\x00{user}\x00{password}"
        self.send_method(
            commands.Connection.StartOk(
                client_properties=CLIENT_PROPERTIES, mechanism="PLAIN", response=response
            ),
            0,
        )
        tune = self.wait_for("Connection.Tune")
        self.frame_max = min(tune.frame_max or 131072, 131072)
        self.send_method(
            commands.Connection.TuneOk(
                channel_max=min(tune.channel_max or 2047, 2047),
                frame_max=self.frame_max,
                heartbeat=0,
            ),
            0,
        )
        self.rpc(commands.Connection.Open(virtual_host=vhost), "Connection.OpenOk", channel=0)
        self.rpc(commands.Channel.Open(), "Channel.OpenOk")

    def declare_queue(
        self,
        name: str,
        durable: bool = True,
        arguments: dict | None = None,
        exclusive: bool = False,
    ) -> Any:
        return self.rpc(
            commands.Queue.Declare(
                queue=name, durable=durable, exclusive=exclusive, arguments=arguments or {}
            ),
            "Queue.DeclareOk",
        )

    def delete_queue(self, name: str) -> None:
        self.rpc(commands.Queue.Delete(queue=name), "Queue.DeleteOk")

    def qos(self, prefetch: int) -> None:
        self.rpc(commands.Basic.Qos(prefetch_count=prefetch), "Basic.QosOk")

    def confirm_select(self) -> None:
        self.rpc(commands.Confirm.Select(), "Confirm.SelectOk")

    def consume(self, queue: str, arguments: dict | None = None, no_ack: bool = False) -> str:
        ok = self.rpc(
            commands.Basic.Consume(queue=queue, no_ack=no_ack, arguments=arguments or {}),
            "Basic.ConsumeOk",
        )
        return str(ok.consumer_tag)

    def ack(self, delivery_tag: int, multiple: bool = True) -> None:
        self.send(wire.ack_frame(self.channel, delivery_tag, multiple))

    def close(self, timeout: float = 5.0) -> None:
        """connection.close and wait for close-ok, dropping whatever arrives meanwhile."""
        try:
            self.sock.settimeout(timeout)
            self.send_method(commands.Connection.Close(200, "bye", 0, 0), 0)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                ftype, _, payload = self.read_frame()
                if ftype == wire.FRAME_METHOD and struct.unpack_from(">I", payload)[0] in (
                    (10 << 16) | 51,
                    (10 << 16) | 50,
                ):
                    break
        except (OSError, BrokerError):
            pass
        finally:
            self.sock.close()


def decode_method(payload: bytes) -> Any:
    index = struct.unpack_from(">I", payload)[0]
    method = commands.INDEX_MAPPING[index]()
    method.unmarshal(payload[4:])
    return method


def connect(host: str, port: int, **kwargs: Any) -> Connection:
    """A connection, retried for a few seconds while the broker refuses (it may be starting)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return Connection(host, port, **kwargs)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
