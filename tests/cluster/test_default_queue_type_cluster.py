"""The default queue type in cluster mode: etcd's vhost records hold none yet, so every vhost
has the nodes' `default_queue_type` setting, and the API refuses to give one vhost another
(docs/QUORUM-QUEUES.md#the-default-queue-type). One node with a real etcd; no quorum queue is
made (a declaration's checks show the type)."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest
from support.brokers import BrokerProcess
from support.cluster import make_node
from support.cluster_api import api, connect
from support.etcd import EtcdServer


def test_every_vhost_has_the_nodes_setting(tmp_path: Path, etcd: EtcdServer, cluster: str,
                                           nodes: list[BrokerProcess]) -> None:
    node = make_node(tmp_path, etcd.url, cluster, "a", management=True,
                     extra=["--default-queue-type", "quorum"])
    nodes.append(node)
    node.start()
    assert api(node, "PUT", "/api/vhosts/orders", {"default_queue_type": "stream"}) == (400, {
        "error": "bad_request",
        "reason": "a vhost's own default_queue_type is not supported in cluster mode yet; "
                  "every vhost has the nodes' default_queue_type (quorum)"})
    assert api(node, "GET", "/api/vhosts/orders")[0] == 404
    assert api(node, "PUT", "/api/vhosts/orders", {"default_queue_type": "quorum"})[0] == 201
    assert api(node, "PUT", "/api/vhosts/orders", {})[0] == 204
    status, shown = api(node, "GET", "/api/vhosts")
    assert status == 200
    assert {v["name"]: v["default_queue_type"] for v in shown} == {"/": "quorum",
                                                                   "orders": "quorum"}
    with connect(node, vhost="orders") as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            conn.channel().queue_declare("", durable=True)
        assert refused.value.args == (406, "PRECONDITION_FAILED - Cannot declare a server-named "
                                      "queue for type rabbit_quorum_queue")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            conn.channel().queue_declare("jobs", durable=True, arguments={"x-max-priority": 5})
        assert refused.value.args == (406, "PRECONDITION_FAILED - invalid arg 'x-max-priority' "
                                      "for queue 'jobs' in vhost 'orders' of queue type "
                                      "rabbit_quorum_queue")
        assert conn.channel().queue_declare("").method.queue.startswith("amq.gen-")  # classic
