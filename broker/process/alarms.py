"""Resource alarms: a memory high watermark and a free-disk low watermark, as RabbitMQ has.

A monitor samples the broker's resident memory and the free space of the data directory's
filesystem once a second. When either crosses its threshold an alarm is set; publishing
connections are then blocked (connection.blocked, and their sockets are no longer read) while
consumers keep draining. When the alarm clears, they get connection.unblocked and are read again.
The reasons are RabbitMQ's texts: "low on memory", "low on disk", "low on memory & disk".

The memory figure is the resident memory of the broker's processes. Before the memory alarm
is set, the main process gives glibc's free heap back to the system (malloc_trim): after a
burst, glibc keeps the pages Python freed, and the alarm would see memory nothing holds.

Runs on the event loop; samples with the standard library only.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from leveret.broker.process import logs

log = logs.get("leveret.alarms")
SAMPLE_INTERVAL_S = 1.0


def total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resident_memory_bytes(pids: Iterable[int] = ()) -> int:
    """This process's resident memory, and that of `pids` (the wire workers) that still run."""
    total = 0
    for pid in ("self", *pids):
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            if pid == "self":
                raise
    return total


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up among the symbols the process already has (no search
    for the library, which would run ldconfig at start-up); None with another C library."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _malloc_trim()


def return_free_heap() -> bool:
    """Give the heap that the C allocator keeps after Python freed it back to the system;
    False where the C library cannot (not glibc)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class Alarms:
    def __init__(self, data_dir: Path, memory_high_watermark: float, disk_free_limit_bytes: int,
                 on_change: Callable[[str | None], None]) -> None:
        self.data_dir = data_dir
        self.memory_high_watermark = memory_high_watermark
        self.disk_free_limit_bytes = disk_free_limit_bytes
        self.on_change = on_change
        self.worker_pids: Callable[[], list[int]] = list  # the wire workers' (server.py)
        self.memory = False
        self.disk = False
        self._task: asyncio.Task[None] | None = None

    @property
    def memory_limit_bytes(self) -> int:
        return int(total_memory_bytes() * self.memory_high_watermark)

    @property
    def reason(self) -> str | None:
        if self.memory and self.disk:
            return "low on memory & disk"
        if self.memory:
            return "low on memory"
        if self.disk:
            return "low on disk"
        return None

    def sample(self) -> None:
        """Check both resources now; tell the broker if the alarm state changed."""
        before = self.reason
        limit = self.memory_limit_bytes
        resident = resident_memory_bytes(self.worker_pids())
        if resident > limit and return_free_heap():
            resident = resident_memory_bytes(self.worker_pids())
        self.memory = resident > limit
        try:
            free = shutil.disk_usage(self.data_dir).free
            self.disk = free < self.disk_free_limit_bytes
        except OSError:
            self.disk = True
        after = self.reason
        if after != before:
            if after is None:
                log.warning("resource alarm cleared")
            else:
                log.warning("resource alarm set", reason=after)
            self.on_change(after)

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            self.sample()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
