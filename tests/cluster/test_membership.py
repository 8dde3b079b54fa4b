"""Cluster membership with a real etcd and real `leveret serve` processes: joining, the shared
secret, names, a node killed and back, a lost lease, `leveret cluster-status` and /api/nodes."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
from support.brokers import BrokerProcess
from support.cluster import (
    SECRET,
    TTL_S,
    api_get,
    api_nodes,
    leveret,
    make_node,
    one_line,
    states,
    status,
    wait_until,
)
from support.etcd import EtcdServer
from support.ports import free_port


def test_three_nodes_join_die_and_come_back(tmp_path: Path, etcd: EtcdServer, cluster: str,
                                            nodes: list[BrokerProcess]) -> None:
    n1, n2, n3 = (make_node(tmp_path, etcd.url, cluster, name, management=True)
                  for name in ("n1", "n2", "n3"))
    for node in (n1, n2, n3):
        nodes.append(node.start())
    data = status(etcd.url, cluster)
    assert data["running_nodes"] == ["n1", "n2", "n3"]
    assert data["disk_nodes"] == ["n1", "n2", "n3"]
    by_name = {n["name"]: n for n in data["nodes"]}
    assert by_name["n2"]["amqp_port"] == n2.port
    assert by_name["n2"]["cluster_port"] == n2.cluster_port
    assert by_name["n2"]["version"] == data["versions"]["n2"] and by_name["n2"]["alarms"] == []
    table = leveret("cluster-status", "--etcd", etcd.url, "--cluster-name", cluster)
    assert table.returncode == 0 and "running" in table.stdout and "n3" in table.stdout

    for node in (n1, n2, n3):  # any node's management API lists the whole cluster
        listed = {n["name"]: n["running"] for n in api_nodes(node)}
        assert listed == {"n1": True, "n2": True, "n3": True}
    assert api_get(n1, "/api/nodes/n2")["name"] == "n2"
    assert api_get(n1, "/api/nodes/n1")["os_pid"] == str(n1.pid)  # itself, in full
    with pytest.raises(HTTPError) as missing:
        api_get(n1, "/api/nodes/nobody")
    assert missing.value.code == 404
    assert api_get(n2, "/api/cluster-name") == {"name": cluster}

    n2.kill()  # kill -9: its record goes when etcd expires its lease
    killed_at = time.monotonic()
    wait_until(lambda: states(etcd.url, cluster)["n2"] == "down", timeout=TTL_S + 10)
    assert time.monotonic() - killed_at >= TTL_S - 1  # the lease, not anything sooner
    assert states(etcd.url, cluster) == {"n1": "running", "n2": "down", "n3": "running"}
    assert {n["name"]: n["running"] for n in api_nodes(n1)}["n2"] is False

    n2.restart()
    assert states(etcd.url, cluster)["n2"] == "running"

    n2.kill()  # restarted at once, before the lease expires: it waits for its old record
    n2.restart()
    assert states(etcd.url, cluster)["n2"] == "running"

    assert n3.stop() == 0  # a clean stop revokes the lease: down at once
    assert states(etcd.url, cluster)["n3"] == "down"


def test_wrong_or_missing_secret_is_refused(tmp_path: Path, etcd: EtcdServer, cluster: str,
                                            nodes: list[BrokerProcess]) -> None:
    nodes.append(make_node(tmp_path, etcd.url, cluster, "first").start())
    wrong = make_node(tmp_path, etcd.url, cluster, "wrong", env={"LEVERET_CLUSTER_SECRET": "x"})
    assert "cluster secret does not match" in one_line(wrong.run_to_exit())
    missing = make_node(tmp_path, etcd.url, cluster, "missing",
                        env={"LEVERET_CLUSTER_SECRET": ""})
    assert "needs a shared secret" in one_line(missing.run_to_exit())
    no_file = make_node(tmp_path, etcd.url, cluster, "nofile",
                        extra=["--cluster-secret-file", str(tmp_path / "absent")])
    assert "cannot read the cluster secret file" in one_line(no_file.run_to_exit())
    (tmp_path / "empty.secret").write_text("\n")
    empty = make_node(tmp_path, etcd.url, cluster, "empty",
                      extra=["--cluster-secret-file", str(tmp_path / "empty.secret")])
    assert "is empty" in one_line(empty.run_to_exit())
    assert states(etcd.url, cluster) == {"first": "running"}

    (tmp_path / "good.secret").write_text(SECRET + "\n")  # the file wins over the variable
    from_file = make_node(tmp_path, etcd.url, cluster, "fromfile",
                          env={"LEVERET_CLUSTER_SECRET": "ignored"},
                          extra=["--cluster-secret-file", str(tmp_path / "good.secret")])
    nodes.append(from_file.start())
    assert states(etcd.url, cluster) == {"first": "running", "fromfile": "running"}
    stored = leveret_etcd_value(etcd, f"/leveret/{cluster}/secret")
    assert SECRET not in stored and len(stored) == 64  # an HMAC-SHA256, never the secret


def leveret_etcd_value(etcd: EtcdServer, key: str) -> str:
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    with urlopen(Request(etcd.url + "/v3/kv/range", data=body), timeout=10) as response:
        kvs = json.loads(response.read())["kvs"]
    return base64.b64decode(kvs[0]["value"]).decode()


def test_a_second_node_with_the_same_name_is_refused(tmp_path: Path, etcd: EtcdServer,
                                                     cluster: str,
                                                     nodes: list[BrokerProcess]) -> None:
    nodes.append(make_node(tmp_path, etcd.url, cluster, "twin").start())
    (tmp_path / "other").mkdir()
    second = make_node(tmp_path / "other", etcd.url, cluster, "twin")
    line = one_line(second.run_to_exit())
    assert "a node named 'twin' is already running" in line and "--node-name" in line
    assert states(etcd.url, cluster) == {"twin": "running"}


def test_etcd_unreachable_or_bad_url_at_start(tmp_path: Path, cluster: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    line = one_line(make_node(tmp_path, dead, cluster, "alone").run_to_exit())
    assert "cannot reach etcd" in line and dead in line
    bad = one_line(make_node(tmp_path, "localhost:2379", cluster, "bad").run_to_exit())
    assert "invalid etcd URL 'localhost:2379'" in bad


def test_cluster_status_mistakes(tmp_path: Path, etcd: EtcdServer, cluster: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert "cannot reach etcd" in one_line(leveret("cluster-status", "--etcd", dead))
    assert "invalid etcd URL" in one_line(leveret("cluster-status", "--etcd", "nope"))
    env = {k: v for k, v in os.environ.items() if k != "LEVERET_ETCD"}
    assert "no etcd given" in one_line(leveret("cluster-status", env=env))
    empty = leveret("cluster-status", "--etcd", etcd.url, "--cluster-name", cluster)
    assert empty.returncode == 0 and "no known nodes" in empty.stdout
    assert status(etcd.url, cluster)["nodes"] == []


def test_alarms_are_in_the_record(tmp_path: Path, etcd: EtcdServer, cluster: str,
                                  nodes: list[BrokerProcess]) -> None:
    low_disk = {"LEVERET_DISK_FREE_LIMIT_BYTES": str(10**18)}  # the disk alarm at once
    nodes.append(make_node(tmp_path, etcd.url, cluster, "full", env=low_disk).start())

    def disk_alarm() -> bool:
        data = status(etcd.url, cluster)
        return bool(data["alarms"] == [{"node": "full", "alarms": ["disk"]}])

    wait_until(disk_alarm, timeout=10)


class NotEtcd(BaseHTTPRequestHandler):
    """An HTTP server that is not etcd: every POST gets a JSON 404."""

    def do_POST(self) -> None:
        body = b'{"message": "no such endpoint"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_etcd() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotEtcd)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_etcd_refusals_are_one_line(tmp_path: Path, etcd: EtcdServer, cluster: str,
                                    not_etcd: str) -> None:
    line = one_line(make_node(tmp_path, not_etcd, cluster, "a").run_to_exit())
    assert "etcd refused to register this node" in line and "no such endpoint" in line
    status_line = one_line(leveret("cluster-status", "--etcd", not_etcd))
    assert "etcd refused the request" in status_line
    too_long = make_node(tmp_path, etcd.url, cluster, "b",
                         env={"LEVERET_CLUSTER_LEASE_TTL_S": str(10**10)})
    assert "etcd refused to register this node" in one_line(too_long.run_to_exit())
    assert states(etcd.url, cluster) == {}


def test_lost_lease_leaves_and_rejoins(tmp_path: Path, etcd_factory: Callable[[], EtcdServer],
                                       cluster: str, nodes: list[BrokerProcess]) -> None:
    etcd = etcd_factory()
    node = make_node(tmp_path, etcd.url, cluster, "solo", management=True).start()
    nodes.append(node)
    etcd.kill()
    wait_until(lambda: "lost the etcd lease" in node.log(), timeout=TTL_S + 10)
    assert [n["name"] for n in api_nodes(node)] == ["solo"]  # etcd gone: this node alone
    etcd.restart()
    wait_until(lambda: "rejoined the cluster" in node.log(), timeout=20)
    assert states(etcd.url, cluster) == {"solo": "running"}

    etcd.pause()  # etcd answers nothing: only the lease's deadline reveals it
    wait_until(lambda: node.log().count("lost the etcd lease") == 2, timeout=TTL_S + 10)
    etcd.resume()
    wait_until(lambda: node.log().count("rejoined the cluster") == 2, timeout=30)
    assert states(etcd.url, cluster) == {"solo": "running"}
    assert node.proc is not None and node.proc.poll() is None
