"""The exchange.* and queue.* methods of a channel: declare, bind, unbind, purge, delete.

Each handler checks the user's permissions, calls the vhost, and replies unless the method
says nowait. `HANDLERS` maps the pamqp method classes to them; `Channel.handle` dispatches
through it and maps domain errors to reply codes. Of consuming it knows only which
basic.cancel a queue.delete sends after its delete-ok; nothing of publishing or confirms.

Single-threaded: runs on the event loop thread of its connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands as m

from leveret.amqp import codec
from leveret.broker.model.errors import NotFound

if TYPE_CHECKING:
    from leveret.broker.model.consumer import Consumer
    from leveret.broker.model.queue import Queue
    from leveret.broker.session.channel import Channel


def strip_cr_lf(name: str) -> str:
    """RabbitMQ strips CR and LF from names in declarations."""
    return name.replace("\r", "").replace("\n", "") if ("\r" in name or "\n" in name) else name


def queue_name(channel: Channel, name: str) -> str:
    """An empty queue name means the last queue declared on this channel."""
    if name:
        return name
    if channel.last_queue is None:
        raise NotFound("no previously declared queue")
    return channel.last_queue


def _binding_permissions(channel: Channel, kind: str, destination: str, source: str) -> None:
    channel.check("write", kind, destination)
    if source and destination:
        channel.check("read", "exchange", source)


# -- exchanges --------------------------------------------------------------------------------


def exchange_declare(channel: Channel, method: Any) -> None:
    channel.vhost.declare_exchange(
        strip_cr_lf(method.exchange),
        method.exchange_type,
        passive=method.passive,
        durable=method.durable,
        auto_delete=method.auto_delete,
        internal=method.internal,
        arguments=method.arguments or {},
        check=channel.check,
    )
    if not method.nowait:
        channel.reply(m.Exchange.DeclareOk())


def exchange_delete(channel: Channel, method: Any) -> None:
    name = strip_cr_lf(method.exchange)
    if name and not name.startswith("amq."):
        channel.check("configure", "exchange", name)
    channel.vhost.delete_exchange(name, method.if_unused)
    if not method.nowait:
        channel.reply(m.Exchange.DeleteOk())


def exchange_bind(channel: Channel, method: Any) -> None:
    _binding_permissions(channel, "exchange", method.destination, method.source)
    channel.vhost.bind(method.source, "exchange", method.destination, method.routing_key,
                       method.arguments or {})
    if not method.nowait:
        channel.reply(m.Exchange.BindOk())


def exchange_unbind(channel: Channel, method: Any) -> None:
    _binding_permissions(channel, "exchange", method.destination, method.source)
    channel.vhost.unbind(method.source, "exchange", method.destination, method.routing_key,
                         method.arguments or {})
    if not method.nowait:
        channel.reply(m.Exchange.UnbindOk())


# -- queues -----------------------------------------------------------------------------------


def queue_declare(channel: Channel, method: Any) -> None:
    # Unlike bind, purge, delete, consume and get, declare does not read an empty name as
    # the last declared queue: a passive declare of "" is 404 "no queue ''" in RabbitMQ.
    queue = channel.vhost.declare_queue(
        strip_cr_lf(method.queue),
        owner=channel.session,
        passive=method.passive,
        durable=method.durable,
        exclusive=method.exclusive,
        auto_delete=method.auto_delete,
        arguments=method.arguments or {},
        check=channel.check,
    )
    channel.last_queue = queue.name
    if not method.nowait:
        channel.session.write(codec.encode_declare_ok(
            channel.number, queue.name, queue.message_count, queue.consumer_count))


def queue_bind(channel: Channel, method: Any) -> None:
    queue = queue_name(channel, strip_cr_lf(method.queue))
    key = method.routing_key
    if not method.queue and not key:
        key = queue
    _binding_permissions(channel, "queue", queue, method.exchange)
    channel.vhost.bind(method.exchange, "queue", queue, key, method.arguments or {},
                       owner=channel.session)
    if not method.nowait:
        channel.reply(m.Queue.BindOk())


def queue_unbind(channel: Channel, method: Any) -> None:
    queue = queue_name(channel, strip_cr_lf(method.queue))
    _binding_permissions(channel, "queue", queue, method.exchange)
    channel.vhost.unbind(method.exchange, "queue", queue, method.routing_key,
                         method.arguments or {}, owner=channel.session)
    channel.reply(m.Queue.UnbindOk())


def queue_purge(channel: Channel, method: Any) -> None:
    name = queue_name(channel, strip_cr_lf(method.queue))
    channel.check("read", "queue", name)
    queue = channel.vhost.queue(name)
    channel.vhost.check_exclusive(queue, channel.session)
    count = queue.purge()
    if not method.nowait:
        channel.reply(m.Queue.PurgeOk(message_count=count))


def queue_delete(channel: Channel, method: Any) -> None:
    name = queue_name(channel, strip_cr_lf(method.queue))
    channel.check("configure", "queue", name)
    queue = channel.vhost.queues.get(name)
    count = 0
    later: list[tuple[Channel, Consumer]] = []
    if queue is not None:
        channel.vhost.check_exclusive(queue, channel.session)
        queue.check_delete(method.if_unused, method.if_empty)
        later = _cancels_after_reply(channel, queue)
        count = channel.vhost.delete_queue(queue)
    if not method.nowait:
        channel.reply(m.Queue.DeleteOk(message_count=count))
    for owner, consumer in later:
        owner.notify_cancel(consumer)


def _cancels_after_reply(channel: Channel, queue: Queue) -> list[tuple[Channel, Consumer]]:
    """Take out of their channels the consumers whose basic.cancel must follow delete-ok.

    RabbitMQ's deleting channel hears that the queue is gone only once it has replied, so
    the cancels of its own consumers follow its delete-ok. The other channels of a classic
    queue hear of it at the same moment (usually before that delete-ok: a race, in RabbitMQ),
    and are cancelled at once by the queue; a stream's consumers hear of it later, from the
    stream coordinator, so on this connection all of them follow delete-ok.
    """
    owners = channel.session.channels.values() if queue.type == "stream" else (channel,)
    later = []
    for owner in owners:
        for consumer in [c for c in owner.consumers.values() if c.queue is queue]:
            del owner.consumers[consumer.tag]  # so the queue's own server_cancel skips it
            later.append((owner, consumer))
    return later


HANDLERS: dict[type, Callable[[Channel, Any], None]] = {
    m.Exchange.Declare: exchange_declare,
    m.Exchange.Delete: exchange_delete,
    m.Exchange.Bind: exchange_bind,
    m.Exchange.Unbind: exchange_unbind,
    m.Queue.Declare: queue_declare,
    m.Queue.Bind: queue_bind,
    m.Queue.Unbind: queue_unbind,
    m.Queue.Purge: queue_purge,
    m.Queue.Delete: queue_delete,
}
