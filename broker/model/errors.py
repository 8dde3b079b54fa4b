"""Typed domain errors of the broker model.

Each error carries the data it is about; the session's one map turns them into AMQP reply codes
and RabbitMQ's reply texts. The model raises these and never speaks of frames or codes.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every domain error; `text` is RabbitMQ's explanation, without the code name."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class NotFound(BrokerError):
    """404: an exchange or queue that does not exist."""


class AccessRefused(BrokerError):
    """403: reserved names, the default exchange, internal exchanges, permissions."""


class ResourceLocked(BrokerError):
    """405: an exclusive queue owned by another connection."""


class PreconditionFailed(BrokerError):
    """406: bad arguments, inequivalent redeclares, unknown delivery tags, in-use deletes."""


class NotImplementedFeature(BrokerError):
    """540: something RabbitMQ refuses with NOT_IMPLEMENTED (closes the connection)."""


class NotAllowed(BrokerError):
    """530: reuse of a consumer tag, unknown vhost, limits (closes the connection)."""


class CommandInvalid(BrokerError):
    """503: a method the server does not handle (closes the connection)."""


class InternalError(BrokerError):
    """541: the broker could not do what it should (closes the connection)."""


def resource(kind: str, name: str, vhost: str) -> str:
    """RabbitMQ's resource string: "queue 'q' in vhost '/'"."""
    return f"{kind} '{name}' in vhost '{vhost}'"
