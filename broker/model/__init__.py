"""The broker's domain model: vhosts, exchanges, bindings, queues, streams and consumers.

Modules:

- `vhost`: a virtual host, its exchanges, queues and bindings, and routing between them;
- `queue_kind`: queue types as declarations see them (argument validation, equivalence,
  building a queue) and their registry; `classic_kind`, `stream_kind`: the two kinds;
  `queue_type`: the interface of a queue once it exists; `fields`: AMQP field tables;
- `exchange`, `binding`: exchanges and their routing, bindings; `superstream_exchange` and
  `superstream`: super streams' exchange, and their operations;
- `queue`: what every queue type shares, the classic queue, and `QueueOwner` (what a queue
  asks of its vhost); `store`: a classic queue's ready messages; `durable`: durable classic
  queues in the log (a queue held by another node is broker/remote's `RemoteQueue`);
- `stream`: the stream queue type; `stream_args`, `stream_cursor`: its arguments and a
  consumer's position; `sac`: single active consumer; `writer`, `committer`: the publish
  path's hop to a log, its commit point and confirms; `storage_env`: what the runtime gives
  queues kept in the storage engine;
- `consumer`, `message`: consumers and messages as the model sees them; `dedup`:
  deduplication; `deadletter`: x-death; `policy`: policies; `args`, `equivalence`: argument
  checks and redeclaration equivalence with RabbitMQ's texts; `errors`: typed domain errors;
  `scheduler`: the clock and timers; `intervals`: sets of integer ranges.

It never sees pamqp or the wire layer: messages reach it with their content header still
encoded, and errors leave it as typed domain errors that the session maps to reply codes. It is
the bottom of broker/: it must not know the sessions, the stream protocol, the HTTP API, the
cluster, the wire workers or the server (import-linter contracts in pyproject.toml).
Single-threaded, on the broker's event loop.
"""
