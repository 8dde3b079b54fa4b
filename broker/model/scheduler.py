"""The clock and timers the model runs on, as an interface.

The model asks for the time and for delayed calls (TTL expiry, x-expires, retention) through a
Scheduler; the runtime backs it with the asyncio loop, and tests can back it with a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    def now_ms(self) -> int: ...
    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Timer: ...
    def call_soon(self, callback: Callable[[], None]) -> None: ...


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
