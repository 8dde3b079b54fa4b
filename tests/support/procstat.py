"""What a process uses, read from /proc: resident memory and open file descriptors."""

from __future__ import annotations

import os
import resource


def rss_mb(pid: int) -> float:
    """Resident set size in MiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def peak_rss_mb(pid: int) -> float:
    """The highest resident set size so far, in MiB (VmHWM)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


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
