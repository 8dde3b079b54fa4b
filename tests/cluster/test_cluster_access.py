"""Access control in cluster mode, with a real etcd, real `leveret serve` nodes, pika and the
management API: vhosts, users, permissions, policies and definitions written on one node are
in force on every node at once; defaults are made once per cluster; etcd down refuses changes
with a 503 and keeps serving what the nodes have."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
from pika.exceptions import ProbableAccessDeniedError, ProbableAuthenticationError
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, make_node, one_line
from support.cluster_api import api, connect, ok
from support.etcd import EtcdServer


def start_nodes(tmp_path: Path, etcd_url: str, cluster: str, nodes: list[BrokerProcess],
                names: tuple[str, ...] = ("a", "b", "c"),
                extra: list[str] | None = None) -> list[ClusterNode]:
    started = []
    for name in names:
        node = make_node(tmp_path, etcd_url, cluster, name, management=True, extra=extra)
        nodes.append(node.start())
        started.append(node)
    return started


def can_login(node: BrokerProcess, user: str, password: str, vhost: str = "/") -> bool:
    try:
        connect(node, user, password, vhost).close()
    except (ProbableAuthenticationError, ProbableAccessDeniedError):
        return False
    return True


def test_a_user_added_on_one_node_logs_in_on_another(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    assert not can_login(b, "alice", "s3cret")
    status, _ = api(a, "PUT", "/api/users/alice", {"password": "s3cret", "tags": "management"})
    assert status == 201
    status, _ = api(a, "PUT", "/api/permissions/%2F/alice",
                    {"configure": ".*", "write": ".*", "read": ".*"})
    assert status == 201
    assert can_login(b, "alice", "s3cret")  # at once: the -ok came after every node had it
    assert not can_login(b, "alice", "wrong")
    assert ok(b, "GET", "/api/users/alice")["tags"] == ["management"]
    status, _ = api(a, "PUT", "/api/users/alice", {"password": "other", "tags": "management"})
    assert status == 204
    assert not can_login(b, "alice", "s3cret") and can_login(b, "alice", "other")
    assert api(b, "DELETE", "/api/users/alice")[0] == 204
    assert not can_login(a, "alice", "other")
    assert api(a, "DELETE", "/api/users/alice")[0] == 404
