"""`leveret serve --workers N`: wire worker processes beside the main process (docs/WORKERS.md).

Modules:

- `pool`: the main process's side: the N - 1 workers, and the listener that places each new
  connection on one;
- `transport`: the asyncio transport a session sees for a client whose socket a worker reads;
- `worker`: a worker process, reading client sockets for the main process;
- `split`: a worker's first pass over what a client sends: frames split, publishes gathered;
- `ipc`: the byte layout of the messages between the main process and a worker.

Its one seam with the rest of the broker is `amqp/split_input.py` plus
`Session.split_received`, and only `broker/server.py` imports it. It must not know the model,
the sessions, the stream protocol, the HTTP API, the cluster or the storage engine
(import-linter contracts in pyproject.toml). Asyncio in the main process; a worker runs its own
loop in its own process.
"""
