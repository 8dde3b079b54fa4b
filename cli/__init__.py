"""Command-line interfaces: `leveret` (the server and tools), `leveret-streams`, `leveretctl`
and `leveret-diagnostics`.

Modules: `app` (`leveret`, and `__main__` for `python -m leveret.cli`), `cluster`
(`leveret cluster-status`), `ctl`, `ctl_common` and `ctl_status` (`leveretctl`),
`diagnostics` (`leveret-diagnostics`), `streams`, `streams_api`, `streams_lists` and
`streams_inspect` (`leveret-streams`), and `usage` (a usage mistake in one line).

Presentation only: parse, call, render with rich, and exit 1 with one clear line on errors. It
sits on top (cli -> broker -> {amqp, storage}): nothing imports it, and it must not hold broker
logic of its own.
"""
