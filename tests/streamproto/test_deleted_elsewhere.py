"""A stream deleted by other means than the stream protocol's Delete (AMQP 0.9.1 queue.delete
here) reaches its stream-protocol publishers and subscribers as RabbitMQ tells them: a
MetadataUpdate STREAM_NOT_AVAILABLE naming the stream, once per connection; the connection
keeps serving and the publisher is gone."""

from __future__ import annotations

import struct

import pika

from .conftest import StreamBroker
from .raw import s, strmap


def test_amqp_delete_sends_metadata_update(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    client.request(0x0D, s(name) + strmap({}))
    assert client.response(0x0D)[1] == 1
    client.request(0x01, struct.pack(">B", 1) + s("ref") + s(name))
    assert client.response(0x01)[1] == 1
    subscriber = lev.raw()
    subscriber.request(0x07, struct.pack(">B", 2) + s(name) + struct.pack(">HH", 1, 5)
                       + strmap({}))
    assert subscriber.response(0x07)[1] == 1

    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:"
                                                      f"{lev.amqp_port}/"))
    conn.channel().queue_delete(name)
    conn.close()
    for raw in (client, subscriber):
        update = raw.next(0x0010)
        assert struct.unpack_from(">H", update, 4)[0] == 0x06
        assert update[6:] == s(name)
    client.request(0x06, struct.pack(">B", 1))  # the publisher went with its stream
    assert client.response(0x06)[1] == 0x12  # PUBLISHER_DOES_NOT_EXIST
    client.close()
    subscriber.close()
