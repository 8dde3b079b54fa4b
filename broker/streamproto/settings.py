"""The stream listeners' settings: the frame_max and heartbeat they offer in Tune, and the host
and port advertised to clients in Metadata and Open's answer (empty: chosen per connection,
advertise.py, and the socket's port).

A leaf, so that the session and the handlers read the settings without importing the server
that composes them. Must not know: sockets, sessions. Immutable.
"""

from __future__ import annotations

from dataclasses import dataclass

from leveret.broker.streamproto import constants as k


@dataclass(frozen=True)
class Settings:
    frame_max: int = k.DEFAULT_FRAME_MAX
    heartbeat_s: int = k.DEFAULT_HEARTBEAT_S
    advertised_host: str = ""
    advertised_port: int = 0
