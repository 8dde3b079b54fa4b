"""Permission checks per method, run against Leveret and the reference RabbitMQ: the same
reply codes and texts for the same users, permissions and operations."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from support.amqp import channel_error
from support.brokers import InProcessBroker

from leveret.broker.access.auth import Permission


@pytest.fixture(params=["leveret", "rabbitmq"])
def realm(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[int, Callable[..., None]]]:
    """(port, add_user(name, password, configure, write, read)) on one of the two brokers."""
    if request.param == "rabbitmq":
        ref = request.getfixturevalue("reference")
        created: list[str] = []

        def add_rabbit(name: str, password: str, *permission: str) -> None:
            ref.ctl("add_user", name, password)
            created.append(name)
            if permission:
                ref.ctl("set_permissions", "-p", "/", name, *permission)

        yield ref.port, add_rabbit
        for name in created:
            ref.ctl("delete_user", name)
        return
    server = InProcessBroker(tmp_path / "data").start()

    def add_leveret(name: str, password: str, *permission: str) -> None:
        def run() -> None:
            server.broker.add_user(name, password)
            if permission:
                server.broker.set_permissions(name, "/", Permission(*permission))
        server.call(run)

    yield server.port, add_leveret
    server.stop()


def connect_as(port: int, user: str, password: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, "/", pika.PlainCredentials(user, password)))


def test_each_method_checks_its_permission(realm: tuple[int, Callable[..., None]]) -> None:
    port, add_user = realm
    run = uuid.uuid4().hex[:8]
    app, other = f"app{run}", f"other{run}"
    admin = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ach = admin.channel()
    for queue in (f"{app}-q", f"{other}-q"):
        ach.queue_declare(queue, auto_delete=True)
    for exchange in (f"{app}-x", f"{other}-x"):
        ach.exchange_declare(exchange, "direct", auto_delete=True)
    ach.queue_bind(f"{app}-q", f"{app}-x", "keep")  # keeps the auto-delete exchange alive
    ach.queue_bind(f"{other}-q", f"{other}-x", "keep")
    user = f"u{run}"
    add_user(user, "pw", f"^{app}-", f"^{app}-", f"^{app}-")

    def refused(kind: str, name: str) -> tuple[int, str]:
        return 403, (f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for "
                     f"user '{user}'")

    cases: list[tuple[Callable[[Any], Any], tuple[int, str]]] = [
        (lambda ch: ch.queue_declare(f"{other}-new"), refused("queue", f"{other}-new")),
        (lambda ch: ch.exchange_declare(f"{other}-new", "fanout"),
         refused("exchange", f"{other}-new")),
        (lambda ch: ch.queue_delete(f"{other}-q"), refused("queue", f"{other}-q")),
        (lambda ch: ch.exchange_delete(f"{other}-x"), refused("exchange", f"{other}-x")),
        (lambda ch: ch.queue_purge(f"{other}-q"), refused("queue", f"{other}-q")),
        (lambda ch: ch.basic_get(f"{other}-q"), refused("queue", f"{other}-q")),
        (lambda ch: ch.basic_consume(f"{other}-q", lambda *a: None),
         refused("queue", f"{other}-q")),
        (lambda ch: ch.queue_bind(f"{other}-q", f"{app}-x", "k"), refused("queue", f"{other}-q")),
        (lambda ch: ch.queue_bind(f"{app}-q", f"{other}-x", "k"),
         refused("exchange", f"{other}-x")),
    ]
    conn = connect_as(port, user, "pw")
    for action, expected in cases:
        assert channel_error(lambda action=action: action(conn.channel())) == expected
    ch = conn.channel()
    ch.basic_publish(f"{other}-x", "k", b"x")
    assert channel_error(lambda: ch.queue_declare(f"{app}-q", passive=True)) == refused(
        "exchange", f"{other}-x")
    allowed = conn.channel()
    allowed.queue_declare(f"{app}-mine", auto_delete=True)
    allowed.queue_bind(f"{app}-mine", f"{app}-x", "k")
    conn.close()
    admin.close()


def test_no_permission_on_the_vhost_is_530(realm: tuple[int, Callable[..., None]]) -> None:
    port, add_user = realm
    user = f"np{uuid.uuid4().hex[:8]}"
    add_user(user, "pw")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect_as(port, user, "pw")
    assert f"(530) \"NOT_ALLOWED - access to vhost '/' refused for user '{user}'\"" in str(
        info.value)


def test_a_wrong_password_is_403(realm: tuple[int, Callable[..., None]]) -> None:
    port, add_user = realm
    user = f"pw{uuid.uuid4().hex[:8]}"
    add_user(user, "right", ".*", ".*", ".*")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect_as(port, user, "wrong")
    assert ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For "
            "details see the broker logfile.") in str(info.value)
