"""Benchmark of the cluster's node-to-node link (leveret.broker.cluster.link), two processes.

    python bench/cluster_link.py                 # 3 s per figure
    python bench/cluster_link.py --seconds 10 --loop uvloop

A server process (node "a") listens on loopback; this process (node "b") connects with the
handshake and measures, one after the other:

- `calls_per_s[c]`: request/response round trips per second with `c` callers in flight
  (`link.call("echo", {"n": i})`, a small JSON body answered by an async handler);
- `chunk_mb_per_s[size]`: one-way raw chunk frames of `size` bytes, sent as fast as the link's
  backpressure lets them, with the CRC checked on arrival; timed until a final call confirms
  the peer has handled every chunk (MB are 10^6 bytes of chunk data).

It prints one JSON line. It never runs as part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import time
from typing import Any

from leveret.broker.cluster.link import Chunk, Handlers, Link, LinkConfig, LinkServer, connect

SECRET = b"bench-secret"


def _config(node: str) -> LinkConfig:
    return LinkConfig(cluster="bench", node=node, secret=SECRET)


def _use_loop(name: str) -> None:
    if name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _serve(port_out: Any) -> None:
    handlers = Handlers()
    received = 0

    async def echo(link: Link, body: Any) -> Any:
        return body

    async def count(link: Link, body: Any) -> Any:
        return received

    async def on_chunk(link: Link, chunk: Chunk) -> None:
        nonlocal received
        received += len(chunk.data)

    handlers.on_request("echo", echo)
    handlers.on_request("count", count)
    handlers.on_chunk(on_chunk)
    server = LinkServer(_config("a"), handlers, host="127.0.0.1", port=0)
    await server.start()
    port_out.send(server.port)
    await asyncio.Event().wait()


def _server_process(port_out: Any, loop: str) -> None:
    _use_loop(loop)
    asyncio.run(_serve(port_out))


async def _calls(link: Link, callers: int, seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < deadline:
            await link.call("echo", {"n": n})
            n += 1
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return done / (time.perf_counter() - started)


async def _chunks(link: Link, size: int, seconds: float) -> float:
    data = os.urandom(size)
    before = await link.call("count")
    started = time.perf_counter()
    deadline = started + seconds
    sent = 0
    while time.perf_counter() < deadline:
        for _ in range(8):
            await link.send_chunk("bench", 1, data)
            sent += size
    received = await link.call("count", timeout=120) - before
    elapsed = time.perf_counter() - started
    assert received == sent, (received, sent)
    return sent / elapsed / 1e6


async def _run(port: int, seconds: float, callers: list[int], sizes: list[int]) -> dict[str, Any]:
    link = await connect("127.0.0.1", port, _config("b"), Handlers())
    result: dict[str, Any] = {
        "calls_per_s": {c: round(await _calls(link, c, seconds)) for c in callers},
        "chunk_mb_per_s": {s: round(await _chunks(link, s, seconds), 1) for s in sizes},
    }
    await link.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--callers", default="1,16,128")
    parser.add_argument("--chunk-sizes", default="65536,1048576,8388608")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    port_in, port_out = ctx.Pipe(duplex=False)
    server = ctx.Process(target=_server_process, args=(port_out, args.loop), daemon=True)
    server.start()
    try:
        port = port_in.recv()
        _use_loop(args.loop)
        figures = asyncio.run(_run(port, args.seconds,
                                   [int(c) for c in args.callers.split(",")],
                                   [int(s) for s in args.chunk_sizes.split(",")]))
    finally:
        server.terminate()
        server.join()
    print(json.dumps({"bench": "cluster_link", "loop": args.loop, "seconds": args.seconds,
                      "python": platform.python_version(), "cpus": os.cpu_count(),
                      **figures}))


if __name__ == "__main__":
    main()
