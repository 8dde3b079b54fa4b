"""The running process: what `leveret serve` reads and holds for its lifetime, below every room.

- `config`: the settings (embedded defaults, a TOML file, LEVERET_* variables, flags).
- `listen`: listening sockets and TLS contexts.
- `alarms`: the memory and free-disk alarms and their monitor.
- `logs`: structlog, configured in one place.

It must not know the model, the sessions, the cluster or any front end: they import it.
"""
