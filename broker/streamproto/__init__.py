"""RabbitMQ's stream protocol (port 5552): frames, commands, sessions and the listener.

The stream protocol serves the same stream queues as AMQP 0.9.1 (`broker/model/stream.py`):
one log, whichever protocol writes or reads it. See docs/STREAM-PROTOCOL.md.

- the wire: `frames.py` (framing, Decoder, encoders), `constants.py`, `chunk.py` (Deliver's
  chunks), `compression.py`, `amqp10.py` and `amqp10types.py` (AMQP 1.0 messages),
  `table091.py`;
- a connection: `session.py` (dispatch, output through `output.py`), `handshake.py`,
  `certlogin.py` (SASL EXTERNAL), `settings.py`;
- the commands: `publishing.py` (its publishers: `publisher.py`), `consuming.py` (its
  subscriptions: `subscription.py`), `streams.py` (Create, Delete, super streams, Route,
  Partitions, StreamStats: through the topology port, started by `eager.py`), `cluster.py`
  (Metadata, and what a node that does not hold a stream refuses), `tracking.py` (offsets and
  sequences of a stream held elsewhere);
- over the nodes: `peers.py` (one node, or the cluster's records and links);
- the listeners: `server.py` (the command table) and `registry.py` (for the management API).

It must not know AMQP 0.9.1's framing or whether the broker runs in a cluster (only
`peers.peers_of` and the topology port choose).
"""
