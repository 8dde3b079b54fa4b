"""Real client libraries against a real Leveret: pika, aio-pika and kombu, unchanged."""

from __future__ import annotations

import aio_pika
import kombu
import pika
import pytest
from support.brokers import InProcessBroker


def test_pika_publish_get_consume_and_confirm(broker: InProcessBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish(
        "", queue, b"hello", pika.BasicProperties(content_type="text/plain", headers={"k": "v"})
    )
    method, props, body = ch.basic_get(queue, auto_ack=True)
    assert body == b"hello"
    assert props.content_type == "text/plain"
    assert props.headers == {"k": "v"}
    ch.basic_publish("", queue, b"second")
    for method, _props, body in ch.consume(queue, inactivity_timeout=5):
        assert body == b"second"
        ch.basic_ack(method.delivery_tag)
        break
    ch.cancel()
    conn.close()


async def test_aio_pika_round_trip(broker: InProcessBroker) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange("logs", aio_pika.ExchangeType.TOPIC)
        queue = await channel.declare_queue("", exclusive=True)
        await queue.bind(exchange, "app.*.error")
        await exchange.publish(aio_pika.Message(b"boom", message_id="1"), "app.web.error")
        await exchange.publish(aio_pika.Message(b"skip"), "app.web.info")
        async with queue.iterator() as it:
            async for message in it:
                async with message.process():
                    assert message.body == b"boom"
                    assert message.message_id == "1"
                    assert message.routing_key == "app.web.error"
                break
        passive = await channel.declare_queue(queue.name, passive=True)
        assert passive.declaration_result.message_count == 0


def test_kombu_simple_queue(broker: InProcessBroker) -> None:
    with kombu.Connection(broker.url) as conn:
        q = conn.SimpleQueue("kombu-simple")
        q.put({"hello": "world"})
        message = q.get(block=True, timeout=5)
        assert message.payload == {"hello": "world"}
        message.ack()
        q.close()


def test_kombu_celery_style_task_round_trip(broker: InProcessBroker) -> None:
    """What celery does: a direct exchange, a durable queue, a JSON task with headers."""
    exchange = kombu.Exchange("celery", type="direct", durable=True)
    queue = kombu.Queue("celery", exchange, routing_key="celery", durable=True)
    received: list[dict[str, object]] = []
    with kombu.Connection(broker.url) as conn:
        with conn.Producer() as producer:
            producer.publish(
                {"args": [2, 3], "kwargs": {}},
                exchange=exchange,
                routing_key="celery",
                declare=[queue],
                serializer="json",
                retry=True,
                headers={"task": "tasks.add", "id": "abc-123", "lang": "py"},
                delivery_mode=2,
            )

        def on_message(body: dict[str, object], message: kombu.Message) -> None:
            received.append({"body": body, "task": message.headers["task"]})
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
            conn.drain_events(timeout=5)
    assert received == [{"body": {"args": [2, 3], "kwargs": {}}, "task": "tasks.add"}]


def test_pika_channel_error_keeps_connection(broker: InProcessBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("missing", passive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text == "NOT_FOUND - no queue 'missing' in vhost '/'"
    other = conn.channel()
    other.queue_declare("present")
    assert conn.is_open
    conn.close()
