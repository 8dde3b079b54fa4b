"""The one map from the model's domain errors to AMQP reply codes."""

from __future__ import annotations

from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError
from leveret.broker.model import errors as e

REPLY_CODES: dict[type[e.BrokerError], int] = {
    e.NotFound: c.NOT_FOUND,
    e.AccessRefused: c.ACCESS_REFUSED,
    e.ResourceLocked: c.RESOURCE_LOCKED,
    e.PreconditionFailed: c.PRECONDITION_FAILED,
    e.NotImplementedFeature: c.NOT_IMPLEMENTED,
    e.NotAllowed: c.NOT_ALLOWED,
    e.CommandInvalid: c.COMMAND_INVALID,
    e.InternalError: c.INTERNAL_ERROR,
}


def to_amqp(error: e.BrokerError) -> AMQPError:
    for cls in type(error).__mro__:
        code = REPLY_CODES.get(cls)
        if code is not None:
            return AMQPError(code, error.text)
    return AMQPError(c.INTERNAL_ERROR, error.text)
