"""What reopening a log's files costs (the node's cap on open logs, storage/openlogs.py).

    PYTHONPATH=... python bench/open_logs.py [--logs 1000] [--appends 20000] [--rounds 5]

One process, `--logs` logs of the broker's queue settings (fsync "always" left to the owner,
no folder lock of their own), appended to round-robin with one 100-byte record each, as 1,000
queues taking one message a second each are: with no cap (every log keeps its two files open),
and with a cap of a tenth of the logs (almost every append reopens its log's segment and index,
and another log closes its own). Each write's sync ticket is taken, run and handed back at
once, as the syncer's round would, so no log is left waiting for an fsync; the fdatasyncs are
the same in both runs, and their time is reported apart. Prints microseconds per append, the
median of --rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from leveret.storage import Log, LogConfig
from leveret.storage.openlogs import OpenLogs


def one_run(root: Path, logs: int, appends: int, cap: int | None) -> tuple[float, float, int]:
    """(µs per append without the fsync, µs per fsync, files released)."""
    open_logs = OpenLogs(cap) if cap else None
    config = LogConfig(fsync="always", fsync_on_write=False, folder_lock=False,
                       open_logs=open_logs)
    opened = [Log.open(root / f"q{i}", config) for i in range(logs)]
    record = [b"x" * 100]
    write_s = sync_s = 0.0
    for n in range(appends):
        log = opened[n % logs]
        began = time.perf_counter()
        log.append(record)
        ticket = log.sync_ticket(hold=False)
        middle = time.perf_counter()
        assert ticket is not None
        ticket.run()
        ended = time.perf_counter()
        log.synced(ticket)
        write_s += middle - began + time.perf_counter() - ended
        sync_s += ended - middle
    for log in opened:
        log.close()
    released = open_logs.released if open_logs is not None else 0
    return write_s / appends * 1e6, sync_s / appends * 1e6, released


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logs", type=int, default=1000)
    p.add_argument("--appends", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    results: dict[str, list[tuple[float, float, int]]] = {"no cap": [], "cap": []}
    for _ in range(args.rounds):
        for label, cap in (("no cap", None), ("cap", max(1, args.logs // 10))):
            with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
                results[label].append(one_run(Path(tmp), args.logs, args.appends, cap))
    print(f"{args.logs} logs, {args.appends} appends round-robin, median of {args.rounds}")
    for label, runs in results.items():
        write = statistics.median(r[0] for r in runs)
        sync = statistics.median(r[1] for r in runs)
        print(f"{label:>7}: {write:.1f} us per append (fdatasync apart: {sync:.1f} us), "
              f"files released {runs[0][2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
