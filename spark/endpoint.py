"""Where a connection goes: a parsed amqp:// or amqps:// URI and its TLS context.

Pure: parsing only; `ssl_context` builds a context from files named in the URI.
"""

from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass, field

DEFAULT_PORT = {"amqp": 5672, "amqps": 5671}


@dataclass(frozen=True)
class Endpoint:
    """A parsed amqp:// or amqps:// URI, with RabbitMQ's query parameters (heartbeat,
    connection_timeout in ms, cacertfile, certfile, keyfile, verify, server_name_indication).
    As pika and aio-pika read it, an empty path or "/" is the vhost "/"; "/%2F" is "/" too."""

    scheme: str
    host: str
    port: int
    username: str
    password: str
    vhost: str
    heartbeat_s: int | None = None
    connect_timeout_s: float = 10.0
    tls: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, uri: str) -> Endpoint:
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme not in DEFAULT_PORT:
            raise ValueError(f"the scheme must be amqp:// or amqps://, got {uri!r}")
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query).items()}
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        try:
            port = parts.port or DEFAULT_PORT[parts.scheme]
        except ValueError as exc:
            raise ValueError(f"bad port in {uri!r}: {exc}") from None
        heartbeat_s = int(query["heartbeat"]) if "heartbeat" in query else None
        timeout = float(query.get("connection_timeout", "10000")) / 1000.0
        tls: dict[str, str] = {k: query[k] for k in ("cacertfile", "certfile", "keyfile", "verify",
                                     "server_name_indication") if k in query}
        return cls(
            scheme=parts.scheme,
            host=parts.hostname or "localhost",
            port=port,
            username=urllib.parse.unquote(parts.username or "guest"),
            password=urllib.parse.unquote(parts.password or "guest"),
            vhost=urllib.parse.unquote(path) if path else "/",
            heartbeat_s=heartbeat_s,
            connect_timeout_s=timeout,
            tls=tls,
        )

    @property
    def display(self) -> str:
        """The URI without its password, for error messages and logs."""
        vhost = urllib.parse.quote(self.vhost, safe="")
        return f"{self.scheme}://{self.username}@{self.host}:{self.port}/{vhost}"

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.tls.get("cacertfile"))
        if "certfile" in self.tls:
            context.load_cert_chain(self.tls["certfile"], self.tls.get("keyfile"))
        if self.tls.get("verify") == "verify_none":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context
