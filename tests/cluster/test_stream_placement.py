"""A new replicated stream's members and first leader (broker/cluster/stream_placement.py), and
the `queue_leader_locator` setting: the rules alone, on plain records; the cluster tests in
test_replicated_streams.py declare through real nodes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.cluster import one_line

from leveret.broker.cluster.stream_placement import cluster_size, place_stream
from leveret.broker.cluster.topology_records import QueueRecord
from leveret.broker.process.config import load

RUNNING = ["a", "b", "c"]


def stream(name: str, leader: str, *members: str) -> QueueRecord:
    return QueueRecord("/", name, "stream", durable=True, node=leader,
                       members=(leader, *members) if members else ())


def test_size_defaults_to_every_running_node_and_is_capped() -> None:
    assert cluster_size(None, 3) == 3
    assert cluster_size(2, 3) == 2
    assert cluster_size(9, 3) == 3
    assert cluster_size(1, 3) == 1
    assert place_stream("b", RUNNING, [], None, "client-local") == ("b", ("b", "a", "c"))
    assert place_stream("b", RUNNING, [], 2, "client-local") == ("b", ("b", "a"))
    assert place_stream("c", RUNNING, [], 1, "client-local") == ("c", ("c",))
    assert place_stream("a", ["a"], [], 3, "client-local") == ("a", ("a",))


def test_balanced_leader_is_the_node_leading_fewest_streams() -> None:
    records = [stream("s1", "a", "b", "c"), stream("s2", "b", "a", "c"),
               QueueRecord("/", "classic", "classic", node="c"),  # not a stream: not counted
               stream("s3", "a")]
    leader, members = place_stream("a", RUNNING, records, None, "balanced")
    assert leader == "c" and members[0] == "c" and sorted(members) == RUNNING
    for legacy in ("least-leaders", "random", "min-masters"):
        assert place_stream("a", RUNNING, records, None, legacy)[0] == "c"
    assert place_stream("a", RUNNING, records, None, "client-local")[0] == "a"


def test_other_members_are_the_nodes_holding_fewest_streams() -> None:
    records = [stream("s1", "a", "b"), stream("s2", "a", "b")]
    assert place_stream("a", RUNNING, records, 2, "client-local") == ("a", ("a", "c"))
    assert place_stream("b", [*RUNNING, "d"], records, 3, "client-local") == (
        "b", ("b", "c", "d"))


def test_queue_leader_locator_setting(tmp_path: Path) -> None:
    assert load(env={}).queue_leader_locator == "client-local"
    assert load(env={"LEVERET_QUEUE_LEADER_LOCATOR": "balanced"}).queue_leader_locator == \
        "balanced"
    result = subprocess.run(
        [sys.executable, "-m", "leveret.cli", "serve", "--data-dir", str(tmp_path / "d"),
         "--port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "LEVERET_QUEUE_LEADER_LOCATOR": "nearest"})
    assert one_line(result) == ("error: invalid value 'nearest' for setting "
                                "'queue_leader_locator': client-local or balanced")
