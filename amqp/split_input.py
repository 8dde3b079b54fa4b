"""The wire machine's input from a wire worker (docs/WORKERS.md): frames already split, and
runs of publishes, taken with the same checks, errors and order as `receive` takes bytes.

`receive_split(items)` takes what `broker/workers/split.py` made of a client's reads: a frame
`(type, channel, payload)`, or a run `[channel, method payload, header, body, header, body,
...]` of publishes alike on one channel. A run whose every publish would take the one-step way
of `_publish_triple` goes to the handler in one call (`Handler.on_publish_run`); any other is
taken one publish at a time, and a publish that cannot take that way frame by frame, exactly as
`receive` would. Mixed into WireConnection, whose attributes these are; it must not know
sockets or processes. One connection, one thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError, frame_error, frame_explanation
from leveret.amqp.frames import FrameBuffer
from leveret.amqp.handshake import Handler, State


class SplitInput:
    handler: Handler
    state: State
    buffer: FrameBuffer
    max_message_size: int
    frames_received: int
    _unread: list[tuple[int, int, bytes]]

    def _publish_triple(self, number: int, method_payload: bytes, header: bytes,
                        body: bytes) -> bool:
        raise NotImplementedError

    def _run_fits(self, run: list[Any]) -> bool:
        raise NotImplementedError

    def _frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        raise NotImplementedError

    def _closing_frame(self, frame_type: int, payload: bytes) -> None:
        raise NotImplementedError

    def close_channel(self, number: int, error: AMQPError) -> None:
        raise NotImplementedError

    def receive_split(self, items: list[Any]) -> None:
        """What a wire worker split already (docs/WORKERS.md), in the order received: a frame
        `(type, channel, payload)`, or a run of publishes on one channel with one method
        payload, each with its header and one body frame: `[channel, method payload, header,
        body, header, body, ...]`. The same checks, errors and order as `receive` gives the
        same bytes: the frame_max of the moment, each frame's rules, and nothing taken after a
        fatal frame error."""
        self._unread = []
        if self.state is State.CLOSED or self.buffer.error is not None:
            return
        for i, item in enumerate(items):
            if len(item) == 3:
                def after(i: int = i) -> list[tuple[int, int, bytes]]:
                    return _frames_of(items[i + 1 :])

                if not self._split_frames([item], after):
                    return
                continue
            if self.state is State.OPEN and self._publish_run(item, items, i):
                continue
            for k in range(2, len(item), 2):  # one publish at a time, each as receive() would
                def later(k: int = k, i: int = i,
                          item: Any = item) -> list[tuple[int, int, bytes]]:
                    rest = [[item[0], item[1], *item[k + 2 :]]] if k + 2 < len(item) else []
                    return _frames_of(rest + items[i + 1 :])

                if not self._split_publish(item[0], item[1], item[k], item[k + 1], later):
                    return

    def _publish_run(self, run: list[Any], items: list[Any], i: int) -> bool:
        """A run of publishes in one call to the handler, when every one of them would take
        `_publish_triple`'s way; False (nothing done) otherwise."""
        number, method_payload = run[0], run[1]
        if not self._run_fits(run):
            return False
        count = (len(run) - 2) // 2
        self.frames_received += 1  # the first method frame, as receive() counts it
        try:
            exchange, routing_key, mandatory, immediate = codec.decode_publish(method_payload)
            self.handler.on_publish_run(number, exchange, routing_key, mandatory, immediate, run)
        except AMQPError as exc:  # `at`: the publish it is for (0 for a method that is bad)
            exc.for_method(c.CLASS_BASIC, 40)
            if exc.hard:  # counted and unread as receive() leaves them
                self.frames_received += 3 * exc.at
                rest = [[number, method_payload, *run[4 + 2 * exc.at :]]]
                self._unread = _frames_of((rest if len(rest[0]) > 2 else []) + items[i + 1 :])
                raise
            self.close_channel(number, exc)
        self.frames_received += 3 * count - 1
        return True

    def _split_publish(self, number: int, method_payload: bytes, header: bytes, body: bytes,
                       later: Callable[[], list[tuple[int, int, bytes]]]) -> bool:
        """One publish of a worker's run, as receive() takes its three frames."""
        frame_max = self.buffer.frame_max or 0xFFFFFFFF
        if (self.state is State.OPEN and len(method_payload) <= frame_max
                and len(header) <= frame_max and len(body) <= frame_max):
            self.frames_received += 1  # as receive() counts the method frame first
            try:
                taken = self._publish_triple(number, method_payload, header, body)
            except AMQPError:
                self._unread = later()
                raise
            if taken:
                self.frames_received += 2
                return True
            self.frames_received -= 1  # counted again with its frame below
        frames = [(c.FRAME_METHOD, number, method_payload), (c.FRAME_HEADER, number, header),
                  (c.FRAME_BODY, number, body)]
        return self._split_frames(frames, later)

    def _split_frames(self, frames: list[tuple[int, int, bytes]],
                      later: Callable[[], list[tuple[int, int, bytes]]]) -> bool:
        """Frames of a worker's split, one by one as receive() takes them; False once nothing
        more may be taken (the connection closed, or a frame error)."""
        buffer = self.buffer
        for j, (frame_type, channel, payload) in enumerate(frames):
            frame_max = buffer.frame_max or 0xFFFFFFFF
            if len(payload) > frame_max:
                buffer.error = frame_error(frame_explanation(
                    frame_type, b"", "frame_too_large", len(payload),
                    frame_max - c.FRAME_OVERHEAD))
                if self.state not in (State.CLOSING, State.CLOSED):
                    raise buffer.error
                return False
            self.frames_received += 1
            if self.state is State.CLOSING:
                if channel == 0:
                    self._closing_frame(frame_type, payload)
                continue
            if self.state is State.CLOSED:
                return False
            try:
                self._frame(frame_type, channel, payload)
            except AMQPError:
                self._unread = frames[j + 1 :] + later()
                raise
        return True


def _frames_of(items: list[Any]) -> list[tuple[int, int, bytes]]:
    """A worker's split items as plain frames (WireConnection.receive_split)."""
    frames: list[tuple[int, int, bytes]] = []
    for item in items:
        if len(item) == 3:
            frames.append(item)
            continue
        number, method_payload = item[0], item[1]
        for j in range(2, len(item), 2):
            frames += [(c.FRAME_METHOD, number, method_payload),
                       (c.FRAME_HEADER, number, item[j]), (c.FRAME_BODY, number, item[j + 1])]
    return frames
