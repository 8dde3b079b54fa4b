"""The topology across a cluster, with a real etcd, real `leveret serve` nodes and pika: what one
node declares is there on every node before its -ok, racing declarations get one winner,
exclusive queues belong to one connection of one node, routing works whichever node declared
what, and etcd going away refuses changes without stopping the service."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

import pika
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, linked, make_node, states, wait_until
from support.etcd import EtcdServer
from support.rawamqp import open_client

from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.membership import ClusterKeys
from leveret.broker.cluster.topology import TopologyStore
from leveret.broker.cluster.topology_keys import TopologyKeys
from leveret.broker.cluster.topology_records import ExchangeRecord, QueueRecord

Connect = Callable[[ClusterNode], pika.BlockingConnection]


@pytest.fixture
def connect() -> Iterator[Connect]:
    opened: list[pika.BlockingConnection] = []

    def open_one(node: ClusterNode) -> pika.BlockingConnection:
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        opened.append(connection)
        return connection

    yield open_one
    for connection in opened:
        if connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()


def start_nodes(tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
                *names: str) -> list[ClusterNode]:
    """Nodes linked to each other (a change is settled on every linked node before its -ok)."""
    started = [make_node(tmp_path, etcd.url, cluster, name, management=True) for name in names]
    for node in started:
        nodes.append(node.start())
    wait_until(lambda: all(linked(node, len(started) - 1) for node in started), timeout=20)
    return started


def channel_of(connect: Connect, node: ClusterNode) -> BlockingChannel:
    return connect(node).channel()


def refused(call: Callable[[], Any]) -> tuple[int, str]:
    """The channel or connection error a call ends with: (code, text)."""
    try:
        call()
    except (ChannelClosedByBroker, ConnectionClosedByBroker) as exc:
        return exc.reply_code, exc.reply_text
    raise AssertionError("the broker accepted it")


def passive_queue(channel: BlockingChannel, name: str) -> Any:
    return channel.queue_declare(name, passive=True)


def test_a_declaration_is_on_every_node_before_its_ok(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b, c = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b", "c")
    on_a, on_b, on_c = (channel_of(connect, n) for n in (a, b, c))
    for i in range(20):
        on_a.queue_declare(f"q{i}", durable=True)
        on_a.exchange_declare(f"x{i}", "topic")
        passive_queue(on_b, f"q{i}")
        on_c.exchange_declare(f"x{i}", "topic", passive=True)
    # the same declaration elsewhere is the same queue; a different one is 406 everywhere
    assert on_b.queue_declare("q0", durable=True).method.queue == "q0"
    code, text = refused(lambda: on_c.queue_declare("q1", durable=False))
    assert code == 406
    assert text == ("PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q1' in vhost "
                    "'/': received 'false' but current is 'true'")


def race(nodes: list[ClusterNode], name: str) -> dict[str, Any]:
    """Each node's client declares `name` at the same moment, each with its own TTL: what
    each got ("ok" or the channel's reply code)."""
    results: dict[str, Any] = {}
    barrier = threading.Barrier(len(nodes))

    def declare(node: ClusterNode, ttl: int) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        try:
            channel = connection.channel()
            barrier.wait()
            try:
                channel.queue_declare(name, arguments={"x-message-ttl": ttl})
                results[node.node_name] = "ok"
            except ChannelClosedByBroker as exc:
                results[node.node_name] = exc.reply_code
        finally:
            if connection.is_open:
                connection.close()

    threads = [threading.Thread(target=declare, args=(node, 1000 * (i + 1)))
               for i, node in enumerate(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_racing_declarations_of_one_queue_get_one_winner(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    for round_ in range(8):
        results = race([a, b], f"race{round_}")
        assert sorted(map(str, results.values())) == ["406", "ok"], results


def test_an_exclusive_queue_of_another_node_is_locked(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    on_a = channel_of(connect, a)
    on_a.queue_declare("mine", exclusive=True)
    expected = (405, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'mine' "
                     "in vhost '/'. It could be originally declared on another connection or "
                     "the exclusive property value does not match that of the original "
                     "declaration.")
    assert refused(lambda: passive_queue(channel_of(connect, b), "mine")) == expected
    assert refused(lambda: channel_of(connect, b).queue_declare("mine", exclusive=True)) \
        == expected
    assert refused(lambda: channel_of(connect, b).queue_bind("mine", "amq.fanout")) == expected
    # another connection on the same node is locked out too
    assert refused(lambda: passive_queue(channel_of(connect, a), "mine")) == expected


def test_routing_through_entities_declared_on_three_nodes(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b, c = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b", "c")
    channel_of(connect, b).exchange_declare("logs", "topic", durable=True)
    on_a = channel_of(connect, a)
    on_a.queue_declare("errors", durable=True)
    channel_of(connect, c).queue_bind("errors", "logs", routing_key="*.error")
    on_a.basic_publish("logs", "db.error", b"routed on a")
    on_a.basic_publish("logs", "db.info", b"not routed")
    wait_until(lambda: passive_queue(on_a, "errors").method.message_count == 1, timeout=5)
    _method, _props, body = on_a.basic_get("errors", auto_ack=True)
    assert body == b"routed on a"


def test_an_exclusive_queue_goes_everywhere_with_its_connection(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    owner = connect(a)
    owner.channel().queue_declare("temp", exclusive=True)
    on_b = channel_of(connect, b)
    assert refused(lambda: passive_queue(on_b, "temp"))[0] == 405
    owner.close()

    def gone() -> bool:
        code, _text = refused(lambda: passive_queue(channel_of(connect, b), "temp"))
        return code == 404
    wait_until(gone, timeout=5)
    # and a new connection may take the name
    channel_of(connect, b).queue_declare("temp", exclusive=True)


def test_a_killed_nodes_exclusive_queues_go_after_the_lease(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    channel_of(connect, a).queue_declare("temp", exclusive=True)
    channel_of(connect, a).queue_declare("kept", durable=True)
    a.kill()

    def gone() -> bool:
        code, _text = refused(lambda: passive_queue(channel_of(connect, b), "temp"))
        return code == 404
    wait_until(gone, timeout=15)
    # a durable queue is not leased: it stays, held by the killed node
    channel_of(connect, b).queue_declare("kept", durable=True)


def test_auto_delete_goes_everywhere_with_the_last_consumer(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    on_a = channel_of(connect, a)
    on_a.queue_declare("ad", auto_delete=True)
    tag = on_a.basic_consume("ad", lambda *_: None)
    passive_queue(channel_of(connect, b), "ad")
    on_a.basic_cancel(tag)

    def gone() -> bool:
        code, _text = refused(lambda: passive_queue(channel_of(connect, b), "ad"))
        return code == 404
    wait_until(gone, timeout=5)


def test_a_pipelined_declare_and_publish_on_one_channel(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    (a,) = start_nodes(tmp_path, etcd, cluster, nodes, "a")
    with open_client(a.port) as client:
        client.send_method(1, commands.Exchange.Declare(exchange="px", exchange_type="fanout"))
        client.send_method(1, commands.Queue.Declare(queue="pq"))
        client.send_method(1, commands.Queue.Bind(queue="pq", exchange="px"))
        client.publish(1, b"first", "px", "")
        client.send_method(1, commands.Basic.Get(queue="pq", no_ack=True))
        replies = [client.next_method()[1] for _ in range(4)]
        assert [type(r) for r in replies] == [commands.Exchange.DeclareOk,
                                              commands.Queue.DeclareOk,
                                              commands.Queue.BindOk, commands.Basic.GetOk]


def test_a_node_restarted_after_its_queue_was_deleted_drops_it(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    on_a = channel_of(connect, a)
    on_a.queue_declare("held", durable=True)
    on_a.queue_declare("survivor", durable=True)
    on_a.basic_publish("", "survivor", b"kept",
                       pika.BasicProperties(delivery_mode=2))
    folders = {p.name for p in (a.data_dir / "queues").iterdir()}
    assert len(folders) == 2
    a.stop()
    # deleted elsewhere while its node is down (the holder is not asked)
    channel_of(connect, b).queue_delete("held")
    a.start()
    on_a = channel_of(connect, a)
    assert refused(lambda: passive_queue(on_a, "held"))[0] == 404
    assert passive_queue(channel_of(connect, a), "survivor").method.message_count == 1
    assert len(list((a.data_dir / "queues").iterdir())) == 1


def test_etcd_down_refuses_changes_and_serves_on(
        tmp_path: Path, etcd_factory: Callable[[], EtcdServer], cluster: str,
        nodes: list[BrokerProcess], connect: Connect) -> None:
    private = etcd_factory()
    (a,) = start_nodes(tmp_path, private, cluster, nodes, "a")
    on_a = channel_of(connect, a)
    on_a.queue_declare("before", durable=True)
    on_a.exchange_declare("ex", "fanout")
    on_a.queue_bind("before", "ex")
    private.kill()
    fresh = lambda: channel_of(connect, a)  # noqa: E731 - 541 closes the connection
    unavailable = " because the metadata store is unavailable"
    for call, action in [
        (lambda: fresh().queue_declare("during", durable=True),
         "declare queue 'during' in vhost '/'"),
        (lambda: fresh().queue_declare("", exclusive=True), None),
        (lambda: fresh().exchange_declare("xd", "topic"), "declare exchange 'xd' in vhost '/'"),
        (lambda: fresh().queue_bind("before", "amq.topic", "k"), "create binding"),
        (lambda: fresh().queue_unbind("before", "ex"), "delete binding"),
        (lambda: fresh().exchange_delete("ex"), "delete exchange 'ex' in vhost '/'"),
        (lambda: fresh().queue_delete("before"), "delete queue 'before' in vhost '/'"),
    ]:
        code, text = refused(call)
        assert code == 541, text
        assert text.startswith("INTERNAL_ERROR - failed to ") and text.endswith(unavailable)
        if action is not None:
            assert text == f"INTERNAL_ERROR - failed to {action}{unavailable}"
    # what exists is served
    on_a = channel_of(connect, a)
    on_a.basic_publish("", "before", b"still served")
    _m, _p, body = on_a.basic_get("before", auto_ack=True)
    assert body == b"still served"
    private.restart()  # the same ports and data

    def declared() -> bool:
        try:
            channel_of(connect, a).queue_declare("after", durable=True)
        except ConnectionClosedByBroker:
            return False
        return True
    wait_until(declared, timeout=20)
    # the refused changes left nothing behind, and changed nothing
    assert refused(lambda: passive_queue(channel_of(connect, a), "during"))[0] == 404
    assert refused(lambda: fresh().exchange_declare("xd", passive=True))[0] == 404
    on_a = fresh()
    on_a.basic_publish("ex", "", b"still bound")
    assert passive_queue(on_a, "before").method.message_count == 1


def test_refusals_are_the_single_nodes(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    on_a = lambda: channel_of(connect, a)  # noqa: E731 - a fresh channel per refusal
    channel_of(connect, b).queue_declare("q", durable=True)
    assert refused(lambda: on_a().queue_bind("q", "nope")) == (
        404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    assert refused(lambda: on_a().queue_bind("nope", "amq.direct")) == (
        404, "NOT_FOUND - no queue 'nope' in vhost '/'")
    assert refused(lambda: on_a().exchange_declare("nope", passive=True)) == (
        404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    assert refused(lambda: on_a().exchange_bind("amq.fanout", "nope")) == (
        404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    assert refused(lambda: passive_queue(on_a(), "nope")) == (
        404, "NOT_FOUND - no queue 'nope' in vhost '/'")
    assert refused(lambda: on_a().exchange_delete("amq.direct")) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not "
             "allowed")
    assert refused(lambda: on_a().queue_declare(
        "loc", arguments={"x-queue-leader-locator": "nearest"})) == (
        406, "PRECONDITION_FAILED - invalid arg 'x-queue-leader-locator' for queue 'loc' in "
             "vhost '/': invalid_queue_locator_arg")
    assert refused(lambda: on_a().exchange_declare("amq.mine", "direct")) == (
        403, "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'")
    # held by b; b down: deleted from the metadata, unless if_empty (it may hold messages)
    b.kill()
    wait_until(lambda: not linked(a, 1), timeout=10)
    assert refused(lambda: on_a().queue_delete("q", if_empty=True)) == (
        406, "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty")
    on_a().queue_delete("q")
    assert refused(lambda: passive_queue(on_a(), "q"))[0] == 404


def test_balanced_places_a_queue_on_the_node_holding_fewest(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    on_a = channel_of(connect, a)
    for i in range(3):
        on_a.queue_declare(f"local{i}", durable=True)  # client-local, the default
    on_a.queue_declare("spread", durable=True,
                       arguments={"x-queue-leader-locator": "balanced"})
    assert len(list((a.data_dir / "queues").iterdir())) == 3
    assert len(list((b.data_dir / "queues").iterdir())) == 1
    # an exclusive queue stays with its connection whatever it asks
    on_a.queue_declare("excl", exclusive=True,
                       arguments={"x-queue-leader-locator": "balanced"})
    assert on_a.queue_declare("excl", passive=True).method.queue == "excl"


def test_nowait_declarations_reach_etcd(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    with open_client(a.port) as client:
        client.send_method(1, commands.Exchange.Declare(exchange="nx", exchange_type="direct",
                                                        nowait=True))
        client.send_method(1, commands.Queue.Declare(queue="nq", nowait=True))
        client.send_method(1, commands.Queue.Bind(queue="nq", exchange="nx", routing_key="k",
                                                  nowait=True))
        client.send_method(1, commands.Basic.Qos(prefetch_count=1))
        client.expect(commands.Basic.QosOk)
    on_b = channel_of(connect, b)
    on_b.exchange_declare("nx", passive=True)
    on_b.queue_unbind("nq", "nx", routing_key="k")  # exists: no error either way
    with open_client(a.port) as client:  # nq was not exclusive: it outlives its client
        client.send_method(1, commands.Queue.Declare(queue="nq", passive=True))
        client.expect(commands.Queue.DeclareOk)


def test_unbind_and_exchange_delete_everywhere(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b, c = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b", "c")
    on_a = channel_of(connect, a)
    on_a.exchange_declare("events", "direct")
    on_a.queue_declare("inbox")
    channel_of(connect, b).queue_bind("inbox", "events", routing_key="k")
    channel_of(connect, c).queue_unbind("inbox", "events", routing_key="k")
    on_a.basic_publish("events", "k", b"unrouted")
    assert passive_queue(on_a, "inbox").method.message_count == 0
    channel_of(connect, b).exchange_delete("events")
    assert refused(lambda: channel_of(connect, a).exchange_declare("events", passive=True)) \
        == (404, "NOT_FOUND - no exchange 'events' in vhost '/'")
    channel_of(connect, c).queue_delete("inbox")
    assert refused(lambda: passive_queue(channel_of(connect, a), "inbox"))[0] == 404


def test_x_expires_is_decided_by_the_holder_and_seen_everywhere(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    channel_of(connect, a).queue_declare("brief", arguments={"x-expires": 300})
    time.sleep(1.5)  # unused meanwhile (a passive declare, even from b, counts as use)
    assert refused(lambda: passive_queue(channel_of(connect, b), "brief"))[0] == 404
    # and it may be declared again, anywhere
    channel_of(connect, b).queue_declare("brief", arguments={"x-expires": 60000})


def test_what_etcd_has_but_the_node_has_not_seen_yet_is_found(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    """Records written straight into etcd (no settle): a publish, a bind or a passive declare
    that arrives before the watch event reads etcd rather than answer 404."""
    a, _b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    on_a = channel_of(connect, a)
    on_a.queue_declare("sink")
    for i in range(10):
        asyncio.run(put_behind_the_nodes_back(etcd.url, cluster, f"fresh{i}", "a"))
        on_a.queue_bind("sink", f"fresh{i}", routing_key="r")
        on_a.exchange_declare(f"fresh{i}", passive=True)
        passive_queue(on_a, f"fresh{i}-q")
    for i in range(5):  # held by b: found, then asked of b
        asyncio.run(put_behind_the_nodes_back(etcd.url, cluster, f"far{i}", "b"))
        assert passive_queue(on_a, f"far{i}-q").method.message_count == 0
    for i in range(10):
        asyncio.run(put_behind_the_nodes_back(etcd.url, cluster, f"late{i}", "a"))
        on_a.basic_publish(f"late{i}", "r", b"published at once")  # no 404: the channel lives
    assert passive_queue(on_a, "sink").method.message_count == 0


async def put_behind_the_nodes_back(url: str, cluster: str, name: str, node: str) -> None:
    keys = TopologyKeys(ClusterKeys(cluster).root + "topology/")
    async with EtcdClient([url]) as client:
        store = TopologyStore(client, keys)
        await store.declare_exchange(ExchangeRecord("/", name, "direct"))
        await store.declare_queue(QueueRecord("/", f"{name}-q", node=node))


def test_an_auto_delete_exchange_goes_everywhere_with_its_last_binding(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    on_a = channel_of(connect, a)
    on_a.exchange_declare("fleeting", "direct", auto_delete=True)
    on_a.queue_declare("q1")
    on_a.queue_declare("q2")
    on_a.queue_bind("q1", "fleeting", "k")
    on_a.queue_bind("q2", "fleeting", "k")
    channel_of(connect, b).queue_unbind("q1", "fleeting", "k")
    channel_of(connect, b).exchange_declare("fleeting", passive=True)  # one binding left
    channel_of(connect, b).queue_delete("q2")  # the last one, with its queue

    def gone() -> bool:
        code, _text = refused(lambda: channel_of(connect, b).exchange_declare(
            "fleeting", passive=True))
        return code == 404
    wait_until(gone, timeout=5)
    # gone from etcd too: declared again with other flags, it is a new exchange
    channel_of(connect, b).exchange_declare("fleeting", "fanout")


def test_the_queue_leader_locator_policy_places_queues(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    on_a = channel_of(connect, a)
    on_a.queue_declare("local", durable=True)
    api_put(a, "/api/policies/%2F/spread", {
        "pattern": "^spread", "apply-to": "queues",
        "definition": {"queue-leader-locator": "balanced"}})
    # the policy wins over the argument, as in RabbitMQ
    on_a.queue_declare("spread.1", durable=True,
                       arguments={"x-queue-leader-locator": "client-local"})
    assert len(list((a.data_dir / "queues").iterdir())) == 1
    assert len(list((b.data_dir / "queues").iterdir())) == 1


def api_put(node: ClusterNode, path: str, body: dict[str, Any]) -> None:
    request = Request(f"http://127.0.0.1:{node.management_port}{path}", method="PUT",
                      data=json.dumps(body).encode(),
                      headers={"content-type": "application/json"})
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urlopen(request, timeout=15) as response:
        assert response.status in (201, 204)


def test_a_declaration_etcd_never_answered_is_refused_and_left_undone(
        tmp_path: Path, etcd_factory: Callable[[], EtcdServer], cluster: str,
        nodes: list[BrokerProcess], connect: Connect) -> None:
    """A paused etcd takes the txn's request and does not answer in time: the declaration may
    have been applied, so it is refused, read back once etcd answers, and deleted if it was."""
    private = etcd_factory()
    (a,) = start_nodes(tmp_path, private, cluster, nodes, "a")
    channel_of(connect, a).queue_declare("before", durable=True)
    private.pause()
    try:
        code, text = refused(lambda: channel_of(connect, a).queue_declare("during",
                                                                           durable=True))
        # by now (the client's 5 s timeout) the node has lost its 2 s lease: a declaration
        # that needs it is refused at once, without asking etcd
        wait_until(lambda: "lost the etcd lease" in a.log(), timeout=10)
        started = time.monotonic()
        leased = refused(lambda: channel_of(connect, a).queue_declare("excl", exclusive=True))
        assert time.monotonic() - started < 2
    finally:
        private.resume()
    assert (code, text) == (541, "INTERNAL_ERROR - failed to declare queue 'during' in vhost "
                                 "'/' because the metadata store is unavailable")
    assert leased == (541, "INTERNAL_ERROR - failed to declare queue 'excl' in vhost '/' "
                           "because the metadata store is unavailable")

    def declared() -> bool:
        try:
            channel_of(connect, a).queue_declare("after", durable=True)
        except ConnectionClosedByBroker:
            return False
        return True
    wait_until(declared, timeout=20)

    def undone() -> bool:  # etcd may apply the request it held once it runs again
        try:
            passive_queue(channel_of(connect, a), "during")
        except ChannelClosedByBroker as exc:
            return exc.reply_code == 404
        return False
    wait_until(undone, timeout=10)


def test_an_exclusive_queue_whose_connection_closes_at_once_goes_everywhere(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    """The connection goes while its declaration is in etcd's hands (or just after): the
    record is deleted either way, by the model's hook or by the sync finding no owner."""
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    for i in range(5):
        client = open_client(a.port)
        client.send_method(1, commands.Queue.Declare(queue=f"brief{i}", exclusive=True))
        if i % 2:
            client.expect(commands.Queue.DeclareOk)
        client.close()

    def all_gone() -> bool:
        for i in range(5):
            try:
                passive_queue(channel_of(connect, b), f"brief{i}")
            except ChannelClosedByBroker as exc:
                assert exc.reply_code in (404, 405)
                if exc.reply_code == 405:
                    return False
            else:
                return False
        return True
    wait_until(all_gone, timeout=10)
    channel_of(connect, b).queue_declare("brief0", exclusive=True)  # the name is free


def test_a_paused_node_is_down_for_the_others_then_rejoins_without_its_leased_queues(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        connect: Connect) -> None:
    """SIGSTOP past the lease: the others see it down and its exclusive queue gone; woken, it
    notices the lost lease, leaves, drops the queue etcd no longer has, and rejoins."""
    a, b = start_nodes(tmp_path, etcd, cluster, nodes, "a", "b")
    owner = connect(a)
    owner.channel().queue_declare("paused.excl", exclusive=True)
    channel_of(connect, a).queue_declare("paused.kept", durable=True)
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: states(etcd.url, cluster).get("a") == "down", timeout=15)
        wait_until(lambda: refused(
            lambda: passive_queue(channel_of(connect, b), "paused.excl"))[0] == 404, timeout=15)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: "lost the etcd lease" in a.log(), timeout=15)
    wait_until(lambda: states(etcd.url, cluster).get("a") == "running", timeout=30)
    wait_until(lambda: linked(a, 1) and linked(b, 1), timeout=30)
    # on a itself the exclusive queue went with the lease, though its connection lived on
    code, _text = refused(lambda: passive_queue(channel_of(connect, a), "paused.excl"))
    assert code == 404
    # the durable queue was never leased: both nodes still have it, and b can use it
    assert passive_queue(channel_of(connect, b), "paused.kept").method.message_count == 0
    channel_of(connect, b).queue_declare("paused.excl", exclusive=True)  # the name is free
