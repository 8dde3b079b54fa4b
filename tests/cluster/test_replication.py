"""A stream's log replicated from its leader to two replicas over real node-to-node links on
loopback: the replicas end up with the leader's log, the commit point needs a majority, a replica
that comes back gets only the delta, a deposed leader's chunks are refused, and a replica's tail
that the new leader never had is cut."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from leveret.broker.cluster.link import (
    Handlers,
    Link,
    LinkConfig,
    LinkServer,
    RemoteError,
    connect,
)
from leveret.broker.cluster.replication import (
    Replicas,
    Shipper,
    agreement,
    committed_offset,
    stall_s,
    stall_watch,
)
from leveret.storage import Log, LogConfig, OffsetSpec

SECRET = b"replication-test-secret"
WAIT_S = 10.0


class Node:
    """One node: a link listener, the Replicas that answer leaders, and the links it dialed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.config = LinkConfig(cluster="r", node=name, secret=SECRET)
        self.handlers = Handlers()
        self.replicas = Replicas(self.handlers)
        self.server = LinkServer(self.config, self.handlers, self._accepted)
        self.links: dict[str, Link] = {}

    async def _accepted(self, link: Link) -> None:
        self.links[link.peer_node] = link

    async def dial(self, other: Node) -> Link:
        link = await connect("127.0.0.1", other.server.port, self.config, self.handlers)
        self.links[other.name] = link
        return link

    def lead(self, stream: str, log: Log, epoch: int, replicas: list[str],
             **options: Any) -> Shipper:
        """Ship `log` to `replicas` as the leader of `stream` in `epoch`, answering their acks."""
        shipper = Shipper(stream, log, epoch, replicas, self.links.get, **options)
        self.replicas.shippers[stream] = shipper
        shipper.start()
        return shipper

    async def stop(self) -> None:
        for link in self.links.values():
            await link.close()
        await self.server.close()


@pytest.fixture
async def start_node() -> AsyncIterator[Callable[[str], asyncio.Future[Node]]]:
    nodes: list[Node] = []

    async def start(name: str) -> Node:
        node = Node(name)
        await node.server.start()
        nodes.append(node)
        return node

    yield start  # type: ignore[misc]
    for node in nodes:
        await node.stop()


def open_log(path: Path) -> Log:
    return Log.open(path, LogConfig(max_segment_chunks=4))


def records(log: Log) -> list[tuple[int, bytes]]:
    reader = log.reader(OffsetSpec.first())
    found = [item for view in reader for item in view.items()]
    reader.close()
    return found


def segment_files(path: Path) -> dict[str, bytes]:
    """Every file of a log's folder (segments and indexes), by name."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}

async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not check():
            await asyncio.sleep(0.01)


def write_epochs(log: Log, epochs: list[int | str]) -> Log:
    """One single-record chunk per entry, stamped with that epoch; "tN" is a new leader's empty
    tracking chunk of epoch N (Log.mark_epoch), which takes no offset."""
    for i, epoch in enumerate(epochs):
        if isinstance(epoch, str):
            log.set_epoch(int(epoch.removeprefix("t")))
            log.mark_epoch()
            continue
        log.set_epoch(epoch)
        log.append([b"e%d-%d" % (epoch, i)])
    return log


@pytest.mark.parametrize(("leader", "replica", "agree"), [
    ([1, 1, 2, 2, 4], [1, 1, 3], 2),  # its epoch-3 chunk sits where the leader has epoch 2
    ([1, 1, 2, 2, 4], [1, 1, 2], 3),  # a prefix: all of it agrees
    ([1, 1, 2], [1, 1, 2, 2, 2], 3),  # longer in the same epoch: cut after the leader's end
    ([1, 2, 2], [1, 1, 1], 1),  # the deposed leader of 1 wrote on after the election
    ([3, 3], [1, 1], 0),  # nothing in common
    ([], [1], 0),
    ([1, 1], [], 0),
    # epochs of one empty tracking chunk (a leader that took an epoch and wrote nothing else):
    ([1, 1, "t2", "t3", 3, 3, "t4"], [1, 1, "t2", "t3", 3], 3),  # all of it the leader's
    ([1, 1, "t2", 2], [1, 1, "t2"], 2),
    (["t1", 1, "t3", 3], ["t1", 1, "t2", 2], 1),  # an epoch the leader never saw
    ([1, 1, "t3", 3], [1, 1, "t2"], 2),  # (its epoch-2 tracking chunk at 2 is cut)
])
def test_where_a_replicas_log_parts_from_the_leaders(
        tmp_path: Path, leader: list[int | str], replica: list[int | str], agree: int) -> None:
    leader_log = write_epochs(open_log(tmp_path / "l"), leader)
    replica_log = write_epochs(open_log(tmp_path / "r"), replica)
    ranges = replica_log.epoch_ranges()
    assert agreement(leader_log, ranges, replica_log.first_offset) == agree


def test_a_range_the_leaders_retention_removed_is_taken_as_agreed(tmp_path: Path) -> None:
    leader_log = write_epochs(open_log(tmp_path / "l"), [1] * 9 + [2, 2])
    leader_log.truncate_before(8)
    assert leader_log.first_offset > 0
    replica_log = write_epochs(open_log(tmp_path / "r"), [1] * 9 + [3])
    assert agreement(leader_log, replica_log.epoch_ranges(), 0) == 9


def test_the_commit_point_is_the_majority() -> None:
    assert committed_offset([10, 10, 10], 3) == 9
    assert committed_offset([10, 7, 3], 3) == 6
    assert committed_offset([10, 0, 0], 3) == -1
    assert committed_offset([10], 1) == 9
    assert committed_offset([10, 4], 2) == 3  # two members: both


async def test_replicas_get_the_log_and_commit_follows_the_majority(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    leader_node, b, c = await start_node("a"), await start_node("b"), await start_node("c")
    leader_log = open_log(tmp_path / "a")
    logs = {"b": open_log(tmp_path / "b"), "c": open_log(tmp_path / "c")}
    replica_commits: dict[str, list[int]] = {"b": [], "c": []}
    for node in (b, c):
        node.replicas.add("s1", logs[node.name], replica_commits[node.name].append)
    await leader_node.dial(b)
    await leader_node.dial(c)
    commits: list[int] = []
    shipper = leader_node.lead("s1", leader_log, 1, ["b", "c"], on_commit=commits.append,
                               chunk_bytes=200)
    for i in range(30):
        leader_log.append([b"m%d-%d" % (i, j) for j in range(3)], publishers={b"p": i})
        shipper.appended()
    await until(lambda: shipper.committed == 89)
    await until(lambda: all(log.next_offset == 90 for log in logs.values()))
    assert all(records(log) == records(leader_log) for log in logs.values())
    assert all(log.tail == (1, 90) and log.publisher_id(b"p") == 29 for log in logs.values())
    assert commits == sorted(commits) and commits[-1] == 89
    await until(lambda: all(r and r[-1] == 89 for r in replica_commits.values()))

    # c goes away: b and the leader are still a majority
    await c.stop()
    logs["c"].close()
    leader_log.append([b"while-c-is-away"])
    shipper.appended()
    await until(lambda: shipper.committed == 90)

    # b goes away too: the leader alone is no majority, nothing more commits
    await b.stop()
    leader_log.append([b"alone"])
    shipper.appended()
    await asyncio.sleep(0.3)
    assert shipper.committed == 90

    # c comes back with its log as it was: it is sent only what it lacks, and commits resume
    c2 = await start_node("c")
    logs["c"] = open_log(tmp_path / "c")
    c2.replicas.add("s1", logs["c"])
    await leader_node.dial(c2)
    await until(lambda: shipper.committed == 91)
    assert records(logs["c"]) == records(leader_log)
    await shipper.close()


async def test_a_deposed_leaders_chunks_are_refused(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    old, new, replica = await start_node("old"), await start_node("new"), await start_node("r")
    replica_log = open_log(tmp_path / "r")
    replica.replicas.add("s", replica_log)
    await new.dial(replica)
    await old.dial(replica)
    new_log, old_log = open_log(tmp_path / "new"), open_log(tmp_path / "old")
    new_shipper = new.lead("s", new_log, 2, ["r"])
    new_log.append([b"from-epoch-2"])
    new_shipper.appended()
    await until(lambda: replica_log.next_offset == 1)
    old_shipper = Shipper("s", old_log, 1, ["r"], old.links.get)
    old_shipper.start()
    old_log.append([b"stale-1"])
    old_log.append([b"stale-2"])
    old_shipper.appended()
    await asyncio.sleep(0.5)
    assert records(replica_log) == [(0, b"from-epoch-2")]
    assert old_shipper.committed == -1  # no majority ever acknowledged the old epoch
    await old_shipper.close()
    await new_shipper.close()


async def test_a_replicas_tail_the_new_leader_never_had_is_cut(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    leader, replica = await start_node("l"), await start_node("x")
    replica_log = open_log(tmp_path / "x")
    replica_log.set_epoch(1)  # it led epoch 1 and wrote more than anyone else got
    for i in range(5):
        replica_log.append([b"e1-%d" % i])
    leader_log = open_log(tmp_path / "l")
    leader_log.set_epoch(1)
    for i in range(3):
        leader_log.append([b"e1-%d" % i])
    replica.replicas.add("s", replica_log)
    await leader.dial(replica)
    shipper = Shipper("s", leader_log, 2, ["x"], leader.links.get)
    leader.replicas.shippers["s"] = shipper
    leader_log.append([b"e2-a", b"e2-b"])
    shipper.start()
    await until(lambda: shipper.committed == 4)
    assert records(replica_log) == records(leader_log)
    assert [r for _, r in records(replica_log)][3:] == [b"e2-a", b"e2-b"]
    assert replica_log.tail == (2, 5)
    await shipper.close()


async def test_a_sync_for_a_stream_the_node_does_not_hold_fails(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    leader, replica = await start_node("l"), await start_node("y")
    await leader.dial(replica)
    log = open_log(tmp_path / "l")
    shipper = Shipper("unknown", log, 1, ["y"], leader.links.get)
    shipper.start()
    log.append([b"a"])
    shipper.appended()
    await asyncio.sleep(0.5)
    assert shipper.committed == -1 and not shipper.replicas["y"].synced
    assert not leader.links["y"].closed  # a refused sync closes nothing
    await shipper.close()


async def test_a_replica_that_knows_its_leader_refuses_any_other_sync(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """A deposed leader that has not learnt of the new epoch yet (it syncs with the same or a
    newer one) is refused once the replica's record names another leader."""
    old, new, replica = await start_node("old"), await start_node("new"), await start_node("r")
    replica_log = open_log(tmp_path / "r")
    replica.replicas.add("s", replica_log, leader="new", epoch=1)
    await old.dial(replica)
    await new.dial(replica)
    old_log = open_log(tmp_path / "old")
    old_shipper = Shipper("s", old_log, 3, ["r"], old.links.get)  # even a newer epoch
    old_shipper.start()
    old_log.append([b"stale"])
    old_shipper.appended()
    await asyncio.sleep(0.5)
    assert replica_log.next_offset == 0 and old_shipper.committed == -1
    assert not old_shipper.replicas["r"].synced
    await old_shipper.close()
    new_log = open_log(tmp_path / "new")
    new_shipper = new.lead("s", new_log, 2, ["r"])
    new_log.append([b"fresh"])
    new_shipper.appended()
    await until(lambda: new_shipper.committed == 0)
    assert records(replica_log) == [(0, b"fresh")]
    await new_shipper.close()


async def test_a_resync_does_not_append_the_tracking_chunks_the_replica_ends_with_again(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """A tracking chunk takes no offset, so the leader ships it again from the replica's next
    offset; the replica recognises the ones it already ends with and the logs stay equal."""
    leader, replica = await start_node("l"), await start_node("z")
    replica_log = open_log(tmp_path / "z")
    replica.replicas.add("s", replica_log)
    await leader.dial(replica)
    leader_log = open_log(tmp_path / "l")
    leader_log.append([b"one"])
    leader_log.store_offsets({b"reader": 0})
    leader_log.store_offsets({b"other": 0})
    shipper = leader.lead("s", leader_log, 1, ["z"])

    await until(lambda: segment_files(tmp_path / "z") == segment_files(tmp_path / "l"))
    await shipper.close()
    again = leader.lead("s", leader_log, 1, ["z"])  # the link came back
    leader_log.append([b"two"])
    again.appended()
    await until(lambda: again.committed == 1)
    await until(lambda: segment_files(tmp_path / "z") == segment_files(tmp_path / "l"))
    assert records(replica_log) == [(0, b"one"), (1, b"two")]
    assert replica_log.consumer_offset(b"reader") == 0
    await again.close()


async def test_a_replica_that_refuses_a_chunk_is_synced_again_and_catches_up(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """b's log loses its tail under it (cut behind the replication's back): the next chunk
    does not follow, b refuses it and asks for a sync, and the leader ships it the rest."""
    leader_node, b = await start_node("a"), await start_node("b")
    leader_log, b_log = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    b.replicas.add("s1", b_log)
    await leader_node.dial(b)
    shipper = leader_node.lead("s1", leader_log, 1, ["b"])
    for i in range(5):
        leader_log.append([b"m%d" % i])
        shipper.appended()
    await until(lambda: b_log.next_offset == 5)
    b_log.truncate_from(3)
    leader_log.append([b"m5"])
    shipper.appended()
    await until(lambda: b_log.next_offset == 6)
    assert records(b_log) == records(leader_log)
    await shipper.close()



async def test_a_new_replica_after_the_leaders_retention_starts_at_its_first_chunk(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """The leader's retention removed offsets 0.. before the replica existed: the replica's
    empty log (next offset 0) cannot follow, so it starts at the leader's first offset and gets
    the leader's segments as they are, tracking snapshot first."""
    leader_node, b = await start_node("a"), await start_node("b")
    leader_log = open_log(tmp_path / "a")
    for i in range(20):
        leader_log.append([b"m%d" % i], publishers={b"pub": i})
    leader_log.store_offsets({b"reader": 3})
    leader_log.truncate_before(10)
    first = leader_log.first_offset
    assert first > 0
    b_log = open_log(tmp_path / "b")
    b.replicas.add("s2", b_log)
    await leader_node.dial(b)
    shipper = leader_node.lead("s2", leader_log, 1, ["b"])
    await until(lambda: shipper.committed == 19)
    await until(lambda: segment_files(tmp_path / "b") == segment_files(tmp_path / "a"))
    assert b_log.first_offset == first and records(b_log) == records(leader_log)
    assert (b_log.publisher_id(b"pub"), b_log.consumer_offset(b"reader")) == (19, 3)
    await shipper.close()


async def test_a_replica_that_lagged_past_the_leaders_retention_catches_up(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """b held offsets 0..4, then its link went away while the leader wrote on and retention
    removed what b lacks: when the link is back, b starts again at the leader's first offset
    (before the fix it refused every chunk and never caught up)."""
    leader_node, b = await start_node("a"), await start_node("b")
    leader_log, b_log = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    b.replicas.add("s3", b_log)
    link = await leader_node.dial(b)
    shipper = leader_node.lead("s3", leader_log, 1, ["b"])
    for i in range(5):
        leader_log.append([b"m%d" % i])
        shipper.appended()
    await until(lambda: b_log.next_offset == 5)
    await shipper.close()
    await link.close()
    for i in range(5, 30):
        leader_log.append([b"m%d" % i])
    leader_log.truncate_before(20)
    assert leader_log.first_offset > 5
    await leader_node.dial(b)
    again = leader_node.lead("s3", leader_log, 1, ["b"])
    await until(lambda: b_log.next_offset == 30)
    assert records(b_log) == records(leader_log)
    assert b_log.first_offset == leader_log.first_offset
    await again.close()


async def test_a_sync_start_that_is_not_a_later_offset_resets_nothing(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """`stream.sync`'s `start` restarts a replica only at an offset beyond its tail: a start
    that is not a non-negative integer, or not past what it holds, leaves its log as it is; an
    `agree` that is not a non-negative integer is refused and cuts nothing."""
    leader, b = await start_node("a"), await start_node("b")
    b_log = open_log(tmp_path / "b")
    for i in range(3):
        b_log.append([b"m%d" % i])
    b.replicas.add("s4", b_log)
    link = await leader.dial(b)

    async def sync(**second: Any) -> Any:
        hello = await link.call("stream.sync", {"stream": "s4", "epoch": 1})
        assert hello == {"ranges": [[0, b_log.next_offset]], "first_offset": b_log.first_offset}
        return await link.call("stream.sync", {"stream": "s4", "epoch": 1, **second})

    for start in ("9", None, True, 2, 3):
        answer = await sync(agree=3, start=start)
        assert answer == {"last_epoch": 0, "next_offset": 3}
    assert (b_log.first_offset, records(b_log)) == (0, [(0, b"m0"), (1, b"m1"), (2, b"m2")])
    answer = await sync(agree=3, start=7)
    assert answer == {"last_epoch": 0, "next_offset": 7} and b_log.first_offset == 7
    b_log.reset_to(0)
    b_log.append([b"m0"])
    for junk in (True, -5, "0", None):  # (True would pass for the integer 1)
        with pytest.raises(RemoteError, match="agree must be a non-negative integer"):
            await sync(agree=junk, start=junk)
        assert records(b_log) == [(0, b"m0")]


async def test_a_commit_before_the_sync_has_cut_the_tail_counts_nothing(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """Issue 26's loss: a deposed leader's log ends with a chunk the new leader never had; a
    commit point that reaches it between the two calls of the new leader's sync must not make
    that chunk committed (it was, before: the replica counted its own tail up to the announced
    commit point). After the second call the tail is cut and the commit point counts."""
    leader, deposed = await start_node("new"), await start_node("old")
    deposed_log = write_epochs(open_log(tmp_path / "old"), [1, 1])  # offset 1: never committed
    commits: list[int] = []
    deposed.replicas.add("s", deposed_log, commits.append)
    link = await leader.dial(deposed)
    leader_log = write_epochs(open_log(tmp_path / "new"), [1, 2, 2])
    hello = await link.call("stream.sync", {"stream": "s", "epoch": 2})
    assert hello == {"ranges": [[1, 2]], "first_offset": 0}
    link.post("stream.commit", {"stream": "s", "epoch": 2, "committed": 2})
    chunk_data, _ = leader_log.read_chunks(leader_log.ship_from(1), 1 << 20)
    await link.send_chunk("s", 2, chunk_data)  # and the chunks that follow: refused too
    answer = await link.call("stream.sync", {"stream": "s", "epoch": 2,
                                             "agree": agreement(leader_log, [(1, 2)], 0)})
    assert commits == [] and answer == {"last_epoch": 1, "next_offset": 1}
    assert records(deposed_log) == [(0, b"e1-0")]
    await link.send_chunk("s", 2, chunk_data)
    link.post("stream.commit", {"stream": "s", "epoch": 2, "committed": 2})
    await until(lambda: commits == [2])
    assert records(deposed_log) == records(leader_log)


async def test_a_replica_fenced_by_an_election_tells_its_leader_at_once(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """An election fences a replica at the next epoch; if the election then does not finish,
    the leader must learn of the fence without waiting for its next chunk (which may never
    come), so that it leads on in a newer epoch and the replica takes its commit point again."""
    leader, replica = await start_node("l"), await start_node("r")
    replica_log = open_log(tmp_path / "r")
    replica.replicas.add("s", replica_log)
    await leader.dial(replica)
    leader_log = write_epochs(open_log(tmp_path / "l"), [1])
    fences: list[int] = []
    shipper = leader.lead("s", leader_log, 1, ["r"], on_fenced=fences.append)
    shipper.appended()
    await until(lambda: replica_log.next_offset == 1)
    assert replica.replicas.fence("s", 2) == (1, 1)
    await until(lambda: fences == [2])
    assert replica_log.fence == 2
    await shipper.close()
    again = leader.lead("s", leader_log, 2, ["r"])  # the leader, in a newer epoch
    leader_log.append([b"next"])
    again.appended()
    await until(lambda: again.committed == 1)
    await again.close()


async def _leading(start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path,
                   streams: int, stall_s: float) -> tuple[Node, list[Shipper], list[str]]:
    """Node l leads `streams` streams, each with one replica on r, all synced; and the kinds
    of the requests r answers from then on."""
    leader, replica = await start_node("l"), await start_node("r")
    await leader.dial(replica)
    asked: list[str] = []
    for kind, handler in list(replica.handlers.requests.items()):
        async def spy(link: Link, body: Any, kind: str = kind, handler: Any = handler) -> Any:
            asked.append(kind)
            return await handler(link, body)
        replica.handlers.requests[kind] = spy
    shippers = []
    for i in range(streams):
        replica.replicas.add(f"s{i}", open_log(tmp_path / f"r{i}"))
        shipper = leader.lead(f"s{i}", open_log(tmp_path / f"l{i}"), 1, ["r"],
                              stall_s_=stall_s)
        shippers.append(shipper)
    await until(lambda: all(s.may_write() for s in shippers))
    asked.clear()
    return leader, shippers, asked


async def test_a_lagging_loop_holds_no_leader_and_a_stall_holds_each_for_one_call_per_link(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """One stall watch for the node: a loop that lags less than its threshold (a loaded node)
    makes no leader sync its replicas again (with 1,000 queues that was a storm of syncs that
    made the loop lag more); a stall past it holds every leader's writes until one call over
    the link confirms the replicas (not two sync calls per replica of every leader)."""
    _leader, shippers, asked = await _leading(start_node, tmp_path, 20, stall_s=0.8)
    watch = stall_watch()
    assert watch.stalls == 0 and watch.stall_s == 0.8
    for _ in range(3):
        time.sleep(0.5)  # the loop lags 0.5 s, three times
        assert all(s.may_write() for s in shippers)
        await asyncio.sleep(0.05)
    assert watch.stalls == 0
    time.sleep(1.0)  # a stall past the threshold
    assert not any(s.may_write() for s in shippers)  # every leader waits for the answer
    assert watch.stalls == 1
    await until(lambda: all(s.may_write() for s in shippers))
    assert watch.stalls == 1 and asked == ["stream.alive"]
    for shipper in shippers:
        await shipper.close()


async def test_a_leader_deposed_while_its_loop_stalled_writes_nothing_on_its_old_belief(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """The leader's loop stalls past the threshold (as a SIGSTOP past the lease) and an
    election fences its replica meanwhile; the fence's message has not been read yet when the
    loop resumes. Its first may_write must say no (its link still looks open and its replica
    synced: without the stall watch it would write in an epoch that is over); its resync is
    answered with the fence."""
    leader, replica = await start_node("l"), await start_node("r")
    await leader.dial(replica)
    replica.replicas.add("s", open_log(tmp_path / "r"))
    fences: list[int] = []
    shipper = leader.lead("s", open_log(tmp_path / "l"), 1, ["r"], on_fenced=fences.append,
                          stall_s_=0.5)
    await until(shipper.may_write)
    time.sleep(0.8)  # stalled; the election happens meanwhile:
    assert replica.replicas.fence("s", 2) is not None
    assert not shipper.may_write()
    await until(lambda: fences == [2])
    [state] = shipper.replicas.values()
    await until(lambda: not state.confirming)  # the link answered, after the fenced ack
    assert not state.synced and not shipper.may_write()
    await shipper.close()


def test_the_stall_threshold_is_what_the_peers_failure_detection_allows() -> None:
    assert stall_s(0.5, 2.0) == 1.5  # the defaults: a peer drops a link silent for 2 s
    assert stall_s(0.1, 0.3) == 0.5  # never under two ticks of the watch


async def test_an_acknowledgement_read_just_before_a_stall_commits_nothing_on_its_old_belief(
        start_node: Callable[[str], asyncio.Future[Node]], tmp_path: Path) -> None:
    """The leader's loop stalls past the threshold just after it read a replica's
    acknowledgement, before counting it (a SIGSTOP at that instant: a pause-leader fault round
    caught it, issue 28), and an election fences the replica meanwhile. Counted at once, the
    acknowledgement commits the chunk in an epoch that is over: a quorum queue's deposed leader
    then sends the deliveries that chunk records, which the new leader has already returned and
    redelivered, so its consumer gets them unflagged after their redelivery. The leader must
    notice the stall before it counts: nothing is committed, and the link's answer, after the
    fenced acknowledgement, leaves the replica unsynced."""
    leader, replica = await start_node("l"), await start_node("r")
    await leader.dial(replica)
    replica.replicas.add("s", open_log(tmp_path / "r"))
    commits: list[int] = []
    fences: list[int] = []
    leader_log = open_log(tmp_path / "l")
    shipper = leader.lead("s", leader_log, 1, ["r"], on_commit=commits.append,
                          on_fenced=fences.append, stall_s_=0.5)
    await until(shipper.may_write)
    counted = leader.handlers.messages["stream.ack"]
    stalled: list[Any] = []

    async def stall_then_count(link: Link, body: Any) -> None:
        if not stalled and body.get("next_offset") == 1:
            stalled.append(body)
            time.sleep(0.8)  # stalled, the acknowledgement read; the election meanwhile:
            assert replica.replicas.fence("s", 2) is not None
        await counted(link, body)

    leader.handlers.messages["stream.ack"] = stall_then_count
    leader_log.append([b"a delivery's record"])
    shipper.appended()
    await until(lambda: bool(stalled))
    [state] = shipper.replicas.values()
    await until(lambda: fences == [2] and not state.confirming)
    assert commits == [], "an acknowledgement read before the stall committed after it"
    assert not state.synced and shipper.committed == -1
    await shipper.close()
