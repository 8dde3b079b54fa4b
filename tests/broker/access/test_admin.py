"""Administrative operations (broker/access/admin.py), without sockets: the input parsers, the
checks the management API and definitions share with RabbitMQ's texts, and what a vhost,
user or permission change leaves in the model and the metadata store."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from leveret.broker.access import admin
from leveret.broker.access.admin import BadRequest
from leveret.broker.access.auth import Permission
from leveret.broker.broker import Broker
from leveret.broker.model.errors import AccessRefused, NotFound


def bad_request(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(BadRequest) as raised:
        call(*args, **kwargs)
    return raised.value.text


# -- the parsers ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("tags", "parsed"), [
    (None, []), ("", []), ("administrator", ["administrator"]),
    ("administrator, management,", ["administrator", "management"]),
    (["monitoring", " ", "policymaker"], ["monitoring", "policymaker"]),
])
def test_tags_as_a_string_or_a_list(tags: object, parsed: list[str]) -> None:
    assert admin.parse_tags(tags) == parsed


def test_tags_of_another_shape_are_a_bad_request() -> None:
    assert bad_request(admin.parse_tags, 3) == "tags must be a string or a list, not 3"


@pytest.mark.parametrize(("value", "parsed"), [
    (None, False), (True, True), (False, False), ("true", True), ("False", False)])
def test_booleans_as_json_or_as_rabbitmqadmin_sends_them(value: object, parsed: bool) -> None:
    assert admin.parse_bool(value) is parsed


def test_a_missing_boolean_takes_its_default_and_others_are_refused() -> None:
    assert admin.parse_bool(None, True) is True
    assert bad_request(admin.parse_bool, "yes") == "'yes' is not a boolean"
    assert bad_request(admin.parse_bool, 1) == "1 is not a boolean"


def test_arguments_drop_nulls_and_must_be_an_object() -> None:
    assert admin.parse_arguments(None) == admin.parse_arguments("") == {}
    assert admin.parse_arguments({"x-max-length": 5, "x-dead-letter-exchange": None}) == {
        "x-max-length": 5}
    assert bad_request(admin.parse_arguments, [1]) == "arguments must be an object, not [1]"


def salted(algorithm: Any, password: bytes) -> str:
    salt = b"\x01\x02\x03\x04"
    return base64.b64encode(salt + algorithm(salt + password).digest()).decode()


def test_the_hashing_algorithm_is_read_from_the_hash() -> None:
    assert admin.algorithm_of(salted(hashlib.sha256, b"pw")) == admin.SHA256
    assert admin.algorithm_of(salted(hashlib.sha512, b"pw")) == admin.SHA512
    assert admin.algorithm_of(salted(hashlib.md5, b"pw")) == admin.MD5
    assert admin.algorithm_of("not base64!") == admin.SHA256


# -- users ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "text"), [
    (("", "pw", None, None), "user names cannot be empty"),
    (("u", "pw", "aGFzaA==", None), "only one of password or password_hash can be specified"),
    (("u", None, "aGFzaA==", "rabbit_password_hashing_md4"),
     "unknown hashing algorithm 'rabbit_password_hashing_md4'"),
    (("u", None, "not base64!", None), "password_hash of user 'u' is not base64"),
])
def test_put_user_refuses_with_the_apis_texts(args: tuple[Any, ...], text: str) -> None:
    assert bad_request(admin.user_password_hash, None, *args) == text


async def test_a_user_logs_in_with_a_password_or_a_hash_and_is_stored(
        local_broker: Broker) -> None:
    assert admin.put_user(local_broker, "alice", password="a-pw", tags="administrator")
    bob_hash = salted(hashlib.sha512, b"b-pw")
    assert admin.put_user(local_broker, "bob", password_hash=bob_hash,
                          hashing_algorithm=admin.SHA512)
    users = local_broker.users
    assert users.authenticate("alice", "a-pw") is not None
    assert users.authenticate("bob", "b-pw") is not None
    rows = {r["name"]: r for r in local_broker.metastore.rows("users")}
    assert rows["bob"]["hashing_algorithm"] == admin.SHA512
    assert rows["alice"]["hashing_algorithm"] == admin.SHA256


async def test_updating_a_users_tags_keeps_its_password(local_broker: Broker) -> None:
    admin.put_user(local_broker, "alice", password="a-pw", tags="administrator")
    assert not admin.put_user(local_broker, "alice", tags=["management"])  # not new: 204
    alice = local_broker.users.authenticate("alice", "a-pw")
    assert alice is not None and alice.tags == ["management"]


async def test_a_new_user_given_no_password_cannot_log_in(local_broker: Broker) -> None:
    admin.put_user(local_broker, "x", tags="monitoring")
    assert local_broker.users.authenticate("x", "") is None


async def test_deleting_a_user_forgets_its_permissions(local_broker: Broker) -> None:
    admin.put_user(local_broker, "app", password="pw")
    admin.set_permissions(local_broker, "app", "/", ".*", ".*", ".*")
    admin.delete_user(local_broker, "app")
    assert "app" not in local_broker.users.users
    assert [r["user"] for r in local_broker.metastore.rows("permissions")] == ["guest"]
    with pytest.raises(NotFound) as raised:
        admin.delete_user(local_broker, "app")
    assert raised.value.text == "no user 'app'"


# -- permissions ----------------------------------------------------------------------------------

async def test_permissions_need_an_existing_user_and_vhost(local_broker: Broker) -> None:
    assert bad_request(admin.set_permissions, local_broker, "ghost", "/", ".*", ".*", ".*") == (
        "vhost_or_user_not_found")
    assert bad_request(admin.set_permissions, local_broker, "guest", "nohost", ".*", ".*",
                       ".*") == "vhost_or_user_not_found"


async def test_each_permission_pattern_must_be_a_regular_expression(local_broker: Broker) -> None:
    text = bad_request(admin.set_permissions, local_broker, "guest", "/", ".*", "(", ".*")
    assert text.startswith("Validation failed\n\nwrite should be regular expression but is "
                           "invalid: ")
    assert bad_request(admin.set_permissions, local_broker, "guest", "/", 1, ".*", ".*") == (
        "configure must be a string")
    assert local_broker.users.users["guest"].permissions["/"] == Permission()


async def test_setting_then_clearing_a_permission(local_broker: Broker) -> None:
    admin.put_user(local_broker, "app", password="pw")
    assert admin.set_permissions(local_broker, "app", "/", "", "^in", "^out")  # 201
    assert not admin.set_permissions(local_broker, "app", "/", "", "^in", ".*")  # 204
    assert local_broker.users.users["app"].permissions["/"] == Permission("", "^in", ".*")
    admin.clear_permissions(local_broker, "app", "/")
    assert "/" not in local_broker.users.users["app"].permissions
    with pytest.raises(NotFound) as raised:
        admin.clear_permissions(local_broker, "app", "/")
    assert raised.value.text == "no permissions for user 'app' in vhost '/'"


async def test_an_api_user_is_refused_with_the_amqp_text(local_broker: Broker) -> None:
    admin.put_user(local_broker, "app", password="pw")
    admin.set_permissions(local_broker, "app", "/", "^app-", ".*", ".*")
    app = local_broker.users.users["app"]
    check = admin.authorizer(app, "/")
    check("configure", "queue", "app-q")
    with pytest.raises(AccessRefused) as raised:
        check("configure", "queue", "other-q")
    assert raised.value.text == ("access to queue 'other-q' in vhost '/' refused for user 'app'")
    with pytest.raises(AccessRefused):  # no permission on a vhost: nothing there
        admin.authorizer(app, "other")("read", "queue", "q")
    admin.authorizer(None, "/")("configure", "queue", "anything")  # no user: the broker itself


# -- vhosts ---------------------------------------------------------------------------------------

async def test_a_new_vhost_gives_its_creator_full_permissions(local_broker: Broker) -> None:
    assert admin.add_vhost(local_broker, "billing", "Billing", ["eu"], acting_user="guest")
    assert local_broker.users.users["guest"].permissions["billing"] == Permission()
    assert not admin.add_vhost(local_broker, "billing", "Billing v2")  # an update: 204
    assert admin.vhost_metadata(local_broker)["billing"] == ("Billing v2", [])
    assert bad_request(admin.add_vhost, local_broker, "") == "vhost names cannot be empty"


async def test_deleting_a_vhost_deletes_its_queues_and_forgets_its_permissions(
        local_broker: Broker) -> None:
    admin.add_vhost(local_broker, "billing", acting_user="guest")
    vhost = local_broker.vhosts["billing"]
    vhost.declare_queue("ledger", owner=None, durable=True)
    vhost.declare_exchange("invoices", "direct", durable=True)
    admin.delete_vhost(local_broker, "billing")
    assert "billing" not in local_broker.vhosts
    assert "billing" not in local_broker.users.users["guest"].permissions
    for table in ("vhosts", "queues", "exchanges", "permissions"):
        assert "billing" not in {r["vhost" if table != "vhosts" else "name"]
                                 for r in local_broker.metastore.rows(table)}, table
    with pytest.raises(NotFound) as raised:
        admin.delete_vhost(local_broker, "billing")
    assert raised.value.text == "no vhost 'billing'"


# -- policies -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "text"), [
    ({"pattern": 1, "definition": {"max-age": "1D"}}, "pattern must be a string"),
    ({"pattern": ".*", "definition": {}}, "no policy provided"),
    ({"pattern": ".*", "definition": "max-age"}, "no policy provided"),
    ({"pattern": ".*", "definition": {"max-age": "zz"}}, "'zz' is not a valid max-age"),
    ({"pattern": ".*", "definition": {"max-length": -1}},
     "max-length must be a non-negative integer"),
    ({"pattern": ".*", "definition": {"message-ttl": "5"}},
     "message-ttl must be a non-negative integer"),
    ({"pattern": ".*", "definition": {"max-age": "1D"}, "priority": "high"},
     "priority must be a number, not 'high'"),
])
def test_a_policy_is_refused_with_rabbitmqs_validation_texts(body: dict[str, Any],
                                                             text: str) -> None:
    assert bad_request(admin.make_policy, "p", **body) == f"Validation failed\n\n{text}\n"


def test_an_unknown_apply_to_is_refused_with_the_values_that_are_taken() -> None:
    text = bad_request(admin.make_policy, "p", pattern=".*", definition={"max-age": "1D"},
                       apply_to="nope")
    prefix = "Validation failed\n\n'nope' is not a valid apply-to value; use one of "
    assert text.startswith(prefix) and text.endswith("\n")
    listed = text[len(prefix):-1].split(", ")
    assert {"all", "queues", "exchanges", "streams"} <= set(listed)
    for value in listed:  # each value the text offers is taken
        assert admin.make_policy("p", pattern=".*", definition={"x": 1},
                                 apply_to=value).apply_to == value


def test_a_policys_pattern_must_be_a_regular_expression() -> None:
    assert bad_request(admin.make_policy, "p", pattern="(", definition={"max-age": "1D"}
                       ).startswith("Validation failed\n\npattern should be regular expression")


def test_a_policy_takes_its_priority_as_a_number_or_a_string_of_one() -> None:
    made = admin.make_policy("p", pattern="^q", definition={"max-length": 5}, priority="7",
                             apply_to="queues")
    assert (made.name, made.pattern, made.definition, made.apply_to, made.priority) == (
        "p", "^q", {"max-length": 5}, "queues", 7)
    assert admin.make_policy("p", pattern=".*", definition={"x": 1}, priority="",
                             apply_to="").priority == 0


async def test_a_policy_applies_to_its_queues_and_is_stored(local_broker: Broker) -> None:
    vhost = local_broker.vhosts["/"]
    vhost.declare_queue("jobs", owner=None, durable=True)
    assert admin.set_policy(local_broker, "/", "cap", pattern="^jobs$",
                            definition={"max-length": 5}, apply_to="queues")
    assert not admin.set_policy(local_broker, "/", "cap", pattern="^jobs$",
                                definition={"max-length": 6}, apply_to="queues")
    applied = vhost.policy_for("queues", "jobs")  # what the API shows as the queue's policy
    assert applied is not None and applied.definition == {"max-length": 6}
    assert vhost.policy_for("exchanges", "jobs") is None
    assert [(r["name"], r["apply_to"]) for r in local_broker.metastore.rows("policies")] == [
        ("cap", "queues")]
    admin.clear_policy(local_broker, "/", "cap")
    assert vhost.policy_for("queues", "jobs") is None
    assert not local_broker.metastore.rows("policies")
    with pytest.raises(NotFound) as raised:
        admin.clear_policy(local_broker, "/", "cap")
    assert raised.value.text == "no policy 'cap' in vhost '/'"


# -- bindings -------------------------------------------------------------------------------------

async def test_a_binding_checks_its_input_then_both_ends(local_broker: Broker) -> None:
    vhost = local_broker.vhosts["/"]
    vhost.declare_exchange("x", "direct")
    vhost.declare_queue("q", owner=None)
    assert bad_request(admin.add_binding, local_broker, "/", "x", "topic", "q") == (
        "unknown destination type 'topic'")
    assert bad_request(admin.add_binding, local_broker, "/", "x", "queue", "q", 5) == (
        "routing_key must be a string")
    with pytest.raises(NotFound) as raised:
        admin.add_binding(local_broker, "/", "x", "queue", "missing")
    assert raised.value.text == "no queue 'missing' in vhost '/'"
    admin.add_binding(local_broker, "/", "x", "queue", "q", "k", {"a": 1, "b": None})
    (binding,) = vhost.exchanges["x"].bindings.values()
    assert (binding.routing_key, binding.arguments) == ("k", {"a": 1})
