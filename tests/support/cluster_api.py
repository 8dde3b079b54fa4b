"""The management API of cluster nodes, for tests: any method, the status and the JSON body
(errors included), and AMQP connections to a node with pika."""

from __future__ import annotations

import base64
import json
import time
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

import pika
from support.brokers import BrokerProcess


def api(node: BrokerProcess, method: str, path: str, body: Any = None,
        user: str = "guest", password: str = "guest", raw: bytes | None = None,
        timeout: float = 30.0) -> tuple[int, Any]:
    """(status, JSON body or None) of one request to the node's management API."""
    port = getattr(node, "management_port", 0)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    request.add_header("Authorization",
                       "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urlopen(request, timeout=timeout) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except HTTPError as error:
        text = error.read()
        return error.code, json.loads(text) if text else None


def ok(node: BrokerProcess, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    status, answer = api(node, method, path, body, **kw)
    assert 200 <= status < 300, (method, path, status, answer)
    return answer


def connect(node: BrokerProcess, user: str = "guest", password: str = "guest",
            vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=node.port, virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password), connection_attempts=1,
        blocked_connection_timeout=10, socket_timeout=10))


def wait_linked(nodes: list[Any], timeout: float = 20.0, password: str = "guest") -> None:
    """Wait until every node has its link to every other (each node's own /api/nodes entry
    lists them in `cluster_links`): from then on a change settles on all of them."""
    names = {node.node_name for node in nodes}
    deadline = time.monotonic() + timeout
    for node in nodes:
        while True:
            try:  # the management listener opens just after the AMQP one
                listed = ok(node, "GET", "/api/nodes", password=password)
            except URLError:
                listed = []
            own = next((n for n in listed if n["name"] == node.node_name), None)
            if own is not None and \
                    {link["name"] for link in own["cluster_links"]} == names - {node.node_name}:
                break
            assert time.monotonic() < deadline, f"{node.node_name} is not linked to every node"
            time.sleep(0.1)
