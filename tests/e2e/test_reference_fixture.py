"""The differential fixture itself: both targets answer, and they agree on a basic error."""

from __future__ import annotations

import pika
import pytest


def test_both_targets_agree_on_missing_queue(target: tuple[str, int]) -> None:
    _name, port = target
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("leveret-no-such-queue", passive=True)
    assert (info.value.reply_code, info.value.reply_text) == (
        404, "NOT_FOUND - no queue 'leveret-no-such-queue' in vhost '/'")
    conn.close()
