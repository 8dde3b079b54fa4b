"""Applies the cluster's vhosts, users, permissions and policies from the topology cache to
this node, and creates the cluster's defaults on its first boot.

Role: in cluster mode etcd is the source of truth for access control (`docs/CLUSTER.md`,
"Access control in etcd"); every node's broker is a copy that the topology cache's callbacks
keep current, in revision order. A vhost put creates the vhost object here (with its policies
from the cache); a vhost deleted elsewhere closes this node's connections to it with 320, as
RabbitMQ does, and drops its queues. Users carry their password hashes and tags; permissions
and policies follow their records. A record that arrives before the user or vhost it names
(it cannot in one txn's order, but a reload may report them in any order) is applied when
that user or vhost arrives, from the cache. Nothing here writes to SQLite: the writes go
through `TopologyStore`, called by `broker/access/access_store.py`.

It must not know AMQP, the sessions' classes or the management API: the broker and its
connections are seen through the small protocols below. Callbacks run in the cache's task
on the node's one event loop and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import TYPE_CHECKING, Any, Protocol

from leveret.broker.access.auth import HASHING_ALGORITHM, Permission, Users, hash_password
from leveret.broker.cluster.etcd_types import Compare, Put, prefix_end
from leveret.broker.cluster.topology_records import (
    ExchangeRecord,
    PermissionRecord,
    PolicyRecord,
    Record,
    UserRecord,
    VHostRecord,
    encode,
)
from leveret.broker.model.policy import Policy
from leveret.broker.model.vhost import PREDECLARED, VHost
from leveret.broker.process import logs

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.process.config import Config

log = logs.get("leveret.cluster.access")


class Connection(Protocol):
    @property
    def vhost(self) -> VHost | None: ...

    def force_close(self, text: str = ...) -> None: ...


class Node(Protocol):
    """What of the broker this module touches."""

    @property
    def config(self) -> Config: ...

    @property
    def users(self) -> Users: ...

    @property
    def vhosts(self) -> dict[str, VHost]: ...

    @property
    def connections(self) -> Set[Any]: ...

    @property
    def cluster(self) -> ClusterRuntime | None: ...

    @property
    def default_queue_type(self) -> str: ...

    def add_vhost(self, name: str, persist: bool = True,
                  default_queue_type: str | None = None) -> VHost: ...


def install(broker: Node) -> None:
    """Register the cache callbacks that keep `broker`'s vhosts, users and policies current."""
    AccessSync(broker).install()


class AccessSync:
    def __init__(self, broker: Node) -> None:
        assert broker.cluster is not None
        self.broker = broker
        self.cache = broker.cluster.cache

    def install(self) -> None:
        cache = self.cache
        cache.on_put("vhosts", _guarded(self.put_vhost))
        cache.on_delete("vhosts", _guarded(self.delete_vhost))
        cache.on_put("users", _guarded(self.put_user))
        cache.on_delete("users", _guarded(self.delete_user))
        cache.on_put("permissions", _guarded(self.put_permission))
        cache.on_delete("permissions", _guarded(self.delete_permission))
        cache.on_put("policies", _guarded(self.put_policy))
        cache.on_delete("policies", _guarded(self.delete_policy))

    def put_vhost(self, record: Record) -> None:
        assert isinstance(record, VHostRecord)
        created = record.name not in self.broker.vhosts
        vhost = self.broker.add_vhost(record.name, persist=False,
                                      default_queue_type=record.default_queue_type or None)
        if not created:
            vhost.default_queue_type = (record.default_queue_type
                                        or self.broker.default_queue_type)
            return
        for policy in self.cache.all("policies"):
            if isinstance(policy, PolicyRecord) and policy.vhost == record.name:
                vhost.policies[policy.name] = _policy(policy)
        _policies_changed(vhost)
        for permission in self.cache.all("permissions"):
            if isinstance(permission, PermissionRecord) and permission.vhost == record.name:
                self.put_permission(permission)
        log.debug("vhost added", vhost=record.name)

    def delete_vhost(self, record: Record) -> None:
        assert isinstance(record, VHostRecord)
        drop_vhost(self.broker, record.name)

    def put_user(self, record: Record) -> None:
        assert isinstance(record, UserRecord)
        self.broker.users.add(record.name, password_hash=record.password_hash,
                              tags=list(record.tags))
        for permission in self.cache.all("permissions"):
            if isinstance(permission, PermissionRecord) and permission.user == record.name:
                self.put_permission(permission)

    def delete_user(self, record: Record) -> None:
        assert isinstance(record, UserRecord)
        self.broker.users.users.pop(record.name, None)

    def put_permission(self, record: Record) -> None:
        assert isinstance(record, PermissionRecord)
        user = self.broker.users.users.get(record.user)
        if user is not None and record.vhost in self.broker.vhosts:
            user.permissions[record.vhost] = Permission(record.configure, record.write,
                                                        record.read)

    def delete_permission(self, record: Record) -> None:
        assert isinstance(record, PermissionRecord)
        user = self.broker.users.users.get(record.user)
        if user is not None:
            user.permissions.pop(record.vhost, None)

    def put_policy(self, record: Record) -> None:
        assert isinstance(record, PolicyRecord)
        vhost = self.broker.vhosts.get(record.vhost)
        if vhost is not None:
            vhost.policies[record.name] = _policy(record)
            _policies_changed(vhost)

    def delete_policy(self, record: Record) -> None:
        assert isinstance(record, PolicyRecord)
        vhost = self.broker.vhosts.get(record.vhost)
        if vhost is not None and vhost.policies.pop(record.name, None) is not None:
            _policies_changed(vhost)


def drop_vhost(broker: Node, name: str) -> None:
    """A vhost deleted in the cluster: close this node's connections to it (320, as RabbitMQ),
    delete its queues here, forget its permissions."""
    vhost = broker.vhosts.pop(name, None)
    if vhost is None:
        return
    for session in list(broker.connections):
        if session.vhost is vhost:
            session.force_close(f"vhost '{name}' is deleted")
    for queue in list(vhost.queues.values()):
        try:
            vhost.delete_queue(queue)
        except Exception:
            log.exception("deleting a queue of a deleted vhost failed", vhost=name,
                          queue=queue.name)
    for user in broker.users.users.values():
        user.permissions.pop(name, None)
    log.info("vhost deleted: its connections here are closed", vhost=name)


def reconcile(broker: Node) -> None:
    """After the cache's first load: what this node holds that the cluster does not (a data
    directory that ran as a single node restores SQLite's users and vhosts) is dropped from
    the model, with a warning; a vhost's files stay on disk."""
    cluster = broker.cluster
    assert cluster is not None
    cache = cluster.cache
    users = {r.name for r in cache.all("users") if isinstance(r, UserRecord)}
    for name in [u for u in broker.users.users if u not in users]:
        log.warning("a user this node restored is not in the cluster: ignored", user=name)
        del broker.users.users[name]
    for name in [v for v in broker.vhosts if cache.vhost(v) is None]:
        log.warning("a vhost this node restored is not in the cluster: ignored (its files stay "
                    "on disk)", vhost=name)
        for queue in broker.vhosts.pop(name).queues.values():
            queue.close()
    wanted = {(r.user, r.vhost) for r in cache.all("permissions")
              if isinstance(r, PermissionRecord)}
    for user in broker.users.users.values():
        for gone in [v for v in user.permissions if (user.name, v) not in wanted]:
            del user.permissions[gone]
    policies = {(r.vhost, r.name) for r in cache.all("policies") if isinstance(r, PolicyRecord)}
    for model in broker.vhosts.values():
        for name in [p for p in model.policies if (model.name, p) not in policies]:
            del model.policies[name]


async def first_boot(broker: Node) -> int | None:
    """After the cache's first load (and `reconcile`): the cluster's first node creates the
    default vhost (with its `amq.*` exchanges), the default user and its permissions, in one
    txn that succeeds only while the cluster has no vhost at all: a second node starting, even
    at the same moment, neither duplicates nor overwrites them. The txn's revision if this node
    created them, else None."""
    cluster = broker.cluster
    assert cluster is not None
    reconcile(broker)
    config = broker.config
    keys = cluster.store.keys
    vhost = config.default_vhost
    ops = [Put(keys.vhost(vhost), encode(VHostRecord(vhost)))]
    ops += [Put(keys.exchange(vhost, name), encode(ExchangeRecord(vhost, name, type_)))
            for name, type_ in PREDECLARED if name]
    if config.default_user:
        user = UserRecord(config.default_user, hash_password(config.default_pass),
                          HASHING_ALGORITHM, ("administrator",))
        ops += [Put(keys.user(user.name), encode(user)),
                Put(keys.permission(user.name, vhost),
                    encode(PermissionRecord(user.name, vhost, ".*", ".*", ".*")))]
    vhosts = keys.kind_prefix("vhosts")
    result = await cluster.client.txn(
        [Compare(vhosts, "VERSION", "==", 0, prefix_end(vhosts))], ops, [])
    if not result.succeeded:
        return None
    log.info("created the cluster's default vhost and user", vhost=vhost,
             user=config.default_user)
    await cluster.settle(result.revision)
    return result.revision


def _policy(record: PolicyRecord) -> Policy:
    return Policy(record.name, record.pattern, dict(record.definition), record.apply_to,
                  record.priority)


def _policies_changed(vhost: VHost) -> None:
    """As VHost.set_policy tells its queues, without its observer (which records to SQLite:
    in cluster mode policies live in etcd)."""
    for queue in list(vhost.queues.values()):
        queue.policy_changed()


def _guarded(callback: Callable[[Record], None]) -> Callable[[Record], None]:
    def run(record: Record) -> None:
        try:
            callback(record)
        except Exception:
            log.exception("applying an access record failed", record=repr(record))

    return run
