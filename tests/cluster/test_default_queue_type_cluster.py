"""The default queue type in cluster mode: a vhost's `default_queue_type` is in its etcd record,
so every node applies the same one; a vhost given none has the nodes' setting
(docs/QUORUM-QUEUES.md#the-default-queue-type). Real etcd and two real `leveret serve` nodes."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest
from support.brokers import BrokerProcess
from support.cluster import linked, make_node, wait_until
from support.cluster_api import api, connect
from support.etcd import EtcdServer


def test_a_vhosts_default_type_holds_on_every_node(tmp_path: Path, etcd: EtcdServer,
                                                   cluster: str,
                                                   nodes: list[BrokerProcess]) -> None:
    a, b = (make_node(tmp_path, etcd.url, cluster, name, management=True,
                      extra=["--default-queue-type", "quorum"]) for name in ("a", "b"))
    for node in (a, b):
        nodes.append(node)
        node.start()
    wait_until(lambda: linked(a, 1) and linked(b, 1), timeout=60)
    assert api(a, "PUT", "/api/vhosts/orders", {"default_queue_type": "stream"})[0] == 201
    assert api(a, "PUT", "/api/vhosts/plain", {})[0] == 201
    for node in (a, b):
        wait_until(lambda node=node: {v["name"]: v["default_queue_type"]
                                      for v in api(node, "GET", "/api/vhosts")[1]} == {
            "/": "quorum", "orders": "stream", "plain": "quorum"}, timeout=20)
    with connect(b, vhost="orders") as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            conn.channel().queue_declare("", durable=True)
        assert refused.value.args == (406, "PRECONDITION_FAILED - Cannot declare a server-named "
                                      "queue for type rabbit_stream_queue")
    with connect(b, vhost="plain") as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            conn.channel().queue_declare("jobs", durable=True, arguments={"x-max-priority": 5})
        assert refused.value.args == (406, "PRECONDITION_FAILED - invalid arg 'x-max-priority' "
                                      "for queue 'jobs' in vhost 'plain' of queue type "
                                      "rabbit_quorum_queue")
        assert conn.channel().queue_declare("").method.queue.startswith("amq.gen-")  # classic
    # a change reaches every node
    assert api(b, "PUT", "/api/vhosts/orders", {"default_queue_type": "classic"})[0] == 204
    wait_until(lambda: {v["name"]: v["default_queue_type"]
                        for v in api(a, "GET", "/api/vhosts")[1]}["orders"] == "classic",
               timeout=20)
