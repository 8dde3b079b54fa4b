"""The exchange types a declaration may name, and the class of each: the one place a type is
registered. A leaf of the model (it imports the types' modules only); no I/O. A delayed
exchange (delayed_exchange.py) is any registered type with the delay in front.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from leveret.broker.model.consistent_hash_exchange import ConsistentHashExchange
from leveret.broker.model.delayed_exchange import (
    LAVINMQ_ARG,
    delayed_message_type,
    delayed_type_of,
    delayed_variant,
)
from leveret.broker.model.delayed_exchange import TYPE as DELAYED_TYPE
from leveret.broker.model.exchange import (
    DirectExchange,
    Exchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
)
from leveret.broker.model.modulus_hash_exchange import ModulusHashExchange

_TYPES: dict[str, type[Exchange]] = {
    cls.type: cls
    for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange,
                ConsistentHashExchange, ModulusHashExchange)
}
EXCHANGE_TYPES = (*_TYPES, DELAYED_TYPE)
_DELAYED_CHECK = delayed_message_type(_TYPES)


def exchange_class(type_name: str,
                   arguments: Mapping[str, Any] | None = None) -> type[Exchange] | None:
    """The class of `type_name`, or None for an unknown type. Given the declaration's
    `arguments`, the class to build: a delayed exchange (`x-delayed-message` with its
    `x-delayed-type`, or LavinMQ's `x-delayed-exchange: true`) is its routing type's class
    with the delay in front (delayed_exchange.py)."""
    if type_name == DELAYED_TYPE:
        inner = _TYPES.get(delayed_type_of(arguments or {}) or "")
        if arguments is None or inner is None:
            return _DELAYED_CHECK
        return delayed_variant(inner, DELAYED_TYPE)
    cls = _TYPES.get(type_name)
    if cls is not None and arguments is not None and arguments.get(LAVINMQ_ARG) is True:
        return delayed_variant(cls)
    return cls
