"""RabbitMQ's stream protocol (port 5552): frames, commands, sessions and the listener.

The stream protocol serves the same stream queues as AMQP 0.9.1 (`broker/model/stream.py`):
one log, whichever protocol writes or reads it. See docs/STREAM-PROTOCOL.md.
"""
