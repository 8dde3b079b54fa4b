"""SASL responses of connection.start-ok: PLAIN and AMQPLAIN, parsed to a username and password.

Parsing only; whether the credentials are good is the broker's business.
"""

from __future__ import annotations

import struct

from pamqp import decode

from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError

MECHANISMS = ("PLAIN", "AMQPLAIN")


class BadCredentials(Exception):
    """The response could not be parsed as the mechanism says."""


def parse_response(mechanism: str, response: bytes) -> tuple[str, str]:
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            raise BadCredentials("PLAIN response is not authzid NUL user NUL password")
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            _, table = decode.field_table(struct.pack(">I", len(response)) + response)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadCredentials(f"AMQPLAIN response is not a field table: {exc}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(login, str | bytes) or not isinstance(password, str | bytes):
            raise BadCredentials("AMQPLAIN response lacks LOGIN or PASSWORD")
        return _text(login), _text(password)
    raise AMQPError(c.COMMAND_INVALID, f"unknown authentication mechanism '{mechanism}'", 10, 11)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
