"""When a quorum queue's deliveries reach their connections' transports: a leader in a cluster
(its replication not local) writes the deliveries it sends on a commit in that commit's own
callback (`QuorumQueue._write_at_once`), so that a process stopped (SIGSTOP) after the stall
watch's look cannot write them on waking, after an election; one node's queue leaves them to
the end of the turn. A real log and quorum queue, a fake event loop, and a consumer's sink that
writes down what it was told; no sockets (the fault suite's pause-leader rounds show why, issue
28: docs/REPLICATION.md)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.manual_scheduler import ManualScheduler

from leveret.amqp.content import Message
from leveret.amqp.stored import decode_record, encode_record
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.message import QueuedMessage
from leveret.broker.model.quorum import QuorumQueue
from leveret.broker.model.replication import ONE_NODE, OneNode
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.vhost import VHost


class Leading(OneNode):
    """A cluster's leader, as its queue sees it: not local (the test moves the commit point,
    as a majority's acknowledgements would), three members, this node leading."""

    @property
    def local(self) -> bool:
        return False

    @property
    def role(self) -> str:
        return "leader"

    @property
    def members(self) -> tuple[str, ...]:
        return ("a", "b", "c")


class Sink:
    """A consumer's channel that writes down deliveries and flushes, in order."""

    def __init__(self) -> None:
        self.said: list[tuple[Any, ...]] = []

    def can_send(self, consumer: Consumer) -> bool:
        return True

    def send(self, consumer: Consumer, entry: QueuedMessage, queue: Any) -> None:
        self.said.append(("deliver", entry.message.body, entry.redelivered))

    def flush(self) -> None:
        self.said.append(("flush",))

    def server_cancel(self, consumer: Consumer) -> None:
        self.said.append(("cancel",))

    def credit(self, consumer: Consumer) -> int:
        return 1 << 30

    def send_records(self, consumer: Consumer, offsets: Sequence[int],
                     records: Sequence[bytes]) -> None:
        raise AssertionError("a quorum queue sends entries")


@pytest.fixture
def made() -> Iterator[list[QuorumQueue]]:
    queues: list[QuorumQueue] = []
    yield queues
    for queue in queues:
        queue.on_delete()


def consumed(made: list[QuorumQueue], tmp_path: Path, replication: OneNode
             ) -> tuple[QuorumQueue, ManualScheduler, Sink]:
    loop = ManualScheduler()
    queue = QuorumQueue(VHost("/", loop), "q", env=StorageEnv(tmp_path, encode_record,
                                                               decode_record),
                        replication=replication, durable=True,
                        arguments={"x-queue-type": "quorum"})
    made.append(queue)
    sink = Sink()
    queue.add_consumer(Consumer("ctag", queue, sink))
    queue.publish(Message.build("", "q", b"one"), None)
    loop.turn()  # written
    return queue, loop, sink


def test_a_leader_writes_what_a_commit_sends_in_the_commits_callback(
        made: list[QuorumQueue], tmp_path: Path) -> None:
    queue, loop, sink = consumed(made, tmp_path, Leading())
    queue.writer.committed_up_to(queue.log.next_offset - 1)  # the message: ready, delivered,
    assert sink.said == []                                     # its DELIVERED record to write
    loop.turn()
    assert sink.said == []  # written, not committed
    queue.writer.committed_up_to(queue.log.next_offset - 1)
    assert sink.said == [("deliver", b"one", False), ("flush",)]


def test_one_nodes_queue_leaves_its_deliveries_to_the_end_of_the_turn(
        made: list[QuorumQueue], tmp_path: Path) -> None:
    _queue, loop, sink = consumed(made, tmp_path, ONE_NODE)
    loop.turn()  # the DELIVERED record written: enough on one node
    assert sink.said == [("deliver", b"one", False)]
