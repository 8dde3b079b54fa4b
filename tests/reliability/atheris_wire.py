"""A coverage-guided fuzzer (atheris, libFuzzer) for the sans-IO wire layer: FrameBuffer and
WireConnection, fed any bytes after (usually) a valid handshake. The only exceptions allowed out
of WireConnection.receive are AMQPError and BadProtocolHeader; anything else is a crash that
libFuzzer reports with its input. Every reply the machine writes must parse as frames.

Run by tests/reliability/test_fuzz_frames.py (slow variant):
    python tests/reliability/atheris_wire.py -runs=1000000 -max_len=4096
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import atheris

with atheris.instrument_imports():
    from leveret.amqp import connection as wire
    from leveret.amqp.errors import AMQPError
    from leveret.amqp.frames import FrameBuffer

_HEAD = struct.Struct(">BHI")
PREFIX = bytes.fromhex(
    "414d515000000901"  # AMQP 0-9-1
)


class Handler:
    """Accepts everything, as a broker that is happy with any login would."""

    def __init__(self) -> None:
        self.wire: Any = None

    def on_start_ok(self, *_args: Any) -> None:
        self.wire.start_tune()

    def on_tune_ok(self, *_args: Any) -> None:
        pass

    def on_open(self, *_args: Any) -> None:
        self.wire.open_ok()

    def on_update_secret(self, *_args: Any) -> None:
        pass

    def on_channel_open(self, number: int) -> None:
        self.wire.channel_open_ok(number)

    def on_channel_closed(self, _number: int) -> None:
        pass

    def on_method(self, _number: int, _method: Any) -> None:
        pass

    def on_publish(self, *_args: Any) -> None:
        pass

    def on_ack(self, *_args: Any) -> None:
        pass

    def on_close(self, *_args: Any) -> None:
        pass

    def on_closed(self) -> None:
        pass


def _handshake() -> bytes:
    from pamqp import commands, frame

    return PREFIX + b"".join(frame.marshal(method, 0) for method in (
        commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                    response="\x00guest\x00guest", locale="en_US"),
        commands.Connection.TuneOk(channel_max=16, frame_max=4096, heartbeat=0),
        commands.Connection.Open(),
    )) + frame.marshal(commands.Channel.Open(), 1)


HANDSHAKE = _handshake()


def check_output(data: bytes) -> None:
    pos = 0
    while pos < len(data):
        frame_type, _channel, size = _HEAD.unpack_from(data, pos)
        assert frame_type in (1, 2, 3, 8), frame_type
        assert data[pos + 7 + size] == 0xCE
        pos += 8 + size


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 3)
    piece = fdp.ConsumeIntInRange(1, 64)
    rest = fdp.ConsumeBytes(fdp.remaining_bytes())
    if mode == 0:  # raw bytes from the start: the protocol header and handshake too
        stream = rest
    elif mode == 1:  # the frame buffer alone
        buffer = FrameBuffer(4096)
        for start in range(0, len(rest), piece):
            for _type, _channel, payload in buffer.feed(rest[start : start + piece]):
                assert len(payload) <= 4096
        if buffer.error is not None:
            assert buffer.error.code == 501
            assert buffer.feed(b"\x01\x00\x00\x00\x00\x00\x00\xce") == []
        return
    else:  # after a valid handshake
        stream = HANDSHAKE + rest
    out: list[bytes] = []
    handler = Handler()
    machine = wire.WireConnection(handler, out.append, server_properties={}, frame_max=4096)
    handler.wire = machine
    try:
        for start in range(0, len(stream), piece if mode == 3 else len(stream) or 1):
            machine.receive(stream[start : start + (piece if mode == 3 else len(stream))])
    except AMQPError as error:
        machine.close_connection(error)
    except wire.BadProtocolHeader:
        pass
    check_output(b"".join(out))


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
