"""celery 5.5 on a three-node cluster with quorum queues (issue 28's celery point): a real celery
app with `task_default_queue_type = "quorum"`, publisher confirms and late acks, and a real
worker (`celery worker --pool=solo`, a subprocess) connected to a node that is not the queue's
leader. The leader's node is killed with `kill -9` mid-run: every task of the run completes.

What a RabbitMQ user of celery 5.5 sets, unchanged: a failover list of broker URLs (kombu tries
them in turn), `broker_transport_options = {"confirm_publish": True}` and
`task_acks_late = True`. celery 5.5 itself, seeing a quorum queue, turns global QoS off and
declares its native delayed-delivery topology (28 quorum queues `celery_delayed_N` with
`x-overflow: reject-publish` and `x-dead-letter-strategy: at-least-once`, and
exchange-to-exchange bindings) through every URL of the list, at each (re)connection.

The result backend is celery's file-system backend (`file://`): it needs no server and no extra
package, and it survives the broker's failover. `rpc://` would carry each result back as a
message to a reply queue of the publisher's connection, a classic queue on one node that dies
with the leader's node in this test: a lost result would not mean a lost task. (SQLAlchemy,
for `db+sqlite://`, is not a dependency of the project.)

Delivery is at least once: a task whose late ack died with the leader runs again. Each run of
a task appends its number to a file; every number must be there at least once, and the
duplicates are counted in the assertion messages.

The same flows against RabbitMQ 3.10.8's three-node cluster (tests/support/reference_cluster.py,
run by hand: they are not part of this module): every task ran, none twice, the worker kept its
consumer across the failover; a publisher on a surviving node had its 20 tasks confirmed within
0.3 s of the kill; Leveret the same (the publishes wait for the new leader).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cluster import ClusterNode, api_get, connect, in_etcd, leader_of, wait_until
from support.etcd import EtcdServer

celery = pytest.importorskip("celery", minversion="5.5")
from kombu.exceptions import OperationalError  # noqa: E402 - kombu comes with celery

Three = tuple[ClusterNode, ClusterNode, ClusterNode]
BEFORE = 150  # published through the leader before its node dies
AFTER = 50  # published after, through the failover list
KILL_AT = 30  # task runs recorded when the leader's node is killed
TASK_S = 0.04  # one task's work: the run outlasts the kill by several seconds
PREFETCH = 4  # the worker's: --concurrency 1 times celery's default prefetch multiplier, 4

APP = '''
import os
import time

from celery import Celery

app = Celery("qcelery_app")
app.conf.update(
    broker_url=os.environ["QCELERY_BROKER"],
    result_backend="file://" + os.environ["QCELERY_RESULTS"],
    task_default_queue_type="quorum",
    broker_transport_options={"confirm_publish": True},
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
)


@app.task(name="qcelery.record")
def record(number):
    time.sleep(float(os.environ["QCELERY_TASK_S"]))
    with open(os.environ["QCELERY_DONE"], "a") as done:
        done.write(f"{number}\\n")
    return number
'''

# What these tests found in Leveret, each reproduced with pika against Leveret and RabbitMQ
# 3.10.8 and fixed since (each fix has its own test too):
# 1. a multiple ack through the tunnel named a tag already acked alone (406, basic.cancel, ack
#    lost; celery acks out of order): tests/cluster/test_forwarding.py,
#    test_acks_out_of_order_on_b_settle_each_delivery_once;
# 2. a publish through a surviving member was nack'ed until the new leader was elected
#    (RabbitMQ holds it; kombu gave up with OperationalError): it now waits for the leader;
# 3. consumers on surviving members were cancelled at the failover: they are kept
#    (test_quorum_cluster.py, test_consumers_on_other_nodes_keep_their_subscriptions_...);
# 4. basic.consume through a surviving member answered 404 before the new leader was elected
#    (celery stops consuming on it): it is taken and subscribed once the leader is known.


def broker_url(nodes: list[ClusterNode]) -> str:
    """celery's failover list: the URLs in order, separated by `;`."""
    return ";".join(f"amqp://guest:guest@127.0.0.1:{node.port}//" for node in nodes)


@pytest.fixture
def publisher_app(tmp_path: Path) -> Iterator[Any]:
    """celery apps that publish (results in tmp_path/results), closed at the end."""
    (tmp_path / "results").mkdir()
    apps: list[Any] = []

    def make(nodes: list[ClusterNode]) -> Any:
        app = celery.Celery(f"qcelery_publisher{len(apps)}")
        app.conf.update(
            broker_url=broker_url(nodes),
            result_backend=f"file://{tmp_path / 'results'}",
            task_default_queue_type="quorum",
            broker_transport_options={"confirm_publish": True},
            task_acks_late=True,
        )
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


def runs(path: Path) -> Counter[int]:
    """How many times each task number ran."""
    if not path.exists():
        return Counter()
    return Counter(int(line) for line in path.read_text().split())


def consumers_of(node: ClusterNode, queue: str) -> list[dict[str, Any]]:
    """The consumers of `queue` that `node`'s management API lists."""
    return [c for c in api_get(node, "/api/consumers") if c["queue"]["name"] == queue]


def ready(node: ClusterNode, queue: str) -> int:
    conn = connect(node)
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


@pytest.fixture
def worker_env(tmp_path: Path, publisher_app: Any) -> dict[str, str]:
    """The worker's environment: the app module in tmp_path, the results folder (made by
    publisher_app) and the file of runs beside it."""
    (tmp_path / "qcelery_app.py").write_text(APP)
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                        os.environ.get("PYTHONPATH")])),
            "QCELERY_RESULTS": str(tmp_path / "results"),
            "QCELERY_DONE": str(tmp_path / "done.txt"),
            "QCELERY_TASK_S": str(TASK_S)}


class Worker:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def alive(self) -> None:
        """Still running and consuming: celery stops consuming for good, without exiting,
        after an 'Unrecoverable error' (a 404 on basic.consume, for one)."""
        assert self.proc.poll() is None, f"the worker exited:\n{self.tail()}"
        text = self.log.read_text(errors="replace")
        assert "Unrecoverable error" not in text, (
            "the worker gave up: " + text[text.index("Unrecoverable error"):][:400])

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@pytest.fixture
def start_worker(tmp_path: Path, worker_env: dict[str, str]) -> Iterator[Any]:
    started: list[Worker] = []

    def start(nodes: list[ClusterNode]) -> Worker:
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "qcelery_app", "worker",
                 "--pool=solo", "--concurrency=1", "--loglevel=INFO",
                 "--without-mingle", "--without-gossip", "--hostname", "qcelery@%h"],
                cwd=tmp_path, env={**worker_env, "QCELERY_BROKER": broker_url(nodes)},
                stdout=out, stderr=subprocess.STDOUT)
        started.append(Worker(proc, log))
        return started[-1]

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.terminate()
            try:
                worker.proc.wait(15)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait(5)


def test_celery_tasks_all_complete_when_the_quorum_leader_is_killed(
        abc: Three, etcd: EtcdServer, cluster: str, tmp_path: Path, start_worker: Any,
        publisher_app: Any) -> None:
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    done_file = tmp_path / "done.txt"
    # node a first: the queue is declared there and a leads it (client-local placement);
    # after a dies, kombu fails over to b, then c
    publisher = publisher_app([a, b, c])
    sent = {number: publisher.send_task("qcelery.record", args=(number,))
            for number in range(BEFORE)}

    record, leadership = in_etcd(etcd, cluster, "celery")
    assert record is not None, "celery's default queue is not in etcd"
    assert (record.type, record.arguments.get("x-queue-type")) == ("quorum", "quorum"), record
    assert record.durable and sorted(record.members) == ["a", "b", "c"], record
    leader = leader_of(etcd, cluster, "celery")
    assert leadership is not None and leadership.leader == leader == "a"
    others = [node for name, node in nodes.items() if name != leader]

    # the worker's failover list starts with a node that is not the leader
    worker = start_worker([*others, nodes[leader]])

    def progress(at_least: int) -> bool:
        worker.alive()
        return sum(runs(done_file).values()) >= at_least

    wait_until(lambda: progress(KILL_AT), timeout=30)
    # celery's delayed-delivery queues are quorum queues too (declared before it consumes)
    delayed, _ = in_etcd(etcd, cluster, "celery_delayed_0")
    assert delayed is not None and delayed.type == "quorum", delayed
    wait_until(lambda: bool(consumers_of(others[0], "celery")), timeout=10)  # the worker's
    nodes[leader].kill()
    at_kill = runs(done_file)
    assert len(at_kill) < BEFORE, "the run ended before the kill: make the tasks slower"

    # the rest of the run at once, through the publisher's failover list. A publish on a
    # connection opened during the failover is nacked until the new leader is up (RabbitMQ
    # 3.10.8 nacks it too), and kombu retries a nack at once, on a new connection, so celery's
    # retry policy cannot outlast an election: the application sends again, as one would.
    refused = 0
    for number in range(BEFORE, BEFORE + AFTER):
        deadline = time.monotonic() + 30
        while True:
            try:
                sent[number] = publisher.send_task("qcelery.record", args=(number,))
                break
            except OperationalError:
                refused += 1
                assert time.monotonic() < deadline, "no publish confirmed in 30 s"
                time.sleep(0.2)
    new_leader = leader_of(etcd, cluster, "celery")

    # the rest takes about 10 s; a worker that records nothing for 15 s has stopped consuming
    deadline, last, seen = time.monotonic() + 60, time.monotonic(), -1
    while time.monotonic() < deadline and time.monotonic() - last < 15:
        worker.alive()
        ran = runs(done_file)
        if set(ran) == set(sent):
            break
        if sum(ran.values()) != seen:
            seen, last = sum(ran.values()), time.monotonic()
        time.sleep(0.2)
    ran = runs(done_file)
    duplicates = {n: k for n, k in sorted(ran.items()) if k > 1}
    story = (f"leader {leader} killed after {sum(at_kill.values())} runs of {len(at_kill)}"
             f" tasks, new leader {new_leader}, {refused} send_task calls refused meanwhile;"
             f" {len(duplicates)} tasks ran more than once: {duplicates}; the worker lost its"
             f" consumer {worker.log.read_text().count('Connection to broker lost')} times")
    missing = sorted(set(sent) - set(ran))
    assert not missing, (f"{len(missing)} of {len(sent)} tasks never ran: {missing[:20]}; "
                         f"{story}\nworker log:\n{worker.tail()}")
    assert set(ran) == set(sent), f"unknown task numbers {set(ran) - set(sent)}; {story}"
    states = Counter(result.state for result in sent.values())
    assert states == Counter({"SUCCESS": len(sent)}), f"results: {states}; {story}"
    assert [sent[n].get(timeout=5) for n in sorted(sent)] == sorted(sent)
    # at least once: what the worker held unacked at the kill (its prefetch), and acks that
    # died with the leader, run again; not more
    assert len(duplicates) <= 2 * PREFETCH, story
    print(story)


def test_celery_publishes_through_a_surviving_node_across_the_failover(
        abc: Three, etcd: EtcdServer, cluster: str, publisher_app: Any) -> None:
    """The publishing side alone, with celery's default publish retry policy: a publisher
    connected to a node that survives sends tasks right after `kill -9` of the leader's node;
    every one is confirmed, and enqueued. RabbitMQ 3.10.8 does the same (its 3-node cluster,
    this flow: 20 tasks sent in 0.3 s after the kill, 21 ready)."""
    a, b, c = abc
    publisher_app([a]).send_task("qcelery.record", args=(0,))  # declared through a: a leads
    assert leader_of(etcd, cluster, "celery") == "a"
    publisher = publisher_app([b, c, a])
    publisher.send_task("qcelery.record", args=(1,))  # its connection and channel, on b
    a.kill()
    for number in range(2, 22):
        publisher.send_task("qcelery.record", args=(number,))
    assert ready(b, "celery") >= 22
