"""One node's replication (model/replication.py), on its own and as a stream queue made without
one uses it: local, committed at fsync, offsets in its own log, every group its own, one member
in stream_status. A real log and stream queue, a fake event loop, no sockets."""

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
from leveret.broker.management import streamops
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.message import Confirm
from leveret.broker.model.replication import ONE_NODE, OneNode, Replication
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.stream import StreamQueue
from leveret.broker.model.vhost import VHost
from leveret.broker.streamproto import tracking


class Sink:
    """A consumer's channel that gives no credit: a member is attached, never delivered to."""

    def credit(self, consumer: Consumer) -> int:
        return 0

    def send_records(self, consumer: Consumer, offsets: Any, records: Any) -> None:
        raise AssertionError("no credit was given")

    def server_cancel(self, consumer: Consumer) -> None:
        pass


class Setup:
    def __init__(self, directory: Path, fsync: str | int) -> None:
        self.loop = ManualScheduler()
        self.vhost = VHost("/", self.loop)
        env = StorageEnv(directory, encode_record, decode_record, fsync,
                         stream_entries_as_records)
        self.stream = StreamQueue(self.vhost, "s", env=env,
                                  arguments={"x-queue-type": "stream"})
        self.settled: list[tuple[int, bool]] = []

    def publish(self, seq: int) -> None:
        confirm = Confirm(seq, lambda c: self.settled.append((c.seq, not c.rejected)))
        self.stream.publish_record(stream_entry(b"m%d" % seq), None, None, 0, confirm)
        confirm.seal()


@pytest.fixture
def setups(tmp_path: Path) -> Iterator[list[Setup]]:
    made: list[Setup] = []
    yield made
    for setup in made:
        setup.stream.close()


def make(setups: list[Setup], tmp_path: Path, fsync: str | int = "never") -> Setup:
    setups.append(Setup(tmp_path / str(len(setups)), fsync))
    return setups[-1]


def test_one_node_is_local_may_always_append_and_keeps_everything_here() -> None:
    replication: Replication = ONE_NODE
    assert isinstance(replication, OneNode)
    assert replication.local and replication.may_append()
    replication.appended()  # nothing to ship
    assert (replication.role, replication.members) == ("", ())
    assert replication.commit_bound is None and replication.forward_to is None
    assert not replication.store_at_leader({b"ref": 3})
    row = {"role": "writer", "node": "n"}
    assert replication.member_rows(row) == [row]
    consumer = Consumer("tag", None, Sink(), arguments={"x-single-active-consumer": True})
    assert not replication.join_group(consumer)
    replication.leave_group(consumer)
    replication.stepped_down(consumer)
    replication.restarted()


def test_a_stream_made_without_a_replication_is_one_nodes(
        setups: list[Setup], tmp_path: Path) -> None:
    s = make(setups, tmp_path)
    assert s.stream.replication is ONE_NODE
    assert (s.stream.role, s.stream.members) == ("", ())
    assert s.stream.commit_bound is None and s.stream.forward_to is None


def test_one_nodes_stream_confirms_and_counts_at_the_fsync(
        setups: list[Setup], tmp_path: Path) -> None:
    """Committed at fsync: under fsync every 100 ms, a publish is confirmed and counted once
    the timer's fsync has covered it, not at its write."""
    s = make(setups, tmp_path, fsync=100)
    s.publish(1)
    s.loop.turn()
    assert s.settled == [] and s.stream.message_count == 0
    s.loop.fire()
    assert s.settled == [(1, True)] and s.stream.message_count == 1
    s.publish(2)
    s.loop.turn()
    s.loop.fire()
    assert s.settled == [(1, True), (2, True)] and s.stream.message_count == 2


def test_one_nodes_stream_confirms_at_the_write_with_no_fsync(
        setups: list[Setup], tmp_path: Path) -> None:
    s = make(setups, tmp_path)
    s.publish(1)
    s.publish(2)
    assert s.settled == []
    s.loop.turn()
    assert s.settled == [(1, True), (2, True)] and s.stream.message_count == 2


def test_one_nodes_stream_stores_offsets_in_its_own_log(
        setups: list[Setup], tmp_path: Path) -> None:
    s = make(setups, tmp_path)
    s.publish(1)
    s.loop.turn()
    tracking.store_local(s.stream, {b"ref": 0})
    assert s.stream.stored_offset(b"ref") == 0


def test_one_nodes_stream_status_has_one_member_the_writer(
        setups: list[Setup], tmp_path: Path) -> None:
    s = make(setups, tmp_path)
    members = streamops.status(s.stream, "n")["members"]
    assert [(row["role"], row["node"]) for row in members] == [("writer", "n")]


def test_one_nodes_single_active_consumer_groups_are_the_streams_own(
        setups: list[Setup], tmp_path: Path) -> None:
    s = make(setups, tmp_path)
    first, second = (Consumer("g", s.stream, Sink(), arguments={
        "x-single-active-consumer": True}) for _ in range(2))
    s.stream.add_consumer(first)
    s.stream.add_consumer(second)
    assert s.stream.groups.groups["g"] == [first, second]
    assert s.stream.groups.active("g") is first
    s.stream.remove_consumer(first)
    assert s.stream.groups.active("g") is second
