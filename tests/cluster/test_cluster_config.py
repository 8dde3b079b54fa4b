"""The cluster settings: embedded defaults, then TOML, then LEVERET_* variables, then flags."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest
from support.cluster import leveret, one_line

from leveret.broker.process.config import ConfigError, load


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


def test_failure_detection_defaults_and_precedence(tmp_path: Path) -> None:
    config = load(env={})
    assert (config.cluster_heartbeat_interval_s, config.cluster_heartbeat_timeout_s) == (0.5, 2.0)
    assert (config.cluster_lease_ttl_s, config.stream_failover_after_s) == (10, 1.0)
    toml = tmp_path / "leveret.toml"
    toml.write_text("cluster_heartbeat_interval_s = 1\ncluster_heartbeat_timeout_s = 5\n")
    from_file = load(toml, env={})
    assert (from_file.cluster_heartbeat_interval_s, from_file.cluster_heartbeat_timeout_s) == (
        1.0, 5.0)
    env = {"LEVERET_CLUSTER_HEARTBEAT_TIMEOUT_S": "4.5"}
    from_env = load(toml, env=env)
    assert (from_env.cluster_heartbeat_interval_s, from_env.cluster_heartbeat_timeout_s) == (
        1.0, 4.5)
    flags = {"cluster_heartbeat_interval_s": "0.25", "cluster_heartbeat_timeout_s": "1.5"}
    from_flags = load(toml, env=env, overrides=flags)
    assert (from_flags.cluster_heartbeat_interval_s, from_flags.cluster_heartbeat_timeout_s) == (
        0.25, 1.5)


INVALID = [
    ({"cluster_heartbeat_interval_s": "-1"},
     "invalid value -1 for setting 'cluster_heartbeat_interval_s': a number of seconds, more "
     "than 0"),
    ({"cluster_heartbeat_interval_s": "0"},
     "invalid value 0 for setting 'cluster_heartbeat_interval_s': a number of seconds, more "
     "than 0"),
    ({"cluster_heartbeat_timeout_s": "0"},
     "invalid value 0 for setting 'cluster_heartbeat_timeout_s': a number of seconds, more "
     "than 0"),
    ({"cluster_heartbeat_timeout_s": "nan"},
     "invalid value nan for setting 'cluster_heartbeat_timeout_s': a number of seconds, more "
     "than 0"),
    ({"cluster_heartbeat_interval_s": "2", "cluster_heartbeat_timeout_s": "2"},
     "invalid value 2 for setting 'cluster_heartbeat_timeout_s': it must be longer than "
     "cluster_heartbeat_interval_s (2)"),
    ({"cluster_heartbeat_timeout_s": "0.4"},  # below the default interval (0.5)
     "invalid value 0.4 for setting 'cluster_heartbeat_timeout_s': it must be longer than "
     "cluster_heartbeat_interval_s (0.5)"),
    ({"cluster_heartbeat_timeout_s": "soon"},
     "invalid value 'soon' for setting 'cluster_heartbeat_timeout_s'"),
    ({"cluster_lease_ttl_s": "0"},
     "invalid value 0 for setting 'cluster_lease_ttl_s': a number of seconds, more than 0"),
    ({"stream_failover_after_s": "-0.5"},
     "invalid value -0.5 for setting 'stream_failover_after_s': a number of seconds, 0 or more"),
]


@pytest.mark.parametrize(("values", "message"), INVALID)
def test_invalid_failure_detection_settings_are_one_line(
        values: dict[str, str], message: str) -> None:
    env = {f"LEVERET_{name.upper()}": value for name, value in values.items()}
    with pytest.raises(ConfigError) as from_env:
        load(env=env)
    assert str(from_env.value) == message
    with pytest.raises(ConfigError) as from_flags:
        load(env={}, overrides=values)
    assert str(from_flags.value) == message


def test_leveret_serve_refuses_a_bad_heartbeat_in_one_line(tmp_path: Path) -> None:
    base = ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0"]
    refused = leveret(*base, "--cluster-heartbeat-interval-s", "-1")
    assert one_line(refused) == ("error: invalid value -1 for setting "
                                 "'cluster_heartbeat_interval_s': a number of seconds, more "
                                 "than 0")
    refused = leveret(*base, "--cluster-heartbeat-interval-s", "3",
                      "--cluster-heartbeat-timeout-s", "1")
    assert one_line(refused) == ("error: invalid value 1 for setting "
                                 "'cluster_heartbeat_timeout_s': it must be longer than "
                                 "cluster_heartbeat_interval_s (3)")
    refused = leveret(*base, env={**os.environ, "LEVERET_CLUSTER_HEARTBEAT_TIMEOUT_S": "0"})
    assert one_line(refused) == ("error: invalid value 0 for setting "
                                 "'cluster_heartbeat_timeout_s': a number of seconds, more "
                                 "than 0")
