"""The exchange types a declaration may name, and the class of each: the one place a type is
registered. A leaf of the model (it imports the types' modules only); no I/O.
"""

from __future__ import annotations

from leveret.broker.model.consistent_hash_exchange import ConsistentHashExchange
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
EXCHANGE_TYPES = tuple(_TYPES)


def exchange_class(type_name: str) -> type[Exchange] | None:
    return _TYPES.get(type_name)
