"""The management API reads a change's body as JSON whatever its Content-Type says (issue 29),
on Leveret and on a reference RabbitMQ 3.10.8 with its management plugin alike: curl's `-d`
(application/x-www-form-urlencoded), no content type, text/plain, multipart. A body that is not
a JSON object is a 400 on both; a definitions import, on both, takes JSON or a multipart upload
only (415 otherwise). What stops a forged browser request is the cross-site refusal, Leveret's
own (RabbitMQ has none): a form POST with a JSON text/plain body from another site is refused.

Requests go over real sockets: curl itself, and http.client, which sends exactly the headers
it is given (urllib would add a form content type of its own).
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.brokers import InProcessBroker
from support.ports import free_port
from support.reference import Reference

pytestmark = pytest.mark.reference

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()
FORM = "application/x-www-form-urlencoded"
ANY_TYPE = [None, FORM, "text/plain", "multipart/form-data; boundary=x",
            "application/octet-stream", "application/json; charset=utf-8"]


@dataclass
class Api:
    """One broker's management API, and what a test made on it (deleted afterwards)."""

    name: str
    port: int
    made: list[str] = field(default_factory=list)

    def uid(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    def send(self, method: str, path: str, body: bytes | None = None,
             content_type: str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """(status, JSON body or None); only the headers given (and Host, Content-Length)."""
        sent = {"Authorization": AUTH, **(headers or {})}
        if content_type is not None:
            sent["Content-Type"] = content_type
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return response.status, json.loads(raw) if raw.strip() else None

    def queue(self, name: str) -> Any:
        status, body = self.send("GET", f"/api/queues/%2F/{name}")
        assert status == 200, (name, status, body)
        return body

    def curl(self, *args: str) -> tuple[int, str]:
        """curl with guest's login and -v: (status, curl's trace of the request headers)."""
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed (apt-get install curl)")
        result = subprocess.run(
            ["curl", "-sS", "-v", "-o", "/dev/null", "-w", "%{http_code}", "-u", "guest:guest",
             *args], capture_output=True, text=True, timeout=30, check=True)
        sent = "\n".join(line for line in result.stderr.splitlines() if line.startswith("> "))
        return int(result.stdout), sent

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def rabbitmq_api_port(stream_reference: Reference) -> int:
    """The shared reference RabbitMQ's management API (it has rabbitmq_management)."""
    return stream_reference.management_port


@pytest.fixture(params=["leveret", "rabbitmq"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """The management API of a fresh Leveret, or of the reference RabbitMQ."""
    if request.param == "rabbitmq":
        client = Api("rabbitmq", request.getfixturevalue("rabbitmq_api_port"))
        yield client
        for path in client.made:
            client.send("DELETE", path)
        return
    server = InProcessBroker(tmp_path / "data", management_port=free_port()).start()
    try:
        yield Api("leveret", server.config.management_port)
    finally:
        server.stop()


def test_curl_put_with_a_form_content_type_or_none(api: Api) -> None:
    """The issue's command: `curl -X PUT -d '{"durable":true}'` sends
    application/x-www-form-urlencoded; with `-H 'Content-Type:'` it sends no type at all."""
    form, none = api.uid("curl-form"), api.uid("curl-none")
    api.made += [f"/api/queues/%2F/{form}", f"/api/queues/%2F/{none}"]
    status, sent = api.curl("-X", "PUT", "-d", '{"durable":true}',
                            api.url(f"/api/queues/%2F/{form}"))
    assert f"> Content-Type: {FORM}" in sent
    assert status == 201
    status, sent = api.curl("-X", "PUT", "-H", "Content-Type:", "-d",
                            '{"durable":true,"arguments":{"x-max-length":3}}',
                            api.url(f"/api/queues/%2F/{none}"))
    assert "content-type" not in sent.lower()
    assert status == 201
    assert api.queue(form)["durable"] is True
    assert api.queue(none)["arguments"] == {"x-max-length": 3}
    # the same again is an update: 204 on both
    assert api.curl("-X", "PUT", "-d", '{"durable":true}',
                    api.url(f"/api/queues/%2F/{form}"))[0] == 204


@pytest.mark.parametrize("content_type", ANY_TYPE)
def test_any_content_type_is_read_as_json(api: Api, content_type: str | None) -> None:
    queue, vhost = api.uid("q"), api.uid("v")
    api.made += [f"/api/queues/%2F/{queue}", f"/api/vhosts/{vhost}"]
    body = json.dumps({"durable": False, "auto_delete": True,
                       "arguments": {"x-message-ttl": 60000}}).encode()
    assert api.send("PUT", f"/api/queues/%2F/{queue}", body, content_type)[0] == 201
    declared = api.queue(queue)
    assert (declared["durable"], declared["auto_delete"]) == (False, True)
    assert declared["arguments"] == {"x-message-ttl": 60000}
    assert api.send("PUT", f"/api/vhosts/{vhost}", None, content_type)[0] == 201
    publish = json.dumps({"properties": {}, "routing_key": queue, "payload": "hi",
                          "payload_encoding": "string"}).encode()
    assert api.send("POST", "/api/exchanges/%2F/amq.default/publish", publish,
                    content_type) == (200, {"routed": True})
    status, got = api.send("POST", f"/api/queues/%2F/{queue}/get", json.dumps(
        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}).encode(), content_type)
    assert (status, [m["payload"] for m in got]) == (200, ["hi"])
    assert api.send("DELETE", f"/api/queues/%2F/{queue}", None, content_type)[0] == 204
    assert api.send("DELETE", f"/api/vhosts/{vhost}", None, content_type)[0] == 204


@pytest.mark.parametrize("body", [b"durable=true", b"[1]", b'"text"', b"{"])
def test_a_body_that_is_not_a_json_object_is_400(api: Api, body: bytes) -> None:
    """(RabbitMQ's reason is `not_json`; Leveret's says what failed.)"""
    queue = api.uid("q")
    api.made.append(f"/api/queues/%2F/{queue}")
    status, reply = api.send("PUT", f"/api/queues/%2F/{queue}", body, FORM)
    assert (status, reply["error"]) == (400, "bad_request")
    assert api.send("GET", f"/api/queues/%2F/{queue}")[0] == 404


def _multipart(fields: dict[str, tuple[str | None, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body: name -> (file name or None, content); and its type."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, (filename, content) in fields.items():
        disposition = f'form-data; name="{name}"' + (
            f'; filename="{filename}"' if filename else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
                     + content + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), \
        f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("content_type", [None, FORM, "text/plain", "application/octet-stream"])
def test_a_definitions_import_wants_json_or_a_multipart_upload(
    api: Api, content_type: str | None
) -> None:
    """RabbitMQ's definitions endpoint is the one write endpoint that looks at the type."""
    vhost = api.uid("dv")
    api.made.append(f"/api/vhosts/{vhost}")
    document = json.dumps({"vhosts": [{"name": vhost}]}).encode()
    for path in ("/api/definitions", "/api/definitions/%2F"):
        status, reply = api.send("POST", path, document, content_type)
        assert status == 415, path
        if api.name == "leveret":  # RabbitMQ's 415 has no body
            assert reply == {"error": "unsupported_media_type", "reason":
                             "definitions are imported as Content-Type: application/json, or "
                             "as the file field of a multipart/form-data upload"}
    assert api.send("GET", f"/api/vhosts/{vhost}")[0] == 404
    assert api.send("POST", "/api/definitions", document, "application/json")[0] == 204
    assert api.send("GET", f"/api/vhosts/{vhost}")[0] == 200


def test_a_definitions_upload(api: Api, tmp_path: Path) -> None:
    """The `file` field of a multipart form, as RabbitMQ's web UI and `curl -F` upload it."""
    first, second = api.uid("up"), api.uid("up")
    api.made += [f"/api/vhosts/{first}", f"/api/vhosts/{second}"]
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps({"vhosts": [{"name": first}]}))
    assert api.curl("-F", f"file=@{path}", api.url("/api/definitions"))[0] == 204
    assert api.send("GET", f"/api/vhosts/{first}")[0] == 200
    body, kind = _multipart({"file": (None, json.dumps({"vhosts": [{"name": second}]})
                                      .encode())})
    assert api.send("POST", "/api/definitions", body, kind)[0] == 204
    assert api.send("GET", f"/api/vhosts/{second}")[0] == 200
    for fields in ({"file": ("d.json", b"not json")}, {"other": ("d.json", b"{}")}):
        body, kind = _multipart(fields)
        status, reply = api.send("POST", "/api/definitions", body, kind)
        assert (status, reply["error"]) == (400, "bad_request"), fields


def test_a_forged_browser_post_is_refused_whatever_its_type(
    managed_broker: InProcessBroker,
) -> None:
    """Leveret only (RabbitMQ refuses no cross-site request): what a page on another site can
    make a browser send is a POST with a form type or none, whose text/plain body may well be
    JSON; the browser's Origin or Sec-Fetch-Site gives it away."""
    api = Api("leveret", managed_broker.config.management_port)
    assert api.send("PUT", "/api/queues/%2F/target", b"{}", FORM)[0] == 201
    bind = "/api/bindings/%2F/e/amq.direct/q/target"
    rule = json.dumps({"routing_key": "stolen"}).encode()
    defs, multipart = _multipart({"file": ("d.json", b'{"users": [{"name": "mallory", '
                                  b'"password": "x", "tags": "administrator"}]}')})
    refused = (403, {"error": "forbidden", "reason": "cross-site requests may not change the "
                                                      "broker"})
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": f"http://127.0.0.1:{api.port + 1}"}):
        for kind in ("text/plain", FORM, None):
            assert api.send("POST", bind, rule, kind, headers) == refused, (headers, kind)
        assert api.send("POST", "/api/definitions", defs, multipart, headers) == refused
        assert api.send("DELETE", "/api/queues/%2F/target", None, None, headers) == refused
    assert api.send("GET", f"{bind}")[1] == []
    assert api.send("GET", "/api/users/mallory")[0] == 404
    # the same POST from the server's own page (or a client that is no browser) is taken
    own = {"Origin": f"http://127.0.0.1:{api.port}", "Sec-Fetch-Site": "same-origin"}
    assert api.send("POST", bind, rule, "text/plain", own)[0] == 201
    assert [b["routing_key"] for b in api.send("GET", bind)[1]] == ["stolen"]
