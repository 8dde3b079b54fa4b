"""The cluster settings: embedded defaults, then TOML, then LEVERET_* variables, then flags."""

from __future__ import annotations

import platform
from pathlib import Path

from leveret.broker.config import load


def test_cluster_defaults_are_a_single_node() -> None:
    config = load(env={})
    assert config.etcd == []  # no etcd: the single node of today
    assert config.node_name == f"leveret@{platform.node()}"
    assert config.advertise_host == platform.node()
    assert (config.cluster_name, config.cluster_port) == ("leveret", 25672)
    assert (config.cluster_secret, config.cluster_secret_file) == ("", None)
    assert config.cluster_lease_ttl_s == 10


def test_cluster_settings_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "leveret.toml"
    toml.write_text('etcd = ["http://file:2379"]\nnode-name = "from-file"\n'
                    'cluster_name = "file"\ncluster_port = 1\nadvertise_host = "file.host"\n'
                    'cluster_secret_file = "/file/secret"\ncluster_lease_ttl_s = 4\n')
    from_file = load(toml, env={})
    assert from_file.etcd == ["http://file:2379"] and from_file.node_name == "from-file"
    assert (from_file.cluster_name, from_file.cluster_port) == ("file", 1)
    assert from_file.advertise_host == "file.host"
    assert from_file.cluster_secret_file == Path("/file/secret")
    assert from_file.cluster_lease_ttl_s == 4

    env = {"LEVERET_ETCD": "http://a:2379, http://b:2379", "LEVERET_NODE_NAME": "from-env",
           "LEVERET_CLUSTER_NAME": "env", "LEVERET_CLUSTER_PORT": "2",
           "LEVERET_CLUSTER_SECRET": "s", "LEVERET_CLUSTER_LEASE_TTL_S": "3"}
    from_env = load(toml, env=env)
    assert from_env.etcd == ["http://a:2379", "http://b:2379"]
    assert (from_env.node_name, from_env.cluster_name, from_env.cluster_port) == (
        "from-env", "env", 2)
    assert from_env.cluster_secret == "s" and from_env.cluster_lease_ttl_s == 3
    assert from_env.advertise_host == "file.host"  # not in env: the file's

    flags = {"etcd": "http://flag:2379", "node_name": "from-flag", "cluster_port": 3,
             "advertise_host": "flag.host", "cluster_secret_file": Path("/flag/secret")}
    from_flags = load(toml, env=env, overrides=flags)
    assert from_flags.etcd == ["http://flag:2379"] and from_flags.node_name == "from-flag"
    assert (from_flags.cluster_port, from_flags.advertise_host) == (3, "flag.host")
    assert from_flags.cluster_secret_file == Path("/flag/secret")
    assert from_flags.cluster_name == "env"
