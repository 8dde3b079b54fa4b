"""The fault suite for quorum queues: rounds of a nemesis against three real nodes in their own
network namespaces, with publishers (confirms) and consumers (acks) on every node, then a drain
and Jepsen's total-queue check (rounds.py's round of queue_rounds.py's kind, queue_checker.py):
nothing confirmed is lost, nothing never sent appears, duplicates are counted and reported.

- `test_a_quorum_queue_keeps_its_promises_under[<nemesis>]`: the short variant, in every CI
  run: LEVERET_FAULT_QUORUM_ROUNDS rounds (default 1) of each nemesis in CI_NEMESES (or of every
  nemesis with LEVERET_FAULT_QUORUM_ALL=1);
- `test_a_paused_quorum_leader_loses_no_confirmed_message`: publishing with confirms through
  one node and consuming through another while the leader is paused past its lease (SIGSTOP,
  then SIGCONT): every confirmed message delivered at least once, none lost, and each
  publisher's order kept in first deliveries; LEVERET_FAULT_PAUSE_ROUNDS rounds (default 1),
  LEVERET_FAULT_PAUSE_SLOW_ROUNDS (default 20) in the slow variant;
- `test_a_quorum_queue_delivers_only_what_a_majority_holds`: the leader cut from its peers
  must not give a consumer what it cannot commit;
- `test_a_quorum_queue_keeps_its_promises_over_a_hundred_rounds` (slow):
  LEVERET_FAULT_SLOW_ROUNDS rounds (default 100), each with a nemesis drawn from its seed:

      pytest -m slow tests/faults/test_quorum_faults.py -k hundred -s

- delayed messages (delayed_rounds.py's kind: a delayed exchange whose hidden log's leader the
  nemesis strikes, bound to a quorum queue; delayed_checker.py), on the same cluster:
  `test_delayed_messages_are_routed_once_when_their_log_leader_fails`, CI's one round of
  LEVERET_FAULT_DELAYED_NEMESIS (default kill-leader; LEVERET_FAULT_DELAYED_CI_ROUNDS rounds,
  default 1); slow: `..._under_every_nemesis[<nemesis>]` (LEVERET_FAULT_DELAYED_ROUNDS each,
  default 3) and `..._over_many_rounds` (LEVERET_FAULT_SLOW_ROUNDS, `-k many_rounds`), and
  `test_delayed_copies_a_deaf_router_could_not_hand_over_are_routed_again`, the regression
  test of a loss the rounds found (docs/DELAYED-MESSAGES.md, "Under the fault suite").

Every round prints its seed; LEVERET_FAULT_SEED replays one (test_stream_faults.py), and
LEVERET_FAULT_REPORT and LEVERET_FAULT_KEEP work as for streams.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import pika
import pika.exceptions
import pytest
from faults.cluster import AMQP_PORT, FaultCluster, wait_for
from faults.delayed_rounds import DELAYED, delayed_table
from faults.delayed_workload import DelayedWorkload, delayed_body
from faults.delayed_workload import subject as delayed_log_of
from faults.nemesis import NEMESES
from faults.queue_rounds import QUORUM, totals_table
from faults.queue_workload import QuorumWorkload
from faults.rounds import RoundResult, plan, run_rounds
from faults.workload import id_of, parameters

# CI's short variant: the faults that move a quorum queue's leader in the three ways a leader
# can go (killed, paused past its lease, cut from its peers and etcd), and the one that cuts a
# single direction; the rest run in the slow variant (or with LEVERET_FAULT_QUORUM_ALL=1)
CI_NEMESES = ["isolate-leader-etcd", "kill-leader", "one-way"]
ROUNDS = int(os.environ.get("LEVERET_FAULT_QUORUM_ROUNDS", "1"))
PAUSE_ROUNDS = int(os.environ.get("LEVERET_FAULT_PAUSE_ROUNDS", "1"))
SLOW_ROUNDS = int(os.environ.get("LEVERET_FAULT_SLOW_ROUNDS", "100"))
PAUSE_SLOW_ROUNDS = int(os.environ.get("LEVERET_FAULT_PAUSE_SLOW_ROUNDS", "20"))
SHORT_NEMESES = sorted(NEMESES) if os.environ.get("LEVERET_FAULT_QUORUM_ALL") else CI_NEMESES
# the delayed workload's CI round: kill -9 of the delayed log's leader (a failover and a node
# restarted with its log, every leader change a delayed log can see, in the shortest round)
DELAYED_CI_NEMESIS = os.environ.get("LEVERET_FAULT_DELAYED_NEMESIS", "kill-leader")
DELAYED_CI_ROUNDS = int(os.environ.get("LEVERET_FAULT_DELAYED_CI_ROUNDS", "1"))
DELAYED_ROUNDS = int(os.environ.get("LEVERET_FAULT_DELAYED_ROUNDS", "3"))


@pytest.fixture(scope="module", autouse=True)
def totals(round_results: list[RoundResult]) -> Iterator[None]:
    """At the end of the module: the total-queue counts per nemesis."""
    yield
    if round_results:
        print("\n" + totals_table(round_results))


@pytest.mark.parametrize("name", SHORT_NEMESES)
def test_a_quorum_queue_keeps_its_promises_under(
        fault_cluster: FaultCluster, round_results: list[RoundResult], name: str) -> None:
    test = test_a_quorum_queue_keeps_its_promises_under.__name__
    run_rounds(fault_cluster, plan(ROUNDS, name), f"LEVERET_FAULT_QUORUM_ALL=1 pytest "
               f"'{__file__}::{test}[{name}]' -s", round_results, QUORUM)


@pytest.fixture(scope="module")
def delayed_results() -> Iterator[list[RoundResult]]:
    """The delayed workload's rounds of the module; at the end, its counts per nemesis."""
    results: list[RoundResult] = []
    yield results
    if results:
        print("\n" + delayed_table(results))


# CI's delayed round: shorter delays (0.5-4 s, a fifth 4-6 s), so that the round waits less
# for the last ones to fall due; the target queue led by the log's leader, so that the nemesis
# strikes the router and a target it writes to itself (where a copy routed, recorded as
# routed, but not yet committed by the queue was lost with the node)
SHORT_DELAYED = replace(DELAYED, make_workload=partial(
    DelayedWorkload, delay_s=(0.5, 4.0), late_s=(4.0, 6.0), late_share=0.2, target_here=True))


def test_delayed_messages_are_routed_once_when_their_log_leader_fails(
        fault_cluster: FaultCluster, delayed_results: list[RoundResult]) -> None:
    """A delayed exchange's log led by the node the nemesis strikes (kill -9 in CI): every
    confirmed delayed message delivered, none twice fresh, none early, none later than the
    bound (faults/delayed_checker.py)."""
    test = test_delayed_messages_are_routed_once_when_their_log_leader_fails.__name__
    run_rounds(fault_cluster, plan(DELAYED_CI_ROUNDS, DELAYED_CI_NEMESIS),
               f"pytest '{__file__}::{test}' -s", delayed_results, SHORT_DELAYED)


@pytest.mark.slow  # about 20 s: CI runs one delayed test, the round above
def test_delayed_copies_a_deaf_router_could_not_hand_over_are_routed_again(
        fault_cluster: FaultCluster) -> None:
    """The delayed log's leader (the last node) stops hearing its peers (their packets to it
    dropped; its own still go out) just before many large messages fall due for a quorum queue
    led by the first node. Its copies stall in the link (no acks come back), its small ROUTED
    record does not: the link times out, the copies are refused and held again by a leader
    that can no longer commit anything, and a peer is elected. The new leader must route
    them: a held message is recorded as routed only once its targets hold it, in the same
    write as its new HELD record when it is held again. Before, the ROUTED record went out as
    the copies did, the new leader skipped them, and they were lost (the fault suite's one-way
    round, seed 2769654616)."""
    cluster = fault_cluster
    cluster.restore()
    queue = f"dfaults-deaf-{uuid.uuid4().hex[:8]}"
    endpoints = {name: (node.ns.ip, AMQP_PORT) for name, node in cluster.nodes.items()}
    workload = DelayedWorkload(endpoints, queue, target_here=False)
    router, target, other = cluster.names[-1], cluster.names[0], cluster.names[1]
    workload.declare(router)  # the log led by `router`, the target queue by the next node
    log = delayed_log_of(queue)
    assert workload.target_on == target
    wait_for(lambda: cluster.leader_of(log) == router, 10, f"{router} leads {log}")
    wait_for(lambda: cluster.leader_of(queue) == target, 10, f"{target} leads {queue}")
    ids = [f"deaf-{i}" for i in range(300)]
    conn = pika.BlockingConnection(parameters(*endpoints[other]))
    try:
        channel = conn.channel()
        channel.confirm_delivery()  # a nack raises
        sent = time.monotonic()
        for id_ in ids:
            channel.basic_publish(workload.exchange, queue, delayed_body(id_, 0) + BULK,
                                  pika.BasicProperties(delivery_mode=2,
                                                       headers={"x-delay": 3000}))
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            conn.close()
    time.sleep(max(0.0, sent + 2.7 - time.monotonic()))
    peers = [cluster.nodes[n].ns.ip for n in cluster.names if n != router]
    cluster.nodes[router].ns.cut(drop_in=peers)
    try:
        wait_for(lambda: cluster.leader_of(log) not in (None, router), 30,
                 f"no new leader of {log}")
    finally:
        cluster.net.heal_all()
    got: list[str | None] = []
    conn = pika.BlockingConnection(parameters(*endpoints[other]))
    try:
        take(conn, conn.channel(), queue, got, len(ids), 30)
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            conn.close()
        cluster.restore()
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        workload.delete(cluster.leader_of(queue) or other)
    missing = sorted(set(ids) - set(got))
    assert not missing and len(got) == len(ids), (
        f"{len(missing)} missing ({missing[:5]}...), {len(got) - len(set(got))} twice")


BULK = b"#" * 8192  # large copies: the router's link to the target stalls once acks stop


def take(conn: pika.BlockingConnection, channel: Any, queue: str, got: list[str | None],
         want: int, seconds: float) -> None:
    """Consume `queue` until `got` holds `want` ids (then a second more, for a copy routed
    twice) or `seconds` pass."""
    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        got.append(id_of(body))
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    pump(conn, lambda: len(got) >= want, seconds)
    pump(conn, lambda: False, 1)


# one publisher through one node and one consumer through another: the queue's order checked
ONE_PATH = replace(QUORUM, make_workload=partial(QuorumWorkload, single_path=True))


def test_a_paused_quorum_leader_loses_no_confirmed_message(
        fault_cluster: FaultCluster, round_results: list[RoundResult]) -> None:
    test = test_a_paused_quorum_leader_loses_no_confirmed_message.__name__
    run_rounds(fault_cluster, plan(PAUSE_ROUNDS, "pause-leader"), f"pytest '{__file__}::{test}' -s",
               round_results, ONE_PATH)


def test_a_quorum_queue_delivers_only_what_a_majority_holds(fault_cluster: FaultCluster) -> None:
    """The leader's packets to its peers dropped: a message published through it cannot be
    committed, so a consumer on the leader's node must not be given it (RabbitMQ's quorum
    queues deliver only what the Raft log has committed). A message published before the cut
    is given, which shows the consumer works."""
    cluster = fault_cluster
    cluster.restore()
    queue = f"qfaults-dirty-read-{uuid.uuid4().hex[:8]}"
    endpoints = {name: (node.ns.ip, AMQP_PORT) for name, node in cluster.nodes.items()}
    workload = QuorumWorkload(endpoints, queue)
    leader = cluster.names[0]
    workload.declare(leader)  # client-local: its leader
    wait_for(lambda: cluster.leader_of(queue) == leader, 10, f"{leader} leads {queue}")
    consumer = pika.BlockingConnection(parameters(*endpoints[leader]))
    publisher = pika.BlockingConnection(parameters(*endpoints[leader]))
    got: list[bytes] = []
    try:
        def take(channel: Any, method: Any, _props: Any, body: bytes) -> None:
            got.append(body)
            channel.basic_ack(method.delivery_tag)

        consumer.channel().basic_consume(queue, take)
        publisher.channel().basic_publish("", queue, b"committed")
        pump(consumer, lambda: bool(got), 10)
        assert got == [b"committed"]
        peers = [cluster.nodes[n].ns.ip for n in cluster.names if n != leader]
        cluster.nodes[leader].ns.cut(drop_out=peers)
        try:
            publisher.channel().basic_publish("", queue, b"uncommitted")
            pump(consumer, lambda: False, 2)
        finally:
            cluster.net.heal_all()
    finally:
        for conn in (consumer, publisher):
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()
        cluster.restore()
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            workload.delete(cluster.leader_of(queue) or leader)
    assert got == [b"committed"], (
        f"{leader}, cut from its peers, gave its consumer {got[1:]}, which no peer could hold")


def pump(conn: pika.BlockingConnection, done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


@pytest.mark.slow
def test_a_paused_quorum_leader_loses_no_confirmed_message_in_twenty_rounds(
        fault_cluster: FaultCluster, round_results: list[RoundResult]) -> None:
    run_rounds(fault_cluster, plan(PAUSE_SLOW_ROUNDS, "pause-leader"),
               "pytest -m slow tests/faults/test_quorum_faults.py -k twenty -s", round_results,
               ONE_PATH)


@pytest.mark.slow
def test_a_quorum_queue_keeps_its_promises_over_a_hundred_rounds(
        fault_cluster: FaultCluster, round_results: list[RoundResult]) -> None:
    run_rounds(fault_cluster, plan(SLOW_ROUNDS),
               "pytest -m slow tests/faults/test_quorum_faults.py -k hundred -s", round_results,
               QUORUM)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NEMESES))
def test_delayed_messages_are_routed_once_under_every_nemesis(
        fault_cluster: FaultCluster, delayed_results: list[RoundResult], name: str) -> None:
    test = test_delayed_messages_are_routed_once_under_every_nemesis.__name__
    run_rounds(fault_cluster, plan(DELAYED_ROUNDS, name),
               f"pytest -m slow '{__file__}::{test}[{name}]' -s", delayed_results, DELAYED)


@pytest.mark.slow
def test_delayed_messages_are_routed_once_over_many_rounds(
        fault_cluster: FaultCluster, delayed_results: list[RoundResult]) -> None:
    run_rounds(fault_cluster, plan(SLOW_ROUNDS),
               "pytest -m slow tests/faults/test_quorum_faults.py -k many_rounds -s",
               delayed_results, DELAYED)
