"""A raw stream-protocol client for the tests: frames built with struct here (independent of
the broker's codec), for what real clients never send."""

from __future__ import annotations

import socket
import struct
from typing import Any


def s(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def strmap(values: dict[str, str]) -> bytes:
    return struct.pack(">i", len(values)) + b"".join(s(k) + s(v) for k, v in values.items())


class RawStream:
    def __init__(self, port: int, timeout: float = 5.0, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.corr = 0
        self.open_properties: dict[str, str] = {}

    def close(self) -> None:
        self.sock.close()

    def send(self, key: int, version: int, body: bytes) -> None:
        payload = struct.pack(">HH", key, version) + body
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)

    def request(self, key: int, body: bytes, version: int = 1) -> int:
        self.corr += 1
        self.send(key, version, struct.pack(">I", self.corr) + body)
        return self.corr

    def read_frame(self) -> bytes:
        """One frame's bytes after its size; ConnectionError when the socket closes."""
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">I", self.buf[:4])[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        size = struct.unpack(">I", self.buf[:4])[0]
        frame, self.buf = self.buf[4 : 4 + size], self.buf[4 + size :]
        return frame

    def next(self, key: int) -> bytes:
        """The next frame with this key (others, like heartbeats, are skipped)."""
        while True:
            frame = self.read_frame()
            if struct.unpack(">H", frame[:2])[0] == key:
                return frame

    def response(self, key: int) -> tuple[int, int, bytes]:
        """(correlation id, code, rest) of the next response to `key`."""
        frame = self.next(key | 0x8000)
        corr, code = struct.unpack(">IH", frame[4:10])
        return corr, code, frame[10:]

    def closed_by_server(self) -> bool:
        """True when the socket closes with nothing else to read (frames are skipped)."""
        try:
            while True:
                self.read_frame()
        except (ConnectionError, TimeoutError, OSError):
            return True

    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> Any:
        self.request(0x11, strmap({"product": "raw"}))
        assert self.response(0x11)[1] == 1
        self.request(0x12, b"")
        assert self.response(0x12)[1] == 1
        self.request(0x13, s("PLAIN") + struct.pack(">i", len(user) + len(password) + 2)
                     + b"\0" + user.encode() + b"\0" + password.encode())
        code = self.response(0x13)[1]
        if code != 1:
            return code
        tune = self.next(0x14)
        frame_max = struct.unpack(">I", tune[4:8])[0]
        self.send(0x14, 1, struct.pack(">II", frame_max, 0))
        self.request(0x15, s(vhost))
        _, code, rest = self.response(0x15)
        self.open_properties = {}
        if code == 1:
            pos, count = 4, struct.unpack(">i", rest[:4])[0]
            for _ in range(count):
                values = []
                for _ in range(2):
                    size = struct.unpack(">h", rest[pos : pos + 2])[0]
                    values.append(rest[pos + 2 : pos + 2 + size].decode())
                    pos += 2 + size
                self.open_properties[values[0]] = values[1]
        return code
