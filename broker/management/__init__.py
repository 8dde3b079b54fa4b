"""The management HTTP API: a RabbitMQ-compatible subset on aiohttp, plus /metrics.

`app` builds the aiohttp application and its listener; one module per resource group
(`overview`, `access`, `policies`, `topology`, `live`, `defs`, `streams`, `metrics`);
`views` holds the JSON shapes and `http` the plumbing. Everything runs on the broker's event
loop and calls the model directly.
"""
