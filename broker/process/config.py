"""Broker configuration: embedded defaults, then a TOML file, then LEVERET_* env vars, then flags.

`leveret serve` runs with no file at all. Every setting has a default here; a TOML file
overrides some of them, environment variables named LEVERET_<SETTING> (upper case) override
those, and command-line flags override everything. Unknown keys and bad values are errors
that name the key.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """A configuration value that cannot be used; the message names the setting."""


@dataclass
class Config:
    host: str = "::"  # every address, IPv4 and IPv6 on one socket (0.0.0.0 without IPv6)
    port: int = 5672
    data_dir: Path = Path("./leveret-data")
    default_vhost: str = "/"
    default_user: str = "guest"
    default_pass: str = "guest"
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat_s: int = 60
    max_message_size_bytes: int = 134_217_728
    max_connections: int = 0  # 0 = unlimited
    handshake_timeout_s: float = 10.0
    management_port: int = 15672
    management_host: str = ""  # "" = same as host
    log_format: str = "auto"  # auto | console | json
    log_level: str = "info"
    loop: str = "asyncio"  # asyncio | uvloop
    stream_fsync: str = "never"  # never | always | <ms>
    # a stream's chunks (docs/STREAMS.md#chunks): a turn's publishes are cut into chunks of at
    # most this many records, a bound that starts at the min, doubles each time a chunk fills
    # and halves after a turn that took less than half of it, as osiris's writer batches; and of
    # about this many bytes
    stream_chunk_min_records: int = 32
    stream_chunk_max_records: int = 8192
    stream_chunk_max_bytes: int = 8_388_608
    queue_fsync: str = "never"  # for durable classic queues: never | always | <ms>
    # the node's cap on queue and stream logs holding their active segment and index open
    # (two descriptors each; docs/CONFIGURATION.md#open-files): the least recently used close
    # theirs past 3/4 of it, and reopen them when next written; 0: no cap
    open_logs: int = 2048
    # under queue_fsync = always, a group-commit round of this many queue logs or more is one
    # fdatasync of the node's write-ahead log (storage/wal.py); 0 = none (one syncfs instead)
    queue_wal_from: int = 8
    definitions: Path | None = None
    tls_port: int = 0  # 0 = no amqps listener
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    tls_cacertfile: Path | None = None
    tls_verify_peer: bool = False
    # RabbitMQ's stream protocol (docs/STREAM-PROTOCOL.md): 0 disables a listener; the TLS one
    # opens only when tls_certfile and tls_keyfile are set
    stream_port: int = 5552
    stream_tls_port: int = 5551
    stream_advertised_host: str = ""  # "": localhost over loopback, else the address used
    stream_advertised_port: int = 0  # 0 = the port the client connected to
    # processes serving AMQP clients (docs/WORKERS.md): 0 (the default) = one per core; 1 = this
    # one only; N > 1 adds N - 1 wire worker processes that read the client sockets
    workers: int = 0
    vm_memory_high_watermark: float = 0.4
    disk_free_limit_bytes: int = 50_000_000
    # cluster mode (docs/CLUSTER.md): none of these matter unless `etcd` names an endpoint
    etcd: list[str] = field(default_factory=list)  # etcd gateway URLs; [] = a single node
    node_name: str = field(default_factory=lambda: f"leveret@{platform.node()}")
    cluster_name: str = "leveret"
    cluster_port: int = 25672  # the node-to-node link (0: any free port, advertised as bound)
    advertise_host: str = field(default_factory=platform.node)
    cluster_secret: str = ""  # better given as LEVERET_CLUSTER_SECRET or cluster_secret_file
    cluster_secret_file: Path | None = None
    cluster_lease_ttl_s: int = 10
    # failure detection on the node-to-node links (docs/CONFIGURATION.md#failure-detection): a
    # heartbeat every interval while a link is idle; a link that has received nothing (no frame
    # of any kind) for the timeout is dropped, and the peer counts as unreachable
    cluster_heartbeat_interval_s: float = 0.5
    cluster_heartbeat_timeout_s: float = 2.0
    # a replicated stream's members elect a new leader once a quorum of them has lost its link
    # to the leader's node this long, without waiting for its lease to expire (docs/REPLICATION.md)
    stream_failover_after_s: float = 1.0
    # where a new queue's leader goes when neither the x-queue-leader-locator argument nor the
    # queue-leader-locator policy key says (client-local | balanced), as RabbitMQ's setting
    queue_leader_locator: str = "client-local"
    # the queue type of a declaration without x-queue-type, in a vhost created without its own
    # (docs/QUORUM-QUEUES.md#the-default-queue-type), as RabbitMQ's default_queue_type:
    # classic | quorum | stream
    default_queue_type: str = "classic"
    # the management API's message statistics (docs/UI.md#rates-in-the-api), as RabbitMQ's
    # collect_statistics: none (no rates, no message_stats) | coarse | fine (the same here)
    collect_statistics: str = "coarse"

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name: f for f in fields(Config)}
# default_queue_type's values, as rabbitmq.conf takes them (a type's name or its module's)
QUEUE_TYPES = {name: name for name in ("classic", "quorum", "stream")} | {
    f"rabbit_{name}_queue": name for name in ("classic", "quorum", "stream")}


def _coerce(name: str, value: Any) -> Any:
    default = getattr(Config(), name)
    kind = _FIELDS[name].type
    try:
        if isinstance(default, bool) or kind == "bool":
            if isinstance(value, bool):
                return value
            lowered = str(value).strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, list):
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            return list(value)
        if "Path" in str(kind):
            return Path(value) if value not in (None, "") else None
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"invalid value {value!r} for setting '{name}'") from None


def _check_failure_detection(values: Mapping[str, Any]) -> None:
    """The cluster's timing settings are finite and above zero (the failover delay may be
    zero), and a link's heartbeat timeout is longer than its interval: a timeout no longer
    than the interval would drop idle links between two heartbeats."""
    defaults = Config()
    for name in ("cluster_heartbeat_interval_s", "cluster_heartbeat_timeout_s",
                 "cluster_lease_ttl_s", "stream_failover_after_s"):
        value = values.get(name, getattr(defaults, name))
        floor_ok = value >= 0 if name == "stream_failover_after_s" else value > 0
        if not (math.isfinite(value) and floor_ok):
            what = "0 or more" if name == "stream_failover_after_s" else "more than 0"
            raise ConfigError(f"invalid value {value:g} for setting '{name}': a number of "
                              f"seconds, {what}")
    interval = values.get("cluster_heartbeat_interval_s", defaults.cluster_heartbeat_interval_s)
    timeout = values.get("cluster_heartbeat_timeout_s", defaults.cluster_heartbeat_timeout_s)
    if timeout <= interval:
        raise ConfigError(f"invalid value {timeout:g} for setting 'cluster_heartbeat_timeout_s': "
                          f"it must be longer than cluster_heartbeat_interval_s ({interval:g})")


def _check_choices(values: dict[str, Any]) -> None:
    """The settings that take one of a few words; default_queue_type becomes a type's name."""
    locator = values.get("queue_leader_locator", "client-local")
    if locator not in ("client-local", "balanced", "random", "least-leaders", "min-masters"):
        raise ConfigError(f"invalid value '{locator}' for setting 'queue_leader_locator': "
                          "client-local or balanced")
    queue_type = values.get("default_queue_type", "classic")
    if queue_type not in QUEUE_TYPES:
        raise ConfigError(f"invalid value '{queue_type}' for setting 'default_queue_type': "
                          "classic, quorum or stream")
    values["default_queue_type"] = QUEUE_TYPES[queue_type]
    statistics = values.get("collect_statistics", "coarse")
    if statistics not in ("none", "coarse", "fine"):
        raise ConfigError(f"invalid value '{statistics}' for setting 'collect_statistics': "
                          "none, coarse or fine")


def load(
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults < TOML file < LEVERET_* environment < explicit overrides (flags)."""
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            with open(config_file, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {config_file}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in _FIELDS:
                raise ConfigError(f"unknown setting '{key}' in {config_file}")
            values[name] = _coerce(name, value)
    env = os.environ if env is None else env
    for name in _FIELDS:
        raw = env.get(f"LEVERET_{name.upper()}")
        if raw is not None:
            values[name] = _coerce(name, raw)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = _coerce(name, value)
    _check_choices(values)
    _check_failure_detection(values)
    for name in ("stream_chunk_min_records", "stream_chunk_max_records", "stream_chunk_max_bytes"):
        if values.get(name, 1) < 1:
            raise ConfigError(f"invalid value {values[name]} for setting '{name}': 1 or more")
    for name, zero in (("open_logs", "no cap"), ("queue_wal_from", "no write-ahead log")):
        if values.get(name, 0) < 0:
            raise ConfigError(f"invalid value {values[name]} for setting '{name}': "
                              f"a number of logs, or 0 for {zero}")
    if values.get("workers", 0) < 0:
        raise ConfigError(f"invalid value {values['workers']} for setting 'workers': "
                          "a number of processes, or 0 for one per core")
    return Config(**values)
