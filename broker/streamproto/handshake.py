"""The stream protocol's connection commands: PeerProperties, SASL, Tune, Open, Close,
Heartbeat and ExchangeCommandVersions.

Each handler reads its fields from a Decoder and answers on the session, as RabbitMQ's
stream reader does (rabbit_stream_reader.erl: handle_frame_pre_auth). A failed login or a
refused vhost is answered, and then the socket closes.
Must not know: streams, publishers or consumers. Single-threaded, on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession

# what PeerProperties announces: clients (the Go one) read `version` to enable features, so it
# is the RabbitMQ release whose stream protocol this serves
SERVER_VERSION = "3.13.7"


def peer_properties(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    s.client_properties = d.map()
    d.done()
    props = {
        "product": "Leveret",
        "version": SERVER_VERSION,
        "platform": "Python",
        "copyright": "Leveret contributors",
        "information": "Leveret, serving RabbitMQ's stream protocol; see the README",
        "cluster_name": s.broker.config.node_name,
    }
    s.send(f.response(k.PEER_PROPERTIES, corr, k.OK, f.enc_map(props)))
    s.step = "sasl"


def sasl_handshake(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    d.done()
    s.send(f.response(k.SASL_HANDSHAKE, corr, k.OK, f.enc_strings(s.mechanisms())))


def sasl_authenticate(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    mechanism = d.string()
    opaque = d.bytes_()
    d.done()
    if s.user is not None:  # already authenticated: RabbitMQ ignores a second one too
        s.send(f.response(k.SASL_AUTHENTICATE, corr, k.SASL_ERROR))
        return
    if mechanism not in s.mechanisms():
        s.send(f.response(k.SASL_AUTHENTICATE, corr, k.SASL_MECHANISM_NOT_SUPPORTED))
        return
    code = s.authenticate(mechanism, opaque)
    s.send(f.response(k.SASL_AUTHENTICATE, corr, code))
    if code != k.OK:
        s.step = "failure"
        s.abort()
        return
    cfg = s.server.settings
    s.send(f.frame(k.TUNE, 1, f.u32(cfg.frame_max) + f.u32(cfg.heartbeat_s)))
    s.step = "tune"


def _negotiate(client: int, server: int) -> int:
    """0 on either side means no limit: the other one holds; else the smaller."""
    if client == 0:
        return server
    if server == 0:
        return client
    return min(client, server)


def tune(s: StreamSession, d: f.Decoder, _version: int) -> None:
    frame_max = d.u32()
    heartbeat = d.u32()
    d.done()
    cfg = s.server.settings
    s.frame_max = _negotiate(frame_max, cfg.frame_max)
    s.heartbeat = heartbeat  # RabbitMQ's reader takes the client's: 0 turns heartbeats off
    if s.user is not None:
        s.step = "open"


def open_(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    vhost = d.string()
    d.done()
    if s.user is None:
        s.step = "failure"
        s.abort()
        return
    code = s.open_vhost(vhost)
    if code != k.OK:
        s.send(f.response(k.OPEN, corr, code, f.enc_map({})))
        s.step = "failure"
        s.abort()
        return
    host, port = s.server.advertised(s)
    s.send(f.response(k.OPEN, corr, k.OK,
                      f.enc_map({"advertised_host": host, "advertised_port": str(port)})))


def close(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    d.u16()  # the client's closing code
    d.string()  # and reason
    d.done()
    s.send(f.response(k.CLOSE, corr, k.OK))
    s.step = "closed"
    s.abort()


def heartbeat(s: StreamSession, d: f.Decoder, _version: int) -> None:
    """Nothing to do: any frame counts as a sign of life."""


def exchange_command_versions(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    for _ in range(d.count()):
        key = d.u16()
        d.u16()
        high = d.u16()
        if key == k.DELIVER and high >= 2:
            s.deliver_version = 2
    d.done()
    body = f.i32(len(k.ADVERTISED)) + b"".join(
        f.u16(key) + f.u16(k.VERSIONS[key][0]) + f.u16(k.VERSIONS[key][1])
        for key in k.ADVERTISED)
    s.send(f.response(k.EXCHANGE_COMMAND_VERSIONS, corr, k.OK, body))
