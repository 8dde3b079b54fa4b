"""The fault suite for replicated streams: rounds of a nemesis against three real nodes in their
own network namespaces, with publishers and consumers on every node, then the checker.

The short variant runs LEVERET_FAULT_ROUNDS rounds (default 1) of each nemesis in CI_NEMESES in
every CI run (of every nemesis with LEVERET_FAULT_STREAM_ALL=1);
the slow one (`pytest -m slow tests/faults`) runs LEVERET_FAULT_SLOW_ROUNDS rounds (default
100), each with a nemesis drawn from its seed. Every round prints its seed; to replay one, set
LEVERET_FAULT_SEED (one round with that seed, in each selected test), for instance:

    LEVERET_FAULT_SEED=123 pytest tests/faults -k 'pause_leader' -s

Set LEVERET_FAULT_REPORT to a file to get one JSON line per round (stats, failover times), and
LEVERET_FAULT_KEEP to a folder to get a copy of each failed round's member folders and node logs.
LEVERET_FAULT_NODE_PYTHONPATH runs the nodes on another tree's code (faults/cluster.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from faults.cluster import AMQP_PORT, LINK_PORT, FaultCluster
from faults.nemesis import NEMESES
from faults.net import Namespace
from faults.rounds import RoundResult, plan, run_rounds

SHORT_ROUNDS = int(os.environ.get("LEVERET_FAULT_ROUNDS", "1"))
# CI's short variant: the leader killed, paused past its lease, cut from its peers and etcd, and
# a majority/minority split; the bridge (it deposes nobody), the leader cut from its peers only
# and the one-way cut (both run for quorum queues in CI) run in the slow variant, or with
# LEVERET_FAULT_STREAM_ALL=1
CI_NEMESES = ["isolate-leader-etcd", "kill-leader", "pause-leader", "split"]
SHORT_NEMESES = sorted(NEMESES) if os.environ.get("LEVERET_FAULT_STREAM_ALL") else CI_NEMESES
SLOW_ROUNDS = int(os.environ.get("LEVERET_FAULT_SLOW_ROUNDS", "100"))


def reaches(ns: Namespace | None, ip: str, port: int) -> bool:
    """Whether a TCP connect from namespace `ns` (None: the root one, as a client) to ip:port
    succeeds within a second."""
    probe = f"import socket; socket.create_connection(({ip!r}, {port}), timeout=1).close()"
    prefix = ns.exec_prefix() if ns else []
    return subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True,
                          timeout=30, check=False).returncode == 0


def test_a_cut_drops_the_named_addresses_and_nothing_else(fault_cluster: FaultCluster) -> None:
    """The harness itself: n1 cut from n2 and etcd cannot reach them nor be reached by n2,
    while n3 and the clients still reach n1; healed, everything is reachable again."""
    n1, n2, n3 = (fault_cluster.nodes[n] for n in ("n1", "n2", "n3"))
    etcd = (fault_cluster.net.etcd_ip, fault_cluster.etcd.client_port)
    n1.ns.cut(drop_in=[n2.ns.ip, etcd[0]], drop_out=[n2.ns.ip, etcd[0]])
    try:
        assert not reaches(n2.ns, n1.ns.ip, LINK_PORT)
        assert not reaches(n1.ns, n2.ns.ip, LINK_PORT)
        assert not reaches(n1.ns, *etcd)
        assert reaches(n3.ns, n1.ns.ip, LINK_PORT)
        assert reaches(None, n1.ns.ip, AMQP_PORT)
        assert reaches(n2.ns, *etcd)
    finally:
        fault_cluster.net.heal_all()
    assert reaches(n2.ns, n1.ns.ip, LINK_PORT) and reaches(n1.ns, *etcd)
    fault_cluster.wait_healthy(60)


@pytest.mark.parametrize("name", SHORT_NEMESES)
def test_a_replicated_stream_keeps_its_promises_under(
        fault_cluster: FaultCluster, round_results: list[RoundResult], name: str) -> None:
    test = test_a_replicated_stream_keeps_its_promises_under.__name__
    run_rounds(fault_cluster, plan(SHORT_ROUNDS, name),
               f"LEVERET_FAULT_STREAM_ALL=1 pytest '{__file__}::{test}[{name}]' -s", round_results)


@pytest.mark.slow
def test_a_replicated_stream_keeps_its_promises_over_a_hundred_rounds(
        fault_cluster: FaultCluster, round_results: list[RoundResult]) -> None:
    run_rounds(fault_cluster, plan(SLOW_ROUNDS), "pytest -m slow tests/faults -k hundred -s",
               round_results)
