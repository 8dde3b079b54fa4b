"""What a process uses, read from /proc: resident memory and open file descriptors.

A broker is its process and its children: `leveret serve --workers N` holds its clients'
sockets, and their buffers, in its wire worker processes, so each figure here is summed over
the process and its children."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable


def children(pid: int) -> list[int]:
    """The process's children now (its wire workers)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listed:
                found += [int(child) for child in listed.read().split()]
    except OSError:
        pass
    return found


def _status_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def _summed(pid: int, one: Callable[[int], float]) -> float:
    total = one(pid)
    for child in children(pid):
        try:
            total += one(child)
        except (OSError, RuntimeError):  # it exited meanwhile
            pass
    return total


def rss_mb(pid: int) -> float:
    """Resident set size in MiB (VmRSS), of the process and its children."""
    return _summed(pid, lambda p: _status_mb(p, "VmRSS:"))


def peak_rss_mb(pid: int) -> float:
    """The highest resident set size so far, in MiB (VmHWM), summed over the process and
    its children (each one's own peak)."""
    return _summed(pid, lambda p: _status_mb(p, "VmHWM:"))


def open_fds(pid: int) -> int:
    """Open file descriptors of the process and its children."""
    return int(_summed(pid, lambda p: len(os.listdir(f"/proc/{p}/fd"))))


def raise_nofile(wanted: int) -> int:
    """Raise this process's RLIMIT_NOFILE soft limit towards `wanted` (up to the hard
    limit); children inherit it. Returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return max(soft, target)


def open_files_limit(pid: int) -> int:
    """The soft limit of open files of a process (from /proc/<pid>/limits)."""
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise RuntimeError(f"no open files limit for pid {pid}")
