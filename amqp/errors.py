"""Reply-code errors of the AMQP 0.9.1 wire.

An AMQPError carries the reply code, the explanation and the failing method's class and method
ids. Whether it closes the channel (soft) or the connection (hard) follows from the code, as in
RabbitMQ, except that any error on channel 0 closes the connection. The reply text on the wire
is "<NAME> - <explanation>", cut to 255 bytes.

It knows nothing of the broker model; the session maps domain errors to these.
"""

from __future__ import annotations

from leveret.amqp import constants as c


class AMQPError(Exception):
    """An error that the peer is told about with channel.close or connection.close."""

    def __init__(self, code: int, explanation: str, class_id: int = 0, method_id: int = 0):
        super().__init__(explanation)
        self.code = code
        self.explanation = explanation
        self.class_id = class_id
        self.method_id = method_id

    @property
    def hard(self) -> bool:
        return self.code not in c.SOFT_ERRORS

    @property
    def reply_text(self) -> str:
        text = f"{c.REPLY_NAMES.get(self.code, 'UNKNOWN')} - {self.explanation}"
        encoded = text.encode("utf-8")
        if len(encoded) <= 255:
            return text
        return encoded[:255].decode("utf-8", "ignore")

    def for_method(self, class_id: int, method_id: int) -> AMQPError:
        """Stamp the failing method onto an error raised without one."""
        if not self.class_id and not self.method_id:
            self.class_id, self.method_id = class_id, method_id
        return self

    def __repr__(self) -> str:
        return f"AMQPError({self.code}, {self.explanation!r}, {self.class_id}, {self.method_id})"


def frame_error(explanation: str) -> AMQPError:
    return AMQPError(c.FRAME_ERROR, explanation)


def unexpected_frame(explanation: str) -> AMQPError:
    return AMQPError(c.UNEXPECTED_FRAME, explanation)


def channel_error(explanation: str) -> AMQPError:
    return AMQPError(c.CHANNEL_ERROR, explanation)


def command_invalid(explanation: str) -> AMQPError:
    return AMQPError(c.COMMAND_INVALID, explanation)


def not_implemented(explanation: str) -> AMQPError:
    return AMQPError(c.NOT_IMPLEMENTED, explanation)


def not_allowed(explanation: str) -> AMQPError:
    return AMQPError(c.NOT_ALLOWED, explanation)


def precondition_failed(explanation: str) -> AMQPError:
    return AMQPError(c.PRECONDITION_FAILED, explanation)
