"""Cluster mode: Leveret nodes coordinated by etcd (issue 14).

Nothing here runs unless `leveret serve` is given `--etcd`: one node with SQLite metadata stays
the embedded default.

Modules:

- etcd: `etcd` (the client for etcd's v3 JSON gateway) and `etcd_types` (its typed requests
  and results); `lease` (a node's lease, kept alive, and the signal that it is lost);
  `membership` (a node's record and the cluster's members); `running_nodes` (which nodes run);
- the node links: `link` (authenticated, framed connections), `link_frames` (their sans-IO
  half), `link_handshake` (settings and the shared-secret proof), `peers` (one link per pair);
- the topology: `topology` (the store in etcd), `topology_keys`, `topology_records`,
  `topology_cache` (every node's copy, kept by a watch), `topology_sync` and `access_sync`
  (applying it to this node's model);
- replicated streams: `replication` (a log shipped to replicas and committed at a quorum),
  `stream_replication` (that wiring in the broker; its parts are given the small protocols
  of what they ask of it, and do not import it), `stream_led` (a stream this node leads),
  `stream_leadership` (who leads, in which
  epoch), `stream_placement` (a new stream's members), `stream_failover`,
  `stream_membership` (add_replica, delete_replica) and `stream_sac` (single active consumer
  across nodes);
- `runtime`: what a node holds in cluster mode, in one place.

It speaks etcd and the node-to-node link: it must not know the AMQP wire layer or pamqp, the
HTTP API or the wire workers (import-linter contracts in pyproject.toml). Asyncio, on the
broker's event loop.
"""
