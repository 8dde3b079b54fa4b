"""A discard AMQP 0-9-1 server: the load generator's ceiling, with no broker in the way.

    python bench/discard.py [--port 5673] [--workers N]     # serve until SIGTERM / Ctrl-C
    python bench/discard.py --selftest [--quick]            # the generator's ceiling per scenario

It accepts the handshake and answers every setup method (declare, qos, consume, confirm.select,
delete, close) at once. Publishes are dropped and confirmed right away, one multiple ack per
read. A consumer gets pre-built deliveries as fast as the socket takes them, within its prefetch
credit: publisher 0's sequence numbers from 0, stamped with the send time, with the body size
read from the generator's queue names (`bench.<scenario>.<body>.<token>`), so the generator's
correctness checks pass. Nothing is stored and nothing is routed: scenarios (d), (g) and (m),
which need a publish to come back as a delivery, a filter to act or an offset to attach at, are
not served.

It forks N workers (default: one per core) that share one listening socket; each runs a
selectors loop over its connections. It imports the stdlib, pamqp and bench/loadgen only.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from loadgen import wire
from loadgen.client import decode_method
from pamqp import commands
from pamqp import frame as pframe

HERE = Path(__file__).resolve().parent
OUT_HIGH_WATER = 1 << 20  # bytes queued before more deliveries are built
DELIVERY_BATCH = 500


def _method(method: object, channel: int) -> bytes:
    return pframe.marshal(method, channel)  # type: ignore[arg-type]


class Consumer:
    def __init__(self, channel: int, tag: str, queue: str, prefetch: int) -> None:
        self.prefetch = prefetch or 1 << 30
        self.sent = 0
        self.acked = 0
        body_size = _body_size(queue)
        method = wire.deliver_frame(channel, tag, 0, "", queue)
        header = wire.content_header(channel, body_size, wire.properties())
        body = wire.frame(
            wire.FRAME_BODY,
            channel,
            wire.BODY.pack(0, 0, 0, wire.KIND_OTHER) + b"x" * (body_size - wire.BODY_PREFIX),
        )
        self.template = method + header + body
        self.tag_offset = 7 + 4 + 1 + len(tag.encode())
        self.seq_offset = len(method) + len(header) + 7 + 4

    def credit(self) -> int:
        return self.prefetch - (self.sent - self.acked)

    def build(self, count: int) -> bytearray:
        size = len(self.template)
        buf = bytearray(self.template * count)
        ts = time.monotonic_ns()
        pack_tag, pack_seq = wire.U64.pack_into, wire.SEQ_TS.pack_into
        off = 0
        for seq in range(self.sent, self.sent + count):
            pack_tag(buf, off + self.tag_offset, seq + 1)
            pack_seq(buf, off + self.seq_offset, seq, ts)
            off += size
        self.sent += count
        return buf


def _body_size(queue: str) -> int:
    parts = queue.split(".")
    if len(parts) >= 3 and parts[0] == "bench" and parts[2].isdigit():
        return max(int(parts[2]), wire.BODY_PREFIX)
    return 100


class Peer:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = b""
        self.out = bytearray()
        self.started = False
        self.confirm = False
        self.published = 0
        self.prefetch = 0
        self.consumer: Consumer | None = None
        self.closing = False

    def feed(self, data: bytes) -> None:
        buf = self.inbuf + data if self.inbuf else data
        pos = 0
        if not self.started:
            if len(buf) < 8:
                self.inbuf = buf
                return
            self.started = True
            pos = 8
            self.out += _method(
                commands.Connection.Start(
                    server_properties={
                        "product": "discard",
                        "capabilities": {
                            "publisher_confirms": True,
                            "basic.nack": True,
                            "consumer_cancel_notify": True,
                        },
                    },
                    mechanisms="PLAIN AMQPLAIN",
                    locales="en_US",
                ),
                0,
            )
        n = len(buf)
        published = self.published
        unpack_head = wire.FRAME_HEAD.unpack_from
        u32 = wire.U32.unpack_from
        while n - pos >= 8:
            ftype, channel, size = unpack_head(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if ftype == 1:
                index = u32(buf, pos + 7)[0]
                if index == wire.BASIC_PUBLISH:
                    published += 1
                elif index == wire.BASIC_ACK and self.consumer is not None:
                    tag, multiple = wire.parse_confirm(pos + 7, buf)
                    self.consumer.acked = tag if multiple else self.consumer.acked + 1
                else:
                    self.published = published
                    self.method(channel, decode_method(bytes(buf[pos + 7 : end])))
                    published = self.published
            pos = end + 1
        self.inbuf = buf[pos:]
        if published != self.published:
            self.published = published
            if self.confirm:
                self.out += (
                    wire.FRAME_HEAD.pack(1, 1, 13)
                    + struct.pack(">HHQB", 60, 80, published, 1)
                    + wire.FRAME_END_BYTE
                )

    def method(self, channel: int, m: object) -> None:
        name = m.name  # type: ignore[attr-defined]
        reply: object | None = None
        if name == "Connection.StartOk":
            self.out += _method(commands.Connection.Tune(2047, 131072, 0), 0)
        elif name == "Connection.Open":
            reply = commands.Connection.OpenOk()
        elif name == "Connection.Close":
            reply = commands.Connection.CloseOk()
            self.closing = True
        elif name == "Channel.Open":
            reply = commands.Channel.OpenOk()
        elif name == "Channel.Close":
            reply = commands.Channel.CloseOk()
            self.consumer = None
        elif name == "Confirm.Select":
            self.confirm = True
            reply = commands.Confirm.SelectOk()
        elif name == "Queue.Declare":
            reply = commands.Queue.DeclareOk(m.queue or "amq.gen-discard", 0, 0)  # type: ignore[attr-defined]
        elif name == "Queue.Delete":
            reply = commands.Queue.DeleteOk(0)
        elif name == "Queue.Purge":
            reply = commands.Queue.PurgeOk(0)
        elif name == "Basic.Qos":
            self.prefetch = m.prefetch_count  # type: ignore[attr-defined]
            reply = commands.Basic.QosOk()
        elif name == "Basic.Consume":
            tag = m.consumer_tag or "amq.ctag-discard"  # type: ignore[attr-defined]
            self.consumer = Consumer(channel, tag, m.queue, self.prefetch)  # type: ignore[attr-defined]
            reply = commands.Basic.ConsumeOk(tag)
        elif name == "Basic.Cancel":
            self.consumer = None
            reply = commands.Basic.CancelOk(m.consumer_tag)  # type: ignore[attr-defined]
        if reply is not None:
            self.out += _method(reply, channel)

    def fill(self) -> None:
        c = self.consumer
        while c is not None and len(self.out) < OUT_HIGH_WATER and c.credit() > 0:
            self.out += c.build(min(c.credit(), DELIVERY_BATCH))

    def wants_write(self) -> bool:
        return bool(self.out) or (self.consumer is not None and self.consumer.credit() > 0)


def serve(listener: socket.socket) -> None:
    sel = selectors.DefaultSelector()
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ, None)
    peers: dict[int, Peer] = {}
    while True:
        for key, events in sel.select():
            if key.data is None:
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    continue  # another worker took it
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peer = Peer(sock)
                peers[sock.fileno()] = peer
                sel.register(sock, selectors.EVENT_READ, peer)
                continue
            peer = key.data
            try:
                if events & selectors.EVENT_READ:
                    data = peer.sock.recv(1 << 20)
                    if not data:
                        raise ConnectionResetError
                    peer.feed(data)
                peer.fill()
                if peer.out:
                    sent = peer.sock.send(peer.out)
                    del peer.out[:sent]
                    peer.fill()
                if peer.closing and not peer.out:
                    raise ConnectionResetError
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                sel.unregister(peer.sock)
                peers.pop(peer.sock.fileno(), None)
                peer.sock.close()
                continue
            mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.wants_write() else 0)
            if key.events != mask:
                sel.modify(peer.sock, mask, peer)


def run_server(host: str, port: int, workers: int, print_port: bool) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(4096)
    if print_port:
        print(listener.getsockname()[1], flush=True)
    children = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            try:
                serve(listener)
            finally:
                os._exit(0)
        children.append(pid)

    def stop(*_: object) -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        signal.pause()


SELFTEST = [("a", []), ("b", []), ("c", []), ("e", [])]
SELFTEST_SIZES = {
    "a": ["--duration", "10"],
    "b": ["--messages", "2000000"],
    "c": ["--messages", "300000"],
    "e": ["--messages", "1000000"],
}
QUICK_SIZES = {
    "a": ["--duration", "3"],
    "b": ["--messages", "300000"],
    "c": ["--messages", "50000"],
    "e": ["--messages", "200000"],
}


def selftest(quick: bool, bodies: list[int], workers: int) -> int:
    """Run the generator against this server; print its JSON lines, then a summary table."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--port", "0", "--print-port", "--workers", str(workers)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    rows = []
    try:
        for scenario, extra in SELFTEST:
            for body in bodies:
                sizes = (QUICK_SIZES if quick else SELFTEST_SIZES)[scenario]
                cmd = [
                    sys.executable,
                    str(HERE / "load.py"),
                    "--scenario",
                    scenario,
                    "--body",
                    str(body),
                    "--port",
                    str(port),
                    "--broker-pid",
                    str(proc.pid),
                    "--label",
                    "discard",
                    *sizes,
                    *extra,
                ]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                for line in out.stdout.splitlines():
                    print(line, flush=True)
                    rows.append(json.loads(line))
                if out.returncode and not out.stdout:
                    print(out.stderr, file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(10)
    print("\n| scenario | body | msgs/s | MB/s | discard CPU% | generator CPU% | ok |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['body']} | {r['msgs_per_s']:,.0f} | {r['mb_per_s']:.1f} "
            f"| {r['broker_cpu_pct']} | {r['loadgen_cpu_pct']} | {r['ok']} |"
        )
    return 0 if rows and all(r["ok"] for r in rows) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5673)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--print-port", action="store_true", help="print the bound port first")
    p.add_argument("--selftest", action="store_true")
    p.add_argument("--quick", action="store_true", help="with --selftest: shorter runs")
    p.add_argument("--bodies", default="100,1024", help="with --selftest: body sizes")
    args = p.parse_args()
    if args.selftest:
        return selftest(args.quick, [int(b) for b in args.bodies.split(",")], args.workers)
    run_server(args.host, args.port, args.workers, args.print_port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
