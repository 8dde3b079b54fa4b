"""A scheduler that a test drives by hand: the model's scheduler interface (now_ms, call_soon,
call_later) with turns and timers run only when the test says so, so that unit tests of the
writer and the committer can tell exactly which turn or timer confirmed what."""

from __future__ import annotations

from collections.abc import Callable


class Timer:
    def __init__(self, delay_ms: int, callback: Callable[[], None]) -> None:
        self.delay_ms = delay_ms
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualScheduler:
    """call_soon runs at the end of the turn (`turn()`), or at once with inline_soon=True;
    timers run when `fire()` is called."""

    def __init__(self, inline_soon: bool = False) -> None:
        self.inline_soon = inline_soon
        self.soon: list[Callable[[], None]] = []
        self.timers: list[Timer] = []

    def now_ms(self) -> int:
        return 0

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Timer:
        self.timers.append(Timer(delay_ms, callback))
        return self.timers[-1]

    def call_soon(self, callback: Callable[[], None]) -> None:
        if self.inline_soon:
            callback()
        else:
            self.soon.append(callback)

    def turn(self) -> None:
        soon, self.soon = self.soon, []
        for callback in soon:
            callback()

    def fire(self) -> None:
        live = [t for t in self.timers if not t.cancelled]
        self.timers = []
        for timer in live:
            timer.callback()
