"""The management HTTP API: a RabbitMQ-compatible subset on aiohttp, plus /metrics.

Modules:

- `app`: the aiohttp application and its listener; `http`: errors, JSON bodies, access checks,
  list queries; `csrf`: the guard of state-changing requests; `local_token`: the credential of
  `leveretctl` and `leveret-diagnostics`;
- one module per resource group: `overview`, `access`, `policies`, `topology`, `live`
  (connections, channels, consumers), `defs`, `streams`, `stream_members`, `stream_messages`,
  `stream_protocol` (rabbitmq_stream_management's paths), `metrics`;
- `views`: the JSON shapes in RabbitMQ's field names; `stream_connections`: this node's
  stream-protocol connections and their views; `nodes`: the port where one node and a
  cluster differ (`NodesView`, chosen once by `app.create_app`; `OneNodeView` for one node);
  `cluster_views`: its cluster implementation, what other nodes hold, asked over the node
  links; `messages`: a queue's "get"; `streamops`: the operations behind the
  rabbitmq-streams-style commands; `rates`: message rates; `prometheus_names` and
  `member_metrics`: what /metrics shows;
- `ui/`: the web UI's static pages.

It sits at the top: nothing below the server (the model, the sessions, the stream protocol, the
cluster, the wire workers) imports it (an import-linter contract in pyproject.toml). It must not
know AMQP frames or stream frames: it reads the model and the sessions' state. Everything runs
on the broker's event loop and calls the model directly.
"""
