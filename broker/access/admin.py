"""Administrative operations: what the management API and definitions import both do.

Vhosts, users, permissions and policies, and exchanges, queues and bindings declared from a
dict rather than a channel. Each operation validates its input with RabbitMQ's texts, calls the
model, and persists through the metadata store as Broker does (the vhosts' observer records
durable exchanges, queues, bindings and policies by itself). Operations that create or update
return True when the object is new, so the API can answer 201 or 204.

Errors: the model's domain errors (NotFound, PreconditionFailed, AccessRefused, ...) pass
through; input that RabbitMQ answers with 400 raises BadRequest.

Single-threaded: called on the broker's event loop thread only; no locks.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import TYPE_CHECKING, Any

from leveret.broker.access.auth import Permission, User, hash_password
from leveret.broker.model import args as qargs
from leveret.broker.model import delayed_retry
from leveret.broker.model.errors import AccessRefused, BrokerError, NotFound
from leveret.broker.model.policy import APPLY_TO, Policy
from leveret.broker.model.vhost import Authorize, VHost, allow_all
from leveret.broker.process import logs

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

log = logs.get("leveret.admin")

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
HASHING_ALGORITHMS = (SHA256, SHA512, MD5)
MANAGEMENT_TAGS = ("administrator", "monitoring", "policymaker", "management")


class BadRequest(BrokerError):
    """Input the management API refuses with 400 (RabbitMQ's `bad_request`)."""


# -- small parsers --------------------------------------------------------------------------


def parse_tags(tags: object) -> list[str]:
    """Tags as RabbitMQ takes them: "a,b" or ["a", "b"]; empty strings dropped."""
    if tags is None:
        return []
    if isinstance(tags, str):
        items = tags.split(",")
    elif isinstance(tags, list):
        items = [str(t) for t in tags]
    else:
        raise BadRequest(f"tags must be a string or a list, not {tags!r}")
    return [t.strip() for t in items if t.strip()]


def parse_bool(value: object, default: bool = False) -> bool:
    """A JSON boolean, or the strings "true"/"false" that rabbitmqadmin sends."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadRequest(f"{value!r} is not a boolean")


def parse_arguments(value: object) -> dict[str, Any]:
    """An arguments object from JSON; nulls are dropped (AMQP has no use for them here)."""
    if value is None or value == "":
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"arguments must be an object, not {value!r}")
    return {str(k): v for k, v in value.items() if v is not None}


def algorithm_of(password_hash: str) -> str:
    """Which of RabbitMQ's salted schemes a stored hash uses, from its length."""
    try:
        size = len(base64.b64decode(password_hash, validate=True)) - 4
    except (binascii.Error, ValueError):
        return SHA256
    return {64: SHA512, 16: MD5}.get(size, SHA256)


# -- vhosts -----------------------------------------------------------------------------------


def vhost_metadata(broker: Broker) -> dict[str, tuple[str, list[str]]]:
    """Every vhost's description and tags, as kept in the metadata store (its default queue
    type is the model's: VHost.default_queue_type)."""
    return {
        row["name"]: (row["description"], json.loads(row["tags"]))
        for row in broker.metastore.rows("vhosts")
    }


def get_vhost(broker: Broker, name: str) -> VHost:
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise NotFound(f"no vhost '{name}'")
    return vhost


def add_vhost(
    broker: Broker,
    name: str,
    description: str = "",
    tags: list[str] | None = None,
    acting_user: str | None = None,
    default_queue_type: str | None = None,
) -> bool:
    """Create (or update the metadata of) a vhost. As RabbitMQ's put_vhost, a new vhost gives
    the user who created it full permissions on it (not at boot, where there is no user).
    `default_queue_type` (default_type.parse's) replaces the vhost's; None gives it the
    server's, as RabbitMQ 4.3 does on a create and on an update alike."""
    if not name:
        raise BadRequest("vhost names cannot be empty")
    created = name not in broker.vhosts
    vhost = broker.add_vhost(name, persist=False)
    queue_type = default_queue_type or broker.default_queue_type
    broker.metastore.put_vhost(name, description or "", list(tags or []), queue_type)
    vhost.default_queue_type = queue_type
    if created and acting_user is not None and acting_user in broker.users.users:
        broker.set_permissions(acting_user, name, Permission())
    if created:
        log.info("vhost created", vhost=name)
    return created


def delete_vhost(broker: Broker, name: str) -> None:
    """Close its connections, delete its queues (and their files), forget its permissions."""
    vhost = get_vhost(broker, name)
    for session in list(broker.connections):
        if session.vhost is vhost:
            session.force_close(f"vhost '{name}' is deleted")
    for queue in list(vhost.queues.values()):
        vhost.delete_queue(queue)
    for exchange in list(vhost.exchanges.values()):
        if exchange.name and not exchange.name.startswith("amq."):
            vhost.delete_exchange(exchange.name)
    del broker.vhosts[name]
    for user in broker.users.users.values():
        user.permissions.pop(name, None)
    broker.metastore.delete_vhost(name)
    log.info("vhost deleted", vhost=name)


# -- users and permissions --------------------------------------------------------------------


def get_user(broker: Broker, name: str) -> User:
    user = broker.users.users.get(name)
    if user is None:
        raise NotFound(f"no user '{name}'")
    return user


def put_user(
    broker: Broker,
    name: str,
    *,
    password: str | None = None,
    password_hash: str | None = None,
    hashing_algorithm: str | None = None,
    tags: object = None,
) -> bool:
    """Create or replace a user. Without a password or a hash, a new user gets none (it cannot
    log in with a password) and an existing one keeps its own, as RabbitMQ does."""
    existing = broker.users.users.get(name)
    new_hash = user_password_hash(existing, name, password, password_hash, hashing_algorithm)
    user = broker.users.add(name, password_hash=new_hash, tags=parse_tags(tags))
    algorithm = algorithm_of(user.password_hash) if user.password_hash else SHA256
    broker.metastore.put_user(name, user.password_hash, algorithm, user.tags)
    return existing is None


def user_password_hash(existing: User | None, name: str, password: str | None,
                       password_hash: str | None, hashing_algorithm: str | None) -> str:
    """put_user's checks, and the hash the user ends with: of `password`, `password_hash`, or
    the existing user's own ("" for a new user given neither)."""
    if not name:
        raise BadRequest("user names cannot be empty")
    if password is not None and password_hash is not None:
        raise BadRequest("only one of password or password_hash can be specified")
    if hashing_algorithm is not None and hashing_algorithm not in HASHING_ALGORITHMS:
        raise BadRequest(f"unknown hashing algorithm '{hashing_algorithm}'")
    if password is not None:
        return hash_password(password)
    if password_hash is None:
        return existing.password_hash if existing is not None else ""
    if password_hash:
        try:
            base64.b64decode(password_hash, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"password_hash of user '{name}' is not base64") from None
    return password_hash


def delete_user(broker: Broker, name: str) -> None:
    get_user(broker, name)
    del broker.users.users[name]
    broker.metastore.delete_user(name)


def _check_regex(kind: str, pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise BadRequest(
            f"Validation failed\n\n{kind} should be regular expression but is invalid: {exc}\n"
        ) from None


def check_permissions(broker: Broker, user: str, vhost: str, configure: object, write: object,
                      read: object) -> Permission:
    """set_permissions' checks: the user and vhost exist, and each pattern is a regex; the
    permission the patterns make."""
    if user not in broker.users.users or vhost not in broker.vhosts:
        raise BadRequest("vhost_or_user_not_found")
    patterns: list[str] = []
    for kind, pattern in (("configure", configure), ("write", write), ("read", read)):
        if not isinstance(pattern, str):
            raise BadRequest(f"{kind} must be a string")
        _check_regex(kind, pattern)
        patterns.append(pattern)
    return Permission(*patterns)


def set_permissions(
    broker: Broker, user: str, vhost: str, configure: object, write: object, read: object
) -> bool:
    permission = check_permissions(broker, user, vhost, configure, write, read)
    created = vhost not in broker.users.users[user].permissions
    broker.set_permissions(user, vhost, permission)
    return created


def clear_permissions(broker: Broker, user: str, vhost: str) -> None:
    found = broker.users.users.get(user)
    if found is None or vhost not in found.permissions:
        raise NotFound(f"no permissions for user '{user}' in vhost '{vhost}'")
    del found.permissions[vhost]
    broker.metastore.delete_permission(user, vhost)


def authorizer(user: User | None, vhost: str) -> Authorize:
    """The model's permission check for an API user on one vhost (allow_all for no user)."""
    if user is None:
        return allow_all
    permission = user.permissions.get(vhost)

    def check(kind: str, resource_kind: str, name: str) -> None:
        if permission is None or not permission.allows(kind, name):
            raise AccessRefused(
                f"access to {resource_kind} '{name}' in vhost '{vhost}' refused for user "
                f"'{user.name}'"
            )

    return check


# -- policies ---------------------------------------------------------------------------------


def _check_policy_definition(definition: dict[str, Any]) -> None:
    max_age = definition.get("max-age")
    if max_age is not None and (
        not isinstance(max_age, str) or qargs.parse_max_age(max_age) is None
    ):
        raise BadRequest(f"Validation failed\n\n{max_age!r} is not a valid max-age\n")
    for key in ("max-length-bytes", "max-length", "message-ttl", "expires",
                "stream-max-segment-size-bytes"):
        value = definition.get(key)
        if value is not None and (not qargs.is_int(value) or value < 0):
            raise BadRequest(f"Validation failed\n\n{key} must be a non-negative integer\n")
    error = delayed_retry.policy_errors(definition)
    if error is not None:
        raise BadRequest(f"Validation failed\n\n{error}\n")


def set_policy(
    broker: Broker,
    vhost_name: str,
    name: str,
    *,
    pattern: object,
    definition: object,
    priority: object = 0,
    apply_to: object = "all",
) -> bool:
    vhost = get_vhost(broker, vhost_name)
    policy = make_policy(name, pattern=pattern, definition=definition, priority=priority,
                         apply_to=apply_to)
    created = name not in vhost.policies
    vhost.set_policy(policy)
    return created


def make_policy(name: str, *, pattern: object, definition: object, priority: object = 0,
                apply_to: object = "all") -> Policy:
    """set_policy's checks, with RabbitMQ's texts; the policy they give."""
    if not isinstance(pattern, str):
        raise BadRequest("Validation failed\n\npattern must be a string\n")
    _check_regex("pattern", pattern)
    if not isinstance(definition, dict) or not definition:
        raise BadRequest("Validation failed\n\nno policy provided\n")
    apply_to = apply_to or "all"
    if apply_to not in APPLY_TO:
        raise BadRequest(
            f"Validation failed\n\n'{apply_to}' is not a valid apply-to value; use one of "
            f"{', '.join(APPLY_TO)}\n"
        )
    number = _priority(priority)
    _check_policy_definition(definition)
    return Policy(name, pattern, dict(definition), apply_to, number)


def _priority(value: object) -> int:
    """A policy's priority: a number or a string of one (a missing or empty one is 0)."""
    text = f"Validation failed\n\npriority must be a number, not {value!r}\n"
    if not value:
        return 0
    if not isinstance(value, str | int | float):
        raise BadRequest(text)
    try:
        return int(value)
    except ValueError:
        raise BadRequest(text) from None


def clear_policy(broker: Broker, vhost_name: str, name: str) -> None:
    if not get_vhost(broker, vhost_name).clear_policy(name):
        raise NotFound(f"no policy '{name}' in vhost '{vhost_name}'")


# -- exchanges, queues, bindings --------------------------------------------------------------


def delete_exchange(
    broker: Broker, vhost_name: str, name: str, if_unused: bool = False,
    check: Authorize = allow_all,
) -> None:
    vhost = get_vhost(broker, vhost_name)
    vhost.exchange(name)
    check("configure", "exchange", name)
    vhost.delete_exchange(name, if_unused=if_unused)


def purge_queue(
    broker: Broker, vhost_name: str, name: str, check: Authorize = allow_all
) -> int:
    queue = get_vhost(broker, vhost_name).queue(name)
    check("read", "queue", name)
    return queue.purge()


def add_binding(
    broker: Broker,
    vhost_name: str,
    source: str,
    destination_type: str,
    destination: str,
    routing_key: object = "",
    arguments: object = None,
    check: Authorize = allow_all,
) -> None:
    vhost = get_vhost(broker, vhost_name)
    if destination_type not in ("queue", "exchange"):
        raise BadRequest(f"unknown destination type '{destination_type}'")
    if not isinstance(routing_key, str):
        raise BadRequest("routing_key must be a string")
    if source:
        vhost.exchange(source)
    if destination_type == "queue":
        vhost.queue(destination)
    else:
        vhost.exchange(destination)
    check("write", destination_type, destination)
    check("read", "exchange", source)
    vhost.bind(source, destination_type, destination, routing_key, parse_arguments(arguments))
