"""Definitions: export and import the broker's topology in RabbitMQ's JSON format.

`export_all` gives what RabbitMQ's GET /api/definitions gives (vhosts, users, permissions,
policies, exchanges, queues and bindings; nothing transient: exclusive queues, the default
and `amq.*` exchanges and the default bindings are left out). `export_vhost` gives the
per-vhost form, whose items carry no "vhost" key. `import_definitions` loads either form,
including files exported from RabbitMQ: users with rabbit_password_hashing_sha256 (sha512 and
md5 too) hashes or plain passwords, tags as "a,b" or a list. Queues of every type Leveret has
(classic, quorum, stream) are exported with their arguments, `x-queue-type` among them, as
RabbitMQ exports them (a queue of another type than classic always names its type there), and
imported by declaring them with those arguments (a quorum queue in a cluster is placed over
its members as a client's declare would place it). What Leveret does not support (limits,
runtime parameters, topic permissions, operator policies, other queue types) is skipped with a
log line, never an error. The order is RabbitMQ's: users, vhosts, permissions,
exchanges, policies, queues, bindings.

Writes go through `access_store` (the model and SQLite on a single node, etcd in cluster
mode, where every change is applied on every node before the import goes on, and queues are
held by the importing node). etcd unreachable midway raises `TopologyUnavailable`: what was
imported before stays, each object being one change.

Called on the event loop thread (the API) or before the listeners start (at boot).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leveret.broker.access import admin
from leveret.broker.access.access_store import AccessStore, TopologyUnavailable, access_store
from leveret.broker.management.views import jsonable as _json
from leveret.broker.model import default_type
from leveret.broker.model.delayed_log import hidden
from leveret.broker.model.errors import BrokerError
from leveret.broker.model.exchange_types import exchange_class
from leveret.broker.process import logs

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.model.vhost import VHost

log = logs.get("leveret.definitions")
RABBIT_VERSION = "3.13.7"  # the RabbitMQ definitions format this export follows
SUPPORTED_QUEUE_TYPES = ("classic", "quorum", "stream")


class DefinitionsError(Exception):
    """A definitions document that cannot be loaded; the message is one line."""


# -- export -----------------------------------------------------------------------------------


def _header(broker: Broker) -> dict[str, Any]:
    from leveret.broker.broker import VERSION

    return {
        "rabbit_version": RABBIT_VERSION,
        "rabbitmq_version": RABBIT_VERSION,
        "product_name": "Leveret",
        "product_version": VERSION,
    }


def _exchanges(vhost: VHost) -> list[dict[str, Any]]:
    return [
        {
            "name": x.name,
            "vhost": vhost.name,
            "type": x.type,
            "durable": x.durable,
            "auto_delete": x.auto_delete,
            "internal": x.internal,
            "arguments": _json(x.arguments),
        }
        for x in vhost.exchanges.values()
        if x.name and not x.name.startswith("amq.")
    ]


def _queues(vhost: VHost) -> list[dict[str, Any]]:
    return [
        {
            "name": q.name,
            "vhost": vhost.name,
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "type": q.type,
            "arguments": _queue_arguments(q.type, q.arguments),
        }
        for q in vhost.queues.values()
        if not q.exclusive and not hidden(q)  # (a delayed exchange's log comes with it)
    ]


def _queue_arguments(queue_type: str, arguments: Any) -> Any:
    """A queue's arguments as exported: a queue that is not classic names its type (declared
    through a vhost's default queue type, it may not have), so that importing it declares the
    same type, as RabbitMQ's stored arguments do."""
    exported = _json(arguments)
    if queue_type != "classic" and isinstance(exported, dict):
        exported.setdefault("x-queue-type", queue_type)
    return exported


def _bindings(vhost: VHost) -> list[dict[str, Any]]:
    return [
        {
            "source": b.source.name,
            "vhost": vhost.name,
            "destination": b.destination.name,
            "destination_type": b.destination.kind,
            "routing_key": b.routing_key,
            "arguments": _json(b.arguments),
        }
        for x in vhost.exchanges.values()
        for b in x.bindings.values()
        if not getattr(b.destination, "exclusive", False)
    ]


def _policies(vhost: VHost) -> list[dict[str, Any]]:
    return [
        {
            "vhost": vhost.name,
            "name": p.name,
            "pattern": p.pattern,
            "apply-to": p.apply_to,
            "definition": _json(p.definition),
            "priority": p.priority,
        }
        for p in vhost.policies.values()
    ]


def export_all(broker: Broker) -> dict[str, Any]:
    meta = access_store(broker).vhost_metadata()
    vhosts = list(broker.vhosts.values())
    users = broker.users.users.values()
    return {
        **_header(broker),
        "users": [
            {
                "name": u.name,
                "password_hash": u.password_hash,
                "hashing_algorithm": admin.algorithm_of(u.password_hash),
                "tags": list(u.tags),
                "limits": {},
            }
            for u in users
        ],
        "vhosts": [
            {
                "name": v.name,
                "description": meta.get(v.name, ("", []))[0],
                "tags": meta.get(v.name, ("", []))[1],
                "limits": [],
                "metadata": {  # RabbitMQ 4.3 writes default_queue_type here only
                    "description": meta.get(v.name, ("", []))[0],
                    "tags": meta.get(v.name, ("", []))[1],
                    "default_queue_type": v.default_queue_type,
                },
            }
            for v in vhosts
        ],
        "permissions": [
            {"user": u.name, "vhost": name, "configure": p.configure, "write": p.write,
             "read": p.read}
            for u in users
            for name, p in u.permissions.items()
        ],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": [p for v in vhosts for p in _policies(v)],
        "queues": [q for v in vhosts for q in _queues(v)],
        "exchanges": [x for v in vhosts for x in _exchanges(v)],
        "bindings": [b for v in vhosts for b in _bindings(v)],
    }


def export_vhost(broker: Broker, name: str) -> dict[str, Any]:
    vhost = admin.get_vhost(broker, name)

    def strip(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in item.items() if k != "vhost"} for item in items]

    return {
        **_header(broker),
        "parameters": [],
        "policies": strip(_policies(vhost)),
        "queues": strip(_queues(vhost)),
        "exchanges": strip(_exchanges(vhost)),
        "bindings": strip(_bindings(vhost)),
    }


# -- import -----------------------------------------------------------------------------------


def _items(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionsError(f'"{key}" must be a list')
    return [item for item in value if isinstance(item, dict)]


def _skip_unsupported(data: dict[str, Any]) -> None:
    for key, what in (("topic_permissions", "topic permissions"),
                      ("parameters", "runtime parameters"),
                      ("global_parameters", "global parameters")):
        items = _items(data, key)
        if items:
            log.info(f"definitions: {len(items)} {what} ignored (not supported by Leveret)",
                     names=[str(i.get("name", i.get("user", ""))) for i in items])
    for user in _items(data, "users"):
        if user.get("limits"):
            log.info("definitions: user limits ignored", user=user.get("name"))
    for vhost in _items(data, "vhosts"):
        if vhost.get("limits"):
            log.info("definitions: vhost limits ignored", vhost=vhost.get("name"))


def _vhost_of(item: dict[str, Any], vhost: str | None) -> str:
    name = vhost if vhost is not None else item.get("vhost")
    if not isinstance(name, str):
        raise DefinitionsError(f"{item.get('name', item)!r} names no vhost")
    return name


async def _import_users(store: AccessStore, data: dict[str, Any]) -> None:
    for user in _items(data, "users"):
        name = user.get("name")
        if not isinstance(name, str) or not name:
            raise DefinitionsError("a user without a name")
        await store.put_user(
            name,
            password=user.get("password"),
            password_hash=user.get("password_hash") if "password" not in user else None,
            hashing_algorithm=user.get("hashing_algorithm"),
            tags=user.get("tags"),
        )


async def _import_vhosts(broker: Broker, store: AccessStore, data: dict[str, Any]) -> None:
    for item in _items(data, "vhosts"):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise DefinitionsError("a vhost without a name")
        metadata: dict[str, Any] = item["metadata"] if isinstance(item.get("metadata"), dict) \
            else {}
        description = item.get("description", metadata.get("description", "")) or ""
        tags = admin.parse_tags(item.get("tags", metadata.get("tags")))
        # as RabbitMQ 4.3: from the metadata only; none (or null) is the server's
        queue_type = default_type.parse(metadata.get("default_queue_type"), broker.queue_kinds)
        await store.put_vhost(name, str(description), tags, default_queue_type=queue_type)
    for item in _items(data, "permissions"):
        user, vhost = item.get("user"), item.get("vhost")
        if user not in broker.users.users or vhost not in broker.vhosts:
            log.warning("definitions: permission for a missing user or vhost skipped",
                        user=user, vhost=vhost)
            continue
        await store.set_permissions(str(user), str(vhost), item.get("configure", ""),
                                    item.get("write", ""), item.get("read", ""))


def _need_vhost(broker: Broker, name: str) -> None:
    if name not in broker.vhosts:
        raise DefinitionsError(f'Please create virtual host "{name}" prior to importing '
                               "definitions.")


async def _import_topology(broker: Broker, store: AccessStore, data: dict[str, Any],
                           vhost: str | None) -> None:
    for item in _items(data, "exchanges"):
        name, vname = str(item.get("name", "")), _vhost_of(item, vhost)
        if not name or name.startswith("amq."):
            log.warning("definitions: predeclared or amq.* exchange skipped", exchange=name)
            continue
        if exchange_class(str(item.get("type", ""))) is None:
            log.warning("definitions: exchange of an unsupported type skipped", exchange=name,
                        vhost=vname, type=item.get("type"))
            continue
        _need_vhost(broker, vname)
        await store.declare_exchange(vname, name, item)
    for item in _items(data, "policies"):
        vname = _vhost_of(item, vhost)
        _need_vhost(broker, vname)
        await store.set_policy(vname, str(item.get("name", "")),
                               pattern=item.get("pattern"), definition=item.get("definition"),
                               priority=item.get("priority", 0),
                               apply_to=item.get("apply-to", "all"))
    for item in _items(data, "queues"):
        name, vname = str(item.get("name", "")), _vhost_of(item, vhost)
        arguments = item.get("arguments") or {}
        queue_type = arguments.get("x-queue-type", "classic") if isinstance(arguments, dict) \
            else "classic"
        if name.startswith("amq."):
            log.warning("definitions: amq.* queue skipped", queue=name)
            continue
        if queue_type not in SUPPORTED_QUEUE_TYPES:
            log.warning("definitions: queue of an unsupported type skipped", queue=name,
                        vhost=vname, queue_type=queue_type)
            continue
        _need_vhost(broker, vname)
        await store.declare_queue(vname, name, item)
    for item in _items(data, "bindings"):
        vname = _vhost_of(item, vhost)
        _need_vhost(broker, vname)
        kind = str(item.get("destination_type", "queue"))
        destination = str(item.get("destination", ""))
        target = broker.vhosts[vname].queues if kind == "queue" else broker.vhosts[vname].exchanges
        if destination not in target or str(item.get("source", "")) not in \
                broker.vhosts[vname].exchanges:
            log.warning("definitions: binding to a missing source or destination skipped",
                        source=item.get("source"), destination=destination, vhost=vname)
            continue
        await store.add_binding(vname, str(item.get("source", "")), kind, destination,
                                item.get("routing_key", ""), item.get("arguments"))


async def import_definitions(broker: Broker, data: Any, vhost: str | None = None) -> None:
    """Load a definitions document (the whole-broker form, or one vhost's with `vhost`).
    TopologyUnavailable passes through (the API answers 503)."""
    if not isinstance(data, dict):
        raise DefinitionsError("definitions must be a JSON object")
    store = access_store(broker)
    try:
        if vhost is None:
            _skip_unsupported(data)
            await _import_users(store, data)
            await _import_vhosts(broker, store, data)
        else:
            _need_vhost(broker, vhost)
        await _import_topology(broker, store, data, vhost)
    except TopologyUnavailable:
        raise
    except BrokerError as error:
        raise DefinitionsError(error.text) from None
    log.info("definitions imported", vhost=vhost,
             **{k: len(_items(data, k)) for k in ("users", "vhosts", "queues", "exchanges",
                                                   "bindings", "policies")})


async def load_file(broker: Broker, path: Path) -> None:
    """`leveret serve --definitions FILE`: load a file at boot; errors name the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DefinitionsError(f"definitions file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DefinitionsError(f"cannot read definitions file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise DefinitionsError(f"definitions file {path} is not valid JSON: {exc}") from None
    try:
        await import_definitions(broker, data)
    except TopologyUnavailable as exc:
        raise DefinitionsError(f"cannot load definitions file {path}: {exc.text}") from None
    except DefinitionsError as exc:
        raise DefinitionsError(f"cannot load definitions file {path}: {exc}") from None
