"""A small client for Leveret's management HTTP API in tests (stdlib urllib, basic auth)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from support.brokers import InProcessBroker


def q(value: str) -> str:
    return quote(value, safe="")


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]
    text: str


class Http:
    def __init__(self, port: int, user: str = "guest", password: str = "guest") -> None:
        self.port = port
        self.user = user
        self.password = password

    @classmethod
    def of(cls, broker: InProcessBroker, user: str = "guest", password: str = "guest") -> Http:
        return cls(broker.config.management_port, user, password)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def as_user(self, user: str, password: str) -> Http:
        return Http(self.port, user, password)

    def call(self, method: str, path: str, body: Any = None, *, auth: bool = True,
             raw: bytes | None = None, headers: dict[str, str] | None = None) -> Reply:
        data = raw if raw is not None else (json.dumps(body).encode()
                                            if body is not None else None)
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, payload, head = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as error:
            status, payload, head = error.code, error.read(), dict(error.headers)
        text = payload.decode("utf-8", "replace")
        try:
            parsed = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            parsed = None
        return Reply(status, parsed, head, text)

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.call("GET", path, **kwargs)

    def put(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return self.call("PUT", path, body if body is not None else {}, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return self.call("POST", path, body if body is not None else {}, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Reply:
        return self.call("DELETE", path, **kwargs)

    def ok(self, path: str) -> Any:
        """GET that must answer 200; returns the JSON body."""
        reply = self.get(path)
        assert reply.status == 200, (path, reply.status, reply.text)
        return reply.body
