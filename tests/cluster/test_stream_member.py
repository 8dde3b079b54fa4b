"""A cluster node's member of a stream (broker/cluster/stream_member.py), without etcd or
sockets: unattached it answers as one node does; as the leader its stream's confirms and readers
wait for the replication's commit point, and its appends ship in contact with a quorum only; as
a replica its publishes, offsets and single-active-consumer members go to the leader. The
replication that drives it (StreamReplication, StreamSac) is faked here by what it is asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.manual_scheduler import ManualScheduler

from leveret.amqp.stored import (
    decode_record,
    encode_record,
    stream_entries_as_records,
    stream_entry,
)
from leveret.broker.cluster.stream_member import StreamMember, member_of
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.message import Confirm
from leveret.broker.model.replication import ONE_NODE
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.stream import StreamQueue
from leveret.broker.model.vhost import VHost


class Wiring:
    """StreamReplication, as an attached member asks it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[bytes, int]]] = []
        self.restarts: list[tuple[StreamQueue, str]] = []

    def restarted(self, queue: StreamQueue, key: str) -> None:
        self.restarts.append((queue, key))

    def member_rows(self, queue: StreamQueue, key: str,
                    local: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(local, role="leader"), {"role": "replica", "node": "b"}]

    def send_offsets(self, key: str, leader: str, offsets: dict[bytes, int]) -> None:
        self.sent.append((key, leader, offsets))


class Groups:
    """StreamSac, as a replica's member hands it its single-active-consumer members."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def join(self, queue: StreamQueue, consumer: Consumer) -> bool:
        self.calls.append(("join", consumer.tag))
        return True

    def leave(self, queue: StreamQueue, consumer: Consumer) -> None:
        self.calls.append(("leave", consumer.tag))

    def stepped_down(self, queue: StreamQueue, consumer: Consumer) -> None:
        self.calls.append(("stepped_down", consumer.tag))


class Shipper:
    def __init__(self) -> None:
        self.contact = True
        self.shipped = 0

    def may_write(self) -> bool:
        return self.contact

    def appended(self) -> None:
        self.shipped += 1


class Leader:
    """The leader's queue, as a replica forwards publishes to it."""

    def __init__(self) -> None:
        self.node = "a"
        self.published: list[Any] = []

    def publish(self, message: Any, confirm: Confirm | None) -> bool:
        self.published.append(message)
        return True


class Sink:
    def credit(self, consumer: Consumer) -> int:
        return 0

    def send_records(self, consumer: Consumer, offsets: Any, records: Any) -> None:
        raise AssertionError("no credit was given")

    def server_cancel(self, consumer: Consumer) -> None:
        pass


class Setup:
    def __init__(self, directory: Path) -> None:
        self.loop = ManualScheduler()
        self.member = StreamMember()
        env = StorageEnv(directory, encode_record, decode_record, "never",
                         stream_entries_as_records)
        self.stream = StreamQueue(VHost("/", self.loop), "s", env=env,
                                  arguments={"x-queue-type": "stream"},
                                  replication=self.member)
        self.wiring = Wiring()
        self.settled: list[tuple[int, bool]] = []

    def publish(self, seq: int) -> Confirm:
        confirm = Confirm(seq, lambda c: self.settled.append((c.seq, not c.rejected)))
        self.stream.publish_record(stream_entry(b"m%d" % seq), None, None, 0, confirm)
        confirm.seal()
        return confirm


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    made = Setup(tmp_path)
    yield made
    made.stream.close()


def test_unattached_it_answers_as_one_node(setup: Setup) -> None:
    member = setup.member
    assert member_of(setup.stream) is member
    assert member.local and member.may_append()
    assert (member.role, member.members, member.commit_bound, member.forward_to) == (
        ONE_NODE.role, ONE_NODE.members, ONE_NODE.commit_bound, ONE_NODE.forward_to)
    assert not member.store_at_leader({b"ref": 1})
    assert member.member_rows({"role": "writer"}) == [{"role": "writer"}]
    consumer = Consumer("g", setup.stream, Sink(), arguments={"x-single-active-consumer": True})
    assert not member.join_group(consumer)
    member.restarted()
    setup.publish(1)
    setup.loop.turn()
    assert setup.settled == [(1, True)] and setup.stream.message_count == 1


def test_a_one_node_stream_has_no_member() -> None:
    assert member_of(object()) is None


def test_the_leader_confirms_and_reads_at_the_replications_commit_point(setup: Setup) -> None:
    member, stream = setup.member, setup.stream
    member.attach(stream, "key", setup.wiring, ("a", "b", "c"))
    member.lead()
    stream.writer.committed_up_to(-1)
    assert (stream.role, stream.members, stream.commit_bound) == ("leader", ("a", "b", "c"), -1)
    assert not member.local
    shipper = Shipper()
    member.ship(shipper)
    setup.publish(1)
    setup.loop.turn()
    assert shipper.shipped == 1 and setup.settled == [] and stream.message_count == 0
    member.committed(0)
    stream.writer.committed_up_to(0)
    assert setup.settled == [(1, True)] and stream.message_count == 1
    shipper.contact = False  # out of contact with a quorum: the batch waits
    setup.publish(2)
    setup.loop.turn()
    assert stream.writer.waiting and shipper.shipped == 1
    shipper.contact = True
    stream.writer.resume()
    setup.loop.turn()
    assert shipper.shipped == 2 and setup.settled == [(1, True)]
    member.ship(None)  # fenced, or no longer leading: nothing ships
    assert member.may_append()
    assert member.member_rows({"role": "writer"})[1] == {"role": "replica", "node": "b"}
    member.restarted()
    assert setup.wiring.restarts == [(stream, "key")]


def test_a_replica_forwards_publishes_and_offsets_and_its_groups_are_the_leaders(
        setup: Setup) -> None:
    member, stream = setup.member, setup.stream
    member.attach(stream, "key", setup.wiring, ("a", "b"))
    leader = Leader()
    member.replicate("a", leader)
    assert (stream.role, stream.commit_bound, stream.forward_to) == ("replica", -1, leader)
    confirm = setup.publish(1)  # a stream-protocol publish to a replica is nack'ed
    assert confirm.rejected and leader.published == []
    setup.loop.turn()
    assert stream.log.next_offset == 0  # a replica writes nothing itself
    assert member.store_at_leader({b"ref": 4})
    assert setup.wiring.sent == [("key", "a", {b"ref": 4})]
    member.committed(7)
    assert stream.commit_bound == 7
    groups = Groups()
    member.use_groups(groups)
    consumer = Consumer("g", stream, Sink(), arguments={"x-single-active-consumer": True})
    stream.add_consumer(consumer)
    stream.remove_consumer(consumer)
    assert groups.calls == [("join", "g"), ("leave", "g")] and "g" not in stream.groups.groups
    member.use_groups(None)
    member.detach()
    assert (stream.role, stream.forward_to, stream.commit_bound) == ("", None, 7)
    assert not member.store_at_leader({b"ref": 5})
    member.keep_bound(3)
    assert stream.commit_bound == 7
