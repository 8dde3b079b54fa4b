"""GET /api/overview, /api/nodes, /api/cluster-name, /api/whoami and the health checks.

The node is this one process: memory from /proc, free disk from the data directory, alarms
from the broker's resource monitor when it has one. In cluster mode /api/nodes lists every node
etcd knows (`cluster.membership`): this one in full, with its `cluster_links` (`cluster.peers`),
the others from their records (running or not, alarms, uptime), each with its advertised host
and management port (what `leveretctl --node NAME` reaches); if etcd does not answer, this
node alone. In cluster mode the overview's queue and object totals take in every node's queues,
connections and channels (the `nodes` port). Read-only; runs on the event loop.
"""

from __future__ import annotations

import os
import resource
import shutil
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from leveret.broker.broker import VERSION
from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.management import cluster_views, views
from leveret.broker.management.http import (
    AMQP_HOST,
    AMQP_PORT,
    HTTP_HOST,
    bad_request,
    body,
    broker_of,
    listing,
    no_content,
    not_found,
    ok,
    require_admin,
    single,
    user_of,
    vhost_for_read,
    visible_vhosts,
)
from leveret.broker.management.nodes import nodes_of
from leveret.broker.model.exchange_types import EXCHANGE_TYPES
from leveret.broker.process import logs
from leveret.broker.process.alarms import resident_memory_bytes, total_memory_bytes
from leveret.broker.streamproto import registry

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

log = logs.get("leveret.management")
RABBITMQ_COMPAT_VERSION = "3.13.7"  # the RabbitMQ release whose API shapes Leveret follows
EXCHANGE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
    "x-consistent-hash": "Consistent Hashing Exchange",
    "x-delayed-message": "Delayed Message Exchange.",  # the plugin's description/0
    "x-modulus-hash": "Modulus Hashing Exchange",
    "topic": "AMQP topic exchange, as per the AMQP specification",
}


def alarm_state(broker: Broker) -> tuple[bool, bool]:
    """(memory alarm, disk alarm), from the broker's resource monitor."""
    return broker.alarms.memory, broker.alarms.disk


def node_view(broker: Broker) -> dict[str, Any]:
    config = broker.config
    mem_alarm, disk_alarm = alarm_state(broker)
    try:
        disk_free = shutil.disk_usage(config.data_dir).free
    except OSError:
        disk_free = 0
    try:
        fd_used = len(os.listdir("/proc/self/fd"))
    except OSError:
        fd_used = 0
    fd_total = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    total_memory = total_memory_bytes()
    return {
        "name": config.node_name,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "os_pid": str(os.getpid()),
        "mem_used": resident_memory_bytes(broker.alarms.worker_pids()),
        "mem_limit": int(total_memory * config.vm_memory_high_watermark),
        "mem_alarm": mem_alarm,
        "disk_free": disk_free,
        "disk_free_limit": config.disk_free_limit_bytes,
        "disk_free_alarm": disk_alarm,
        "fd_used": fd_used,
        "fd_total": fd_total,
        "sockets_used": len(broker.connections),
        "sockets_total": fd_total,
        "proc_used": 1,
        "proc_total": 1,
        "processors": os.cpu_count() or 1,
        "run_queue": 0,
        "uptime": int((time.time() - broker.started_at) * 1000),
        "partitions": [],
        "cluster_links": [],
        "rates_mode": "none",
        "net_ticktime": 0,
        "exchange_types": exchange_types(),
        "db_dir": str(config.data_dir),
    }


def exchange_types() -> list[dict[str, Any]]:
    return [
        {"name": t, "description": EXCHANGE_DESCRIPTIONS.get(t, ""), "enabled": True}
        for t in sorted(EXCHANGE_TYPES)
    ]


def listener_views(request: web.Request, broker: Broker) -> list[dict[str, Any]]:
    """Every listener of this node as RabbitMQ's overview lists them, by protocol: amqp,
    amqp/ssl, clustering (the node-to-node link), http, stream and stream/ssl, each with
    the address it is bound to and its port (as bound)."""
    config = broker.config
    host = request.app[AMQP_HOST]
    found = [("amqp", host, request.app[AMQP_PORT])]
    if config.tls_port:  # the broker does not start without its listener
        found.append(("amqp/ssl", host, config.tls_port))
    if broker.cluster_links is not None:
        found.append(("clustering", host, broker.cluster_links.port))
    if config.management_port:
        found.append(("http", request.app[HTTP_HOST], config.management_port))
    streams = registry.server_of(broker)
    if streams is not None:
        found += [(protocol, host, port) for protocol, port in
                  (("stream", streams.port), ("stream/ssl", streams.tls_port)) if port]
    node = config.node_name
    return [{"node": node, "protocol": protocol, "ip_address": address, "port": port}
            for protocol, address, port in sorted(found)]


async def get_overview(request: web.Request) -> web.Response:
    broker = broker_of(request)
    vhosts = visible_vhosts(request)
    queues = [q for v in vhosts for q in v.queues.values()]
    sessions = [s for s in broker.connections if s.vhost in vhosts]
    channels = [c for s in sessions for c in s.channels.values()]
    config = broker.config
    node = config.node_name
    listeners = listener_views(request, broker)
    objects = {"connections": len(sessions), "channels": len(channels),
               "consumers": sum(len(c.consumers) for c in channels)}
    # every node's queues, connections and channels (on one node: this node's)
    nodes = nodes_of(request)
    names = {v.name for v in vhosts}
    totals = await nodes.queue_totals(queues)
    remote = [c for c in await nodes.remote_items(cluster_views.CHANNELS)
              if c.get("vhost") in names]
    objects["channels"] += len(remote)
    objects["consumers"] += sum(int(c.get("consumer_count", 0)) for c in remote)
    objects["connections"] += len(
        [c for c in await nodes.remote_items(cluster_views.CONNECTIONS)
         if c.get("vhost") in names])
    return single(request, {
        "management_version": VERSION,
        "rates_mode": "none",
        "exchange_types": exchange_types(),
        "product_name": "Leveret",
        "product_version": VERSION,
        "rabbitmq_version": RABBITMQ_COMPAT_VERSION,
        "cluster_name": cluster_name(broker),
        "node": node,
        "disable_stats": False,
        "enable_queue_totals": True,
        "statistics_db_event_queue": 0,
        "message_stats": views.with_details({
            **views.sum_counts(queues),
            "confirm": sum(c.confirms.confirmed for c in channels if c.confirms is not None),
            "return_unroutable": sum(c.stats_return_unroutable for c in channels),
        }),
        "queue_totals": views.with_details(totals),
        "object_totals": {
            **objects,
            "exchanges": sum(len(v.exchanges) for v in vhosts),
            "queues": len(queues),
        },
        "listeners": listeners,
        "contexts": [{"node": node, "description": "Leveret Management", "path": "/",
                      "port": str(config.management_port)}],
    })


def remote_node_view(record: dict[str, Any]) -> dict[str, Any]:
    """Another cluster node, from its record in etcd: what RabbitMQ shows of a node, as far
    as the record tells it."""
    running = record.get("state") == "running"
    alarms = record.get("alarms") or []
    started_at = record.get("started_at") or 0
    return {
        "name": record["name"],
        "type": "disc",
        "running": running,
        "being_drained": False,
        "mem_alarm": "memory" in alarms,
        "disk_free_alarm": "disk" in alarms,
        "uptime": max(0, int(time.time() * 1000) - int(started_at)) if running else 0,
        "partitions": [],
        "rates_mode": "none",
        "exchange_types": exchange_types(),
        "version": record.get("version"),
        "advertise_host": record.get("advertise_host"),
        "management_port": record.get("management_port"),  # leveretctl --node NAME
    }


async def cluster_node_views(broker: Broker) -> list[dict[str, Any]]:
    """Every node: this one alone without etcd (or when etcd does not answer)."""
    local = node_view(broker)
    membership = broker.membership
    if membership is None:
        return [local]
    local["name"] = membership.name
    local["version"] = VERSION
    local["advertise_host"] = broker.config.advertise_host
    local["management_port"] = broker.config.management_port
    if broker.cluster_links is not None:
        local["cluster_links"] = broker.cluster_links.link_views()
    try:
        records = await membership.nodes()
    except EtcdException as exc:
        log.warning("etcd did not answer: /api/nodes lists this node only", error=str(exc))
        return [local]
    nodes = [local if r["name"] == membership.name else remote_node_view(r) for r in records]
    if local not in nodes:
        nodes.append(local)
    return nodes


def cluster_name(broker: Broker) -> str:
    return broker.config.cluster_name if broker.membership is not None \
        else broker.config.node_name


async def get_nodes(request: web.Request) -> web.Response:
    return listing(request, await cluster_node_views(broker_of(request)))


async def get_node(request: web.Request) -> web.Response:
    name = request.match_info["node"]
    broker = broker_of(request)
    if broker.membership is None:
        if name != broker.config.node_name:
            raise not_found()
        return ok(node_view(broker))
    for node in await cluster_node_views(broker):
        if node["name"] == name:
            return ok(node)
    raise not_found()


async def get_cluster_name(request: web.Request) -> web.Response:
    return ok({"name": cluster_name(broker_of(request))})


async def get_whoami(request: web.Request) -> web.Response:
    user = user_of(request)
    return ok({"name": user.name, "tags": list(user.tags)})


async def get_extensions(request: web.Request) -> web.Response:
    return ok([])


async def health_ok(request: web.Request) -> web.Response:
    return ok({"status": "ok"})


async def alarms_check(request: web.Request) -> web.Response:
    mem_alarm, disk_alarm = alarm_state(broker_of(request))
    if mem_alarm or disk_alarm:
        names = [n for n, on in (("memory", mem_alarm), ("disk", disk_alarm)) if on]
        return web.json_response(
            {"status": "failed", "reason": "resource alarm(s) in effect: " + ", ".join(names)},
            status=503,
        )
    return ok({"status": "ok"})


async def aliveness(request: web.Request) -> web.Response:
    vhost_for_read(request, request.match_info["vhost"])
    return ok({"status": "ok"})


async def put_memory_watermark(request: web.Request) -> web.Response:
    """`leveretctl set_vm_memory_high_watermark`: a new fraction, for this run of the node (as
    RabbitMQ's command), checked against at once."""
    require_admin(request)
    fraction = (await body(request)).get("fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) \
            or not 0.0 <= fraction <= 1.0:
        raise bad_request("The threshold should be a fraction between 0.0 and 1.0")
    broker = broker_of(request)
    broker.config.vm_memory_high_watermark = broker.alarms.memory_high_watermark = float(fraction)
    broker.alarms.sample()
    return no_content()


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/overview", get_overview)
    r.add_put("/api/leveret/vm-memory-high-watermark", put_memory_watermark)
    r.add_get("/api/nodes", get_nodes)
    r.add_get("/api/nodes/{node}", get_node)
    r.add_get("/api/cluster-name", get_cluster_name)
    r.add_get("/api/whoami", get_whoami)
    r.add_get("/api/extensions", get_extensions)
    r.add_get("/api/healthchecks/node", health_ok)
    r.add_get("/api/health/checks/alarms", alarms_check)
    r.add_get("/api/health/checks/local-alarms", alarms_check)
    r.add_get("/api/aliveness-test/{vhost}", aliveness)
