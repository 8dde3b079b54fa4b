"""Clocks: where the engine gets "now" in integer milliseconds since the epoch.

Role: the real wall clock, and a FakeClock that tests (and simulations) advance by hand. Every
time-based behaviour of the engine (chunk timestamps, max-age retention, fsync every N ms) reads
time only through the `clock` callable of LogConfig.

Must not know: anything else in the engine. (The broker has its own wall_clock_ms; storage may
not import the broker, so this small twin stays here.)
Threading: system_clock_ms is thread-safe; a FakeClock belongs to one thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def system_clock_ms() -> int:
    """Wall-clock time in integer milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class FakeClock:
    """A clock that only moves when told to: `clock()` returns the current fake time."""

    def __init__(self, now_ms: int = 1_700_000_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        """Move time forward (or back, with a negative value) and return the new time."""
        self.now_ms += ms
        return self.now_ms

    def set(self, now_ms: int) -> None:
        self.now_ms = now_ms
