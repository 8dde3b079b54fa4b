"""Measurements around a run: broker CPU and RSS from /proc, the generator's own CPU, percentiles.

Role: read utime+stime (and VmRSS) of the broker's processes, each given pid with all its
descendants (RabbitMQ's beam.smp has helper children), and turn latency samples into p50/p99.
Linux only: it reads /proc.

It must not know scenarios or AMQP. Threading contract: none (plain functions, small objects).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Sequence

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def process_tree(pids: Iterable[int]) -> list[int]:
    """The pids and all their descendants that are alive now."""
    children = _children_map()
    found: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in found or not os.path.exists(f"/proc/{pid}"):
            continue
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def machine_busy_ticks() -> int:
    """Busy ticks of every core since boot (the `cpu` line of /proc/stat less idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0
    return sum(fields[:8]) - fields[3] - fields[4]


class BrokerProbe:
    """CPU% over a window and RSS now, summed over the broker's process trees; inert if no pid.

    It also measures the whole machine's busy CPU over the same window, so a run that shared
    the cores with something else (another benchmark, a test suite) shows it."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self._ticks = 0
        self._t0 = 0.0
        self._machine = 0

    def _tree(self) -> list[int]:
        return process_tree(self.pids) if self.pids else []

    def start(self) -> None:
        self._ticks = sum(cpu_ticks(p) for p in self._tree())
        self._machine = machine_busy_ticks()
        self._t0 = time.monotonic()

    def machine_pct(self) -> float:
        """Percent of one core that the whole machine was busy since start() (all cores)."""
        wall = max(time.monotonic() - self._t0, 1e-6)
        return round(100.0 * (machine_busy_ticks() - self._machine) / CLK_TCK / wall, 1)

    def cpu_pct(self) -> float | None:
        """Percent of one core since start(); 200 means two cores busy."""
        if not self.pids:
            return None
        ticks = sum(cpu_ticks(p) for p in self._tree()) - self._ticks
        wall = max(time.monotonic() - self._t0, 1e-6)
        return round(100.0 * ticks / CLK_TCK / wall, 1)

    def rss_kb(self) -> int | None:
        if not self.pids:
            return None
        return sum(rss_kb(p) for p in self._tree())


class SelfCpu:
    """This process's CPU (user+system) over a window, as percent of one core."""

    def start(self) -> None:
        t = os.times()
        self._cpu = t.user + t.system
        self._t0 = time.monotonic()

    def pct(self) -> float:
        t = os.times()
        return round(
            100.0 * (t.user + t.system - self._cpu) / max(time.monotonic() - self._t0, 1e-6), 1
        )


def percentiles(samples: Sequence[int], qs: Sequence[float]) -> list[float | None]:
    """Nearest-rank percentiles of nanosecond samples, in milliseconds."""
    if not samples:
        return [None for _ in qs]
    ordered = sorted(samples)
    out: list[float | None] = []
    for q in qs:
        rank = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
        out.append(round(ordered[rank] / 1e6, 3))
    return out


def weighted_percentiles(
    values: Sequence[int], weights: Sequence[int], qs: Sequence[float]
) -> list[float | None]:
    """Percentiles (ms) of nanosecond values where values[i] stands for weights[i] samples."""
    total = sum(weights)
    if not total:
        return [None for _ in qs]
    pairs = sorted(zip(values, weights, strict=True))
    out: list[float | None] = []
    for q in qs:
        need = max(1, q / 100 * total)
        seen = 0
        for value, weight in pairs:
            seen += weight
            if seen >= need:
                out.append(round(value / 1e6, 3))
                break
    return out


def listening_pids(port: int) -> list[int]:
    """pids of the processes holding a listening TCP socket on this port (any address): the
    broker, found without knowing what it is (reads /proc/net/tcp{,6} and /proc/*/fd)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{inode}]")
        except OSError:
            continue
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return found
