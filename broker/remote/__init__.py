"""Remote queues: a queue held by another node of the cluster, used as if it were this node's.

A queue whose record names another node is a `RemoteQueue` in this node's model. It is one
more implementation of the queue-type interface (broker/model/queue_type.py): the session
publishes to it, consumes from it, gets from it and hands it a passive queue.declare, a
queue.purge or a queue.delete (`forward`, `forward_delete`) as any queue, and it hands the
work to the forwarder, which speaks AMQP 0-9-1 to the holding node through a tunnel over the
node-to-node link (docs/FORWARDING.md).

- `remote_queue`: `RemoteQueue`, the queue as this node's model sees it, and `Forwarding`, what
  it asks of the forwarder. It knows the model, nothing of the link or of AMQP.
- `forwarding`: the `Forwarder` (`broker.forwarder`): this node's tunnels to the others, the
  remote consumers' and basic.get's shadows, and the queue methods relayed to the holder.
- `tunnel_client`: the forwarding node's end of a tunnel (AMQP frames in TUNNEL link frames).
- `tunnel_server`: the holding node's end: an ordinary `Session` whose socket is the link.

This room must not know the etcd topology (the queues it is given say which node holds
them), nor be imported by the model or by the session (its channel, its queue methods in
session/topology.py): they reach a remote queue only through the queue-type interface. The
broker is composed with its forwarder in broker/server.py. Asyncio: one event loop.
"""
