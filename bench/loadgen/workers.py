"""Several load processes started together: fork, set up, meet at a barrier, run, report.

Role: run one function per worker in its own forked process (one connection each), release
them all at once when every one is set up, run an optional function in the parent at the same
moment (the paced publisher of scenario d), and hand back every worker's result dict. With a
single worker and nothing for the parent to do, the worker runs inline (no fork).

It must not know AMQP or scenarios. Threading contract: call from the main thread only.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from collections.abc import Callable, Sequence
from typing import Any

Ready = Callable[[], None]
Worker = Callable[[Any, Ready], dict]


def _child(fn: Worker, arg: Any, barrier: Any, results: Any, index: int) -> None:
    def ready() -> None:
        barrier.wait(timeout=120)

    try:
        out = fn(arg, ready)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        barrier.abort()
        out = {
            "errors": [f"worker {index}: {type(exc).__name__}: {exc}"],
            "traceback": traceback.format_exc(),
        }
    results.put((index, out))


def run(
    fn: Worker,
    args: Sequence[Any],
    on_start: Callable[[], None],
    parent: Callable[[], Any] | None = None,
    timeout: float = 3600.0,
) -> tuple[list[dict], Any]:
    """Run fn(arg, ready) for every arg; on_start() runs when all have called ready().

    Returns (worker results in arg order, parent's result)."""
    if len(args) == 1 and parent is None:
        return [fn(args[0], on_start)], None
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(args) + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(fn, arg, barrier, results, i), daemon=True)
        for i, arg in enumerate(args)
    ]
    for p in procs:
        p.start()
    parent_result = None
    try:
        barrier.wait(timeout=180)
        on_start()
        if parent is not None:
            parent_result = parent()
    except Exception as exc:  # noqa: BLE001 - a broken barrier: the workers say why
        parent_result = {"errors": [f"parent: {type(exc).__name__}: {exc}"]}
    out: list[dict | None] = [None] * len(args)
    for _ in procs:
        try:
            index, res = results.get(timeout=timeout)
        except queue.Empty:
            break
        out[index] = res
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    done = [
        r if r is not None else {"errors": [f"worker {i} never reported"]}
        for i, r in enumerate(out)
    ]
    return done, parent_result
