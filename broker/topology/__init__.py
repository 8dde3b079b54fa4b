"""The topology port: where "declare, bind, delete, place, list" of exchanges and queues go.

- `port.py`: the interface (`TopologyPort`), the declarations it takes, the placement it
  answers and the errors it raises. The front ends (AMQP handlers, the stream protocol, the
  management API and definitions) call this and nothing else to change the topology.
- `placement.py`: the one placement function (which node holds a new queue, and a new
  stream's members) and the one leader-locator reader.
- `local.py`: one node: the model, which persists to the SQLite metastore.
- `cluster.py`: a cluster: one etcd txn through `cluster.topology.TopologyStore`, the one
  answer to "a txn that may have been applied", then settled on every running node.

The broker is composed with one of the two (`Broker.topology`); nothing else asks which.
It must not know AMQP frames, the stream protocol's frames or HTTP.
"""
