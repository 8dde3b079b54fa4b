"""SASL EXTERNAL on the stream TLS port with real certificates (made with openssl, as the AMQP
TLS test makes them), as RabbitMQ's rabbitmq_auth_mechanism_ssl: the user name is the client
certificate's subject DN (`CN=client`), offered on TLS connections only, refused without a
verified certificate and for an unknown user (AUTHENTICATION_FAILURE), over raw frames and
with rstream unchanged."""

from __future__ import annotations

import json
import ssl
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.test_security import make_certificates
from rstream import AMQPMessage, Producer
from rstream.constants import SlasMechanism
from support.brokers import BrokerProcess
from support.management import Http
from support.ports import free_port, wait_for_port

from .raw import RawStream, s, strmap

AUTHENTICATION_FAILURE = 0x08
SASL_MECHANISM_NOT_SUPPORTED = 0x07


def stranger_certificate(directory: Path) -> tuple[Path, Path]:
    """A client certificate signed by the same CA for a user the broker does not know."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "stranger.key", "-out",
        "stranger.csr", "-subj", "/O=elsewhere/CN=stranger")
    run("x509", "-req", "-in", "stranger.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "stranger.pem", "-days", "2")
    return directory / "stranger.pem", directory / "stranger.key"


def tls_broker(directory: Path, certs: dict[str, Path], verify_peer: bool) -> tuple[
        BrokerProcess, int, int]:
    plain, tls, management = free_port(), free_port(), free_port()
    definitions = directory / "definitions.json"
    definitions.write_text(json.dumps({
        "users": [{"name": "CN=client", "password_hash": "", "tags": ""}],
        "permissions": [{"user": "CN=client", "vhost": "/", "configure": ".*",
                         "write": ".*", "read": ".*"}]}))
    process = BrokerProcess(directory / "data", args=[
        "--stream-port", str(plain), "--stream-tls-port", str(tls),
        "--definitions", str(definitions), "--management-port", str(management)], env={
        "LEVERET_TLS_CERTFILE": str(certs["server.pem"]),
        "LEVERET_TLS_KEYFILE": str(certs["server.key"]),
        "LEVERET_TLS_CACERTFILE": str(certs["ca.pem"]),
        "LEVERET_TLS_VERIFY_PEER": "true" if verify_peer else "false"}).start()
    wait_for_port(tls, 30)
    wait_for_port(management, 30)
    process.management_port = management  # type: ignore[attr-defined]
    return process, plain, tls


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("certs")
    found = make_certificates(directory)
    found["stranger.pem"], found["stranger.key"] = stranger_certificate(directory)
    return found


@pytest.fixture(scope="module")
def verifying(tmp_path_factory: pytest.TempPathFactory,
              certs: dict[str, Path]) -> Iterator[tuple[int, int, int]]:
    process, plain, tls = tls_broker(tmp_path_factory.mktemp("verify"), certs, True)
    yield plain, tls, process.management_port  # type: ignore[attr-defined]
    process.kill()


def context(certs: dict[str, Path], who: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    if who is not None:
        ctx.load_cert_chain(certs[f"{who}.pem"], certs[f"{who}.key"])
    return ctx


def tls_raw(port: int, ctx: ssl.SSLContext) -> RawStream:
    client = RawStream(port)
    client.sock = ctx.wrap_socket(client.sock, server_hostname="localhost")
    return client


def mechanisms(client: RawStream) -> list[str]:
    client.request(0x11, strmap({"product": "raw"}))
    assert client.response(0x11)[1] == 1
    client.request(0x12, b"")
    _, code, rest = client.response(0x12)
    assert code == 1
    names, pos = [], 4
    for _ in range(struct.unpack(">i", rest[:4])[0]):
        size = struct.unpack(">h", rest[pos:pos + 2])[0]
        names.append(rest[pos + 2:pos + 2 + size].decode())
        pos += 2 + size
    return names


def external(client: RawStream) -> int:
    client.request(0x13, s("EXTERNAL") + struct.pack(">i", 0))
    return client.response(0x13)[1]


def test_external_logs_in_with_the_certificate_dn(verifying: tuple[int, int, int],
                                                  certs: dict[str, Path]) -> None:
    client = tls_raw(verifying[1], context(certs, "client"))
    assert mechanisms(client) == ["PLAIN", "AMQPLAIN", "EXTERNAL"]
    assert external(client) == 1
    tune = client.next(0x14)
    client.send(0x14, 1, tune[4:12])
    client.request(0x15, s("/"))
    assert client.response(0x15)[1] == 1
    client.request(0x0D, s("over-external") + strmap({}))
    assert client.response(0x0D)[1] == 1
    # the management API shows how it logged in, and the certificate
    port = client.sock.getsockname()[1]
    [view] = [c for c in Http(verifying[2]).get("/api/stream/connections").body
              if c["peer_port"] == port]
    assert (view["user"], view["auth_mechanism"], view["ssl"]) == ("CN=client", "EXTERNAL", True)
    assert view["peer_cert_subject"] == "CN=client"
    assert view["peer_cert_issuer"] == "CN=leveret-test-ca"
    assert view["ssl_protocol"].startswith("TLSv1")
    client.close()


def test_unknown_user_is_an_authentication_failure(verifying: tuple[int, int, int],
                                                   certs: dict[str, Path]) -> None:
    client = tls_raw(verifying[1], context(certs, "stranger"))  # CN=stranger,O=elsewhere
    assert "EXTERNAL" in mechanisms(client)
    assert external(client) == AUTHENTICATION_FAILURE
    assert client.closed_by_server()


def test_without_a_certificate(verifying: tuple[int, int, int], certs: dict[str, Path],
                               tmp_path: Path) -> None:
    # peer verification on: no certificate, no TLS session (as on the amqps port)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        client = tls_raw(verifying[1], context(certs, None))
        mechanisms(client)
    # the plain port never offers EXTERNAL, and refuses it as a mechanism it does not know
    plain = RawStream(verifying[0])
    assert mechanisms(plain) == ["PLAIN", "AMQPLAIN"]
    assert external(plain) == SASL_MECHANISM_NOT_SUPPORTED
    assert plain.closed_by_server()
    # peer verification off: EXTERNAL is offered (as RabbitMQ offers it on TLS) and refused,
    # with or without a certificate (RabbitMQ: "TLS configuration is unsafe")
    process, _plain, tls = tls_broker(tmp_path, certs, False)
    try:
        for who in (None, "client"):
            client = tls_raw(tls, context(certs, who))
            assert "EXTERNAL" in mechanisms(client)
            assert external(client) == AUTHENTICATION_FAILURE
            assert client.closed_by_server()
    finally:
        process.kill()


@pytest.mark.asyncio
async def test_rstream_with_external(verifying: tuple[int, int, int],
                                     certs: dict[str, Path]) -> None:
    async with Producer("localhost", port=verifying[1], ssl_context=context(certs, "client"),
                        username="", password="",
                        sasl_configuration_mechanism=SlasMechanism.MechanismExternal) as p:
        await p.create_stream("rstream-external", exists_ok=True)
        await p.send_wait("rstream-external", AMQPMessage(body=b"by certificate"))
