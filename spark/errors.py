"""Typed errors of the Spark data source; each carries the data a message needs.

Spark shows the text of an exception raised in a Python worker inside its own
`PythonException` or `StreamingQueryException`, so every text here names the option, the
broker address or the AMQP reply that caused it, and reads well on one line.

No I/O; imports nothing.
"""

from __future__ import annotations


class LeveretSparkError(Exception):
    """Base class of every error the data source raises."""


class OptionError(LeveretSparkError, ValueError):
    """A bad or missing option (or column); the text names it."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"leveret: option '{option}': {problem}")
        self.option = option
        self.problem = problem


class LeveretConnectionError(LeveretSparkError, ConnectionError):
    """The broker cannot be reached, refused the login, or refused the vhost."""


class ConnectionLost(LeveretSparkError, ConnectionError):
    """An open connection broke (socket closed, reset, timed out, or missed heartbeats)."""


class BrokerError(LeveretSparkError):
    """The broker closed a channel or the connection with an AMQP reply code."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0,
                 scope: str = "channel") -> None:
        super().__init__(f"the broker closed the {scope}: {code} {text}")
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        self.scope = scope


class PublishError(LeveretSparkError):
    """The broker nacked publishes, or returned one as unroutable."""
