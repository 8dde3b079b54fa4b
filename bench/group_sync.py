"""What making many small appends durable costs on this machine: one fdatasync per file (one
after another, and on a pool of threads, as broker/model/syncer.py did) against one syncfs(2)
of the whole file system per round (what the syncer does now), with and without other dirty
data on the same file system (another process's unsynced writes, which syncfs also writes), and
against what the syncer does with a write-ahead log (storage/wal.py): read each file's new bytes
back (pread), append them all to one WAL file, one fdatasync of it; the WAL file growing (as
built), or preallocated by writing zeros first (so that an fdatasync has no size or extent
change to journal).

    python bench/group_sync.py                       # 100 and 300 files, 5 rounds each
    python bench/group_sync.py --files 300 --dirty-mb 64 --rounds 10

Each round appends --record bytes to each of --files files (in a temporary folder under --dir,
by default bench/results/, which is on the data directories' file system), then makes them
durable one way, and reports the wall time of that, per round (median and max over rounds).
"dirty" rounds first write --dirty-mb of unrelated data, unsynced, into another file of the
same file system. It prints a Markdown table.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIBC = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    if LIBC.syncfs(fd) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def append_all(fds: list[int], record: bytes) -> None:
    for fd in fds:
        os.write(fd, record)


def dirty(path: Path, mb: int) -> None:
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for _ in range(mb):
            f.write(block)


def run(args: argparse.Namespace) -> None:
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    record = os.urandom(args.record)
    pool = ThreadPoolExecutor(16)
    rows = []
    with tempfile.TemporaryDirectory(dir=base, prefix="group-sync-") as tmp:
        folder = Path(tmp)
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        for files in args.files:
            fds = [os.open(folder / f"log{i}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                   for i in range(files)]
            for fd in fds:
                os.write(fd, record)
                os.fdatasync(fd)  # allocated: later appends are like a log's
            readers = [os.open(folder / f"log{i}", os.O_RDONLY) for i in range(files)]
            wal_fd = os.open(folder / "wal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            zeroed = os.open(folder / "wal-zeroed", os.O_WRONLY | os.O_CREAT, 0o644)
            for _ in range(64):  # 64 MB of zeros, durable: later writes only overwrite blocks
                os.write(zeroed, bytes(1 << 20))
            os.fdatasync(zeroed)
            at = [0]

            def wal(fds: list[int] = readers, wal_fd: int = wal_fd) -> None:
                size = len(record)
                os.write(wal_fd, b"".join(os.pread(fd, size, os.fstat(fd).st_size - size)
                                          for fd in fds))
                os.fdatasync(wal_fd)

            def wal_zeroed(fds: list[int] = readers, zeroed: int = zeroed,
                           at: list[int] = at) -> None:
                size = len(record)
                data = b"".join(os.pread(fd, size, os.fstat(fd).st_size - size) for fd in fds)
                os.pwrite(zeroed, data, at[0] % (60 << 20))
                at[0] += len(data)
                os.fdatasync(zeroed)

            ways = {
                "fdatasync each, one after another":
                    lambda fds=fds: [os.fdatasync(fd) for fd in fds],
                "fdatasync each, 16 threads": lambda fds=fds: list(pool.map(os.fdatasync, fds)),
                "one syncfs": lambda: syncfs(dir_fd),
                "WAL: pread each, one append, one fdatasync": wal,
                "WAL preallocated (zeros written first)": wal_zeroed,
            }
            for dirty_mb in (0, args.dirty_mb):
                for name, way in ways.items():
                    times = []
                    for _ in range(args.rounds):
                        if dirty_mb:
                            dirty(folder / "other", dirty_mb)
                        append_all(fds, record)
                        t0 = time.perf_counter()
                        way()
                        times.append(time.perf_counter() - t0)
                        if dirty_mb:  # the next round starts clean of it
                            (folder / "other").unlink()
                            syncfs(dir_fd)
                    rows.append((files, dirty_mb, name, statistics.median(times), max(times)))
            for fd in [*fds, *readers, wal_fd, zeroed]:
                os.close(fd)
            for name in ("wal", "wal-zeroed"):
                (folder / name).unlink()
        os.close(dir_fd)
    print("| files | other dirty data | how | per round: median | max | per file (median) |")
    print("|---|---|---|---|---|---|")
    for files, mb, name, med, top in rows:
        print(f"| {files} | {mb} MB | {name} | {med * 1000:.2f} ms | {top * 1000:.2f} ms "
              f"| {med / files * 1e6:.0f} us |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, nargs="+", default=[1, 10, 100, 300])
    p.add_argument("--record", type=int, default=200, help="bytes appended per file per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dirty-mb", type=int, default=64)
    p.add_argument("--dir", default=str(HERE / "results"))
    run(p.parse_args())


if __name__ == "__main__":
    main()
