"""Users, password hashes and permissions (broker/access/auth.py), without sockets: hashes that
RabbitMQ exported log in here, a hash made here checks as RabbitMQ's scheme says, and a
permission matches a resource name as RabbitMQ's regular expressions do."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from leveret.broker.access.auth import (
    Permission,
    Users,
    check_password,
    from_loopback,
    hash_password,
)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "rabbitmq-3.10-definitions.json"


def exported_hash(user: str) -> str:
    """The hash RabbitMQ 3.10 stored for `user` (tests/fixtures/README.md says its password)."""
    users = json.loads(FIXTURE.read_text())["users"]
    found: str = next(u["password_hash"] for u in users if u["name"] == user)
    return found


@pytest.mark.parametrize(("user", "password"), [("alice", "alice-secret"),  # SHA-256
                                                ("bob", "bob-secret")])  # SHA-512
def test_a_hash_rabbitmq_exported_checks_its_password_only(user: str, password: str) -> None:
    stored = exported_hash(user)
    assert check_password(password, stored)
    assert not check_password(password + "!", stored)
    assert not check_password("", stored)


def test_a_hash_is_base64_of_the_salt_then_sha256_of_salt_and_password() -> None:
    salt = bytes.fromhex("908dc60a")
    made = hash_password("test12", salt)
    assert base64.b64decode(made) == salt + hashlib.sha256(salt + b"test12").digest()
    assert check_password("test12", made) and not check_password("test13", made)


def test_each_hash_gets_its_own_salt() -> None:
    first, second = hash_password("same"), hash_password("same")
    assert first != second
    assert check_password("same", first) and check_password("same", second)


def test_a_non_ascii_password_is_hashed_as_utf8() -> None:
    salt = b"\x00\x01\x02\x03"
    made = hash_password("mot-de-passé", salt)
    assert base64.b64decode(made)[4:] == hashlib.sha256(salt + "mot-de-passé".encode()).digest()
    assert check_password("mot-de-passé", made) and not check_password("mot-de-passe", made)


@pytest.mark.parametrize("stored", ["not base64!", "", "AAAA", base64.b64encode(b"salt").decode()])
def test_a_hash_that_is_not_one_never_checks(stored: str) -> None:
    assert not check_password("", stored)
    assert not check_password("anything", stored)


def test_users_log_in_with_their_own_password_only() -> None:
    users = Users()
    alice = users.add("alice", "a-pw", tags=["administrator"])
    assert users.authenticate("alice", "a-pw") is alice
    assert users.authenticate("alice", "b-pw") is None
    assert users.authenticate("nobody", "a-pw") is None
    assert alice.is_administrator and not users.add("bob", "b-pw").is_administrator


def test_a_user_without_a_hash_cannot_log_in_even_with_an_empty_password() -> None:
    users = Users()
    users.add("x", password_hash="")
    assert users.authenticate("x", "") is None


def test_replacing_a_user_keeps_its_permissions_and_changes_its_password() -> None:
    users = Users()
    users.add("app", "old", tags=["management"])
    users.set_permissions("app", "/", Permission("^app", "^app", "^app"))
    again = users.add("app", "new")
    assert again.permissions == {"/": Permission("^app", "^app", "^app")}
    assert users.authenticate("app", "new") is again
    assert users.authenticate("app", "old") is None


@pytest.mark.parametrize(("pattern", "name", "allowed"), [
    (".*", "anything", True),
    ("^app-", "app-q", True),
    ("^app-", "other-q", False),
    ("app", "my-app-queue", True),  # unanchored: a match anywhere in the name
    ("^app$", "app-q", False),
    ("", "", True),  # an empty pattern means "^$": nothing but the empty name
    ("", "q", False),
    ("(", "q", False),  # a broken pattern allows nothing
])
def test_a_permission_matches_as_rabbitmqs_regular_expressions(pattern: str, name: str,
                                                               allowed: bool) -> None:
    for kind in ("configure", "write", "read"):
        permission = Permission(".*", ".*", ".*")
        setattr(permission, kind, pattern)
        assert permission.allows(kind, name) is allowed, kind
        others = [k for k in ("configure", "write", "read") if k != kind]
        assert all(permission.allows(k, "q") for k in others)


def test_a_new_permission_allows_everything() -> None:
    permission = Permission()
    assert all(permission.allows(k, "any.name") for k in ("configure", "write", "read"))


@pytest.mark.parametrize(("host", "local"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
    ("::ffff:127.0.0.1", True), ("fe80::1%eth0", False), ("::1%lo", True),
    ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("example.com", False), ("", False),
])
def test_loopback_peers_as_rabbitmqs_loopback_users_rule(host: str, local: bool) -> None:
    assert from_loopback(host) is local
