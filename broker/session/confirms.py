"""Publisher confirms of one channel: sequence numbers out, coalesced basic.ack/nack frames in.

A publish on a channel in confirm mode gets the next sequence number and a `Confirm` that the
queues settle (at once, or later for durable writes and stream chunks). Settled confirms are
gathered during one turn of the event loop and written just before the turn's output, acks
first, coalesced into `multiple=true` frames as RabbitMQ's `send_confirms_and_nacks` does.

Knows the session's `write` and `after_turn` only; nothing of queues, routing or pamqp.
Single-threaded: runs on the event loop thread of its connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from leveret.amqp import codec
from leveret.broker.model.message import Confirm


class Session(Protocol):
    """What confirms need of their connection (`connection.Session`): a Protocol, so that this
    module does not import the session, which imports the channel, which imports it."""

    def write(self, data: bytes) -> None: ...

    def after_turn(self, callback: Callable[[], None]) -> None: ...


class Confirms:
    def __init__(self, session: Session, channel_number: int) -> None:
        self.session = session
        self.number = channel_number
        self.seq = 0  # the last sequence number handed out
        self.outstanding: dict[int, Confirm] = {}
        self.acks: list[int] = []
        self.nacks: list[int] = []
        self.flush_scheduled = False
        self.closed = False

    @property
    def confirmed(self) -> int:
        """How many publishes were acked or nacked so far."""
        return self.seq - len(self.outstanding)

    def track(self) -> Confirm:
        """The confirm of the next publish on this channel."""
        self.seq += 1
        confirm = Confirm(self.seq, self._settled)
        self.outstanding[confirm.seq] = confirm
        return confirm

    def close(self) -> None:
        """The channel is gone: what is still outstanding is never confirmed."""
        self.closed = True
        self.outstanding.clear()

    def _settled(self, confirm: Confirm) -> None:
        if self.outstanding.pop(confirm.seq, None) is None:
            return
        (self.nacks if confirm.rejected else self.acks).append(confirm.seq)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.session.after_turn(self._send)

    def _send(self) -> None:
        """Acks, then nacks, coalesced as RabbitMQ's send_confirms_and_nacks does."""
        self.flush_scheduled = False
        if self.closed:
            return
        acks, nacks = self.acks, self.nacks
        self.acks, self.nacks = [], []
        if len(acks) == 1:
            self.session.write(codec.encode_ack(self.number, acks[0], False))
        elif acks:
            self._coalesce(acks, nacks, codec.encode_ack)
        if nacks:
            self._coalesce(nacks, acks, codec.encode_nack)

    def _coalesce(self, seqs: list[int], others: list[int],
                  encode: Callable[[int, int, bool], bytes]) -> None:
        """RabbitMQ's coalesce_and_send: the seqs below both the lowest still-unconfirmed seq
        and the lowest seq settled the other way go as one frame with multiple=true (the
        highest of them); the rest go one by one."""
        seqs = sorted(set(seqs))
        lowest = next(iter(self.outstanding), None)
        cutoff = seqs[-1] + 1 if lowest is None else lowest
        if others:
            cutoff = min(cutoff, min(others))
        below = [seq for seq in seqs if seq < cutoff]
        write = self.session.write
        if below:
            write(encode(self.number, below[-1], True))
        for seq in seqs[len(below) :]:
            write(encode(self.number, seq, False))
