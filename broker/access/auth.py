"""Users, password hashes, tags and per-vhost permissions, as RabbitMQ models them.

Password hashes use RabbitMQ's scheme (rabbit_password_hashing_sha256): base64 of a 4-byte
salt followed by SHA-256(salt + password), so hashes exported from RabbitMQ work here.
Permissions are three regular expressions per user and vhost (configure, write, read), matched
against the whole resource name as RabbitMQ does. No I/O; the metadata store persists these.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
from dataclasses import dataclass, field

HASHING_ALGORITHM = "rabbit_password_hashing_sha256"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def from_loopback(host: str) -> bool:
    """Whether a peer address is the local machine (RabbitMQ's loopback_users rule): a
    loopback IPv4 or IPv6 address, with or without a zone, or IPv4-mapped."""
    if host in LOOPBACK:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(password: str, password_hash: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (ValueError, TypeError):
        return False
    if len(raw) < 5:
        return False
    salt, digest = raw[:4], raw[4:]
    if len(digest) == hashlib.sha512().digest_size:
        candidate = hashlib.sha512(salt + password.encode("utf-8")).digest()
    elif len(digest) == hashlib.md5().digest_size:
        candidate = hashlib.md5(salt + password.encode("utf-8")).digest()
    else:
        candidate = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return hmac.compare_digest(candidate, digest)


@dataclass
class Permission:
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"

    def allows(self, kind: str, name: str) -> bool:
        """RabbitMQ's check: an unanchored search; an empty pattern means "^$"."""
        pattern = getattr(self, kind) or "^$"
        try:
            return re.search(pattern, name) is not None
        except re.error:
            return False


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    permissions: dict[str, Permission] = field(default_factory=dict)

    @property
    def is_administrator(self) -> bool:
        return "administrator" in self.tags


class Users:
    """The user table."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}

    def add(
        self,
        name: str,
        password: str | None = None,
        *,
        password_hash: str | None = None,
        tags: list[str] | None = None,
    ) -> User:
        if password_hash is None:
            password_hash = hash_password(password or "")
        user = User(name, password_hash, list(tags or []))
        existing = self.users.get(name)
        if existing is not None:
            user.permissions = existing.permissions
        self.users[name] = user
        return user

    def authenticate(self, name: str, password: str) -> User | None:
        user = self.users.get(name)
        if user is None or not user.password_hash:
            return None
        return user if check_password(password, user.password_hash) else None

    def set_permissions(self, name: str, vhost: str, permission: Permission) -> None:
        self.users[name].permissions[vhost] = permission
