"""Exchanges and their routing: direct, fanout, topic and headers.

An exchange holds its bindings and answers "which destinations does this message go to" for
its own bindings only; following exchange-to-exchange bindings and alternate exchanges is the
vhost's job. Topic keys are matched exactly as RabbitMQ does (`*` is one word, `#` is zero or
more, empty words count). Single-threaded; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from leveret.broker.model.binding import Binding, BindingKey, erlang_term, wire_type_name
from leveret.broker.model.errors import PreconditionFailed

if TYPE_CHECKING:
    from leveret.broker.model.dedup import DedupCache

X_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")


class Exchange:
    """Base exchange: bindings kept in insertion order, routing left to the type."""

    kind = "exchange"
    type = ""
    # messages published to it, and copies it routed to queues (the management API's
    # publish_in and publish_out; a channel counts them)
    stats_publish_in = 0
    stats_publish_out = 0

    def __init__(
        self,
        vhost: str,
        name: str,
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        self.bindings: dict[BindingKey, Binding] = {}
        self.dedup: DedupCache | None = None  # an exchange-level deduplication cache
        self._index_init()

    @property
    def alternate_exchange(self) -> str | None:
        value = self.arguments.get("alternate-exchange")
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return value if isinstance(value, str) else None

    @classmethod
    def validate(cls, arguments: Mapping[str, Any]) -> None:
        """Raise a domain error if a new exchange's arguments are invalid for this type."""

    def check_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        """Raise a domain error if a binding's arguments are invalid for this type."""

    def add(self, binding: Binding) -> bool:
        key = binding.key
        if key in self.bindings:
            return False
        self.bindings[key] = binding
        self._index_add(binding)
        return True

    def remove(self, binding_key: BindingKey) -> Binding | None:
        binding = self.bindings.pop(binding_key, None)
        if binding is not None:
            self._index_remove(binding)
        return binding

    def bindings_to(self, destination: object) -> list[Binding]:
        return [b for b in self.bindings.values() if b.destination is destination]

    def restored(self) -> None:
        """Called once a restart has restored the exchange and all its bindings."""

    def _index_init(self) -> None:
        """Set up the type's routing index (the constructor's last step)."""

    def _index_add(self, binding: Binding) -> None:
        pass

    def _index_remove(self, binding: Binding) -> None:
        pass

    def route(self, routing_keys: Iterable[str], headers: Mapping[str, Any]) -> list[Any]:
        raise NotImplementedError

    # -- an exchange that keeps messages (a delayed exchange: delayed_exchange.py) ----------

    # whether the vhost's routing asks `hold` of it wherever a publish reaches it (the
    # exchange published to, through an exchange-to-exchange binding, as an alternate one)
    keeps_messages = False

    def hold(self, message: Any, confirm: Any) -> bool:
        """Take `message` to route later instead of now (True); `confirm` is settled once it
        is kept. A plain exchange holds nothing."""
        return False

    def opened(self, vhost: Any) -> None:
        """The exchange joined `vhost`: open what it keeps (raises a domain or storage error)."""

    def removed(self) -> None:
        """The exchange was deleted: drop what it keeps."""

    def commit_pending(self) -> None:
        """Shutdown, before connections close: commit what it keeps."""

    def close(self) -> None:
        """Shutdown: release what it keeps (it stays for the next start)."""

    def held_info(self) -> dict[str, Any]:
        """The management API's figures of what it keeps ({} for a plain exchange)."""
        return {}

    def route_message(self, routing_keys: Iterable[str], headers: Mapping[str, Any],
                      message: Any) -> list[Any]:
        """Route with the whole message at hand (a type that reads its properties)."""
        return self.route(routing_keys, headers)

    @property
    def routes_by_properties(self) -> bool:
        """Whether `route_message` reads the message's properties: then two messages with the
        same routing key and headers may go to different queues."""
        return False


class DirectExchange(Exchange):
    type = "direct"

    def _index_init(self) -> None:
        self._by_key: dict[str, dict[Any, int]] = {}

    def _index_add(self, binding: Binding) -> None:
        dests = self._by_key.setdefault(binding.routing_key, {})
        dests[binding.destination] = dests.get(binding.destination, 0) + 1

    def _index_remove(self, binding: Binding) -> None:
        dests = self._by_key[binding.routing_key]
        count = dests[binding.destination] - 1
        if count:
            dests[binding.destination] = count
        else:
            del dests[binding.destination]
            if not dests:
                del self._by_key[binding.routing_key]

    def route(self, routing_keys: Iterable[str], headers: Mapping[str, Any]) -> list[Any]:
        if isinstance(routing_keys, str):
            dests = self._by_key.get(routing_keys)
            return list(dests) if dests else []
        out: dict[Any, None] = {}
        for key in routing_keys:
            dests = self._by_key.get(key)
            if dests:
                out.update(dict.fromkeys(dests))
        return list(out)


class FanoutExchange(Exchange):
    type = "fanout"

    def route(self, routing_keys: Iterable[str], headers: Mapping[str, Any]) -> list[Any]:
        return list(dict.fromkeys(b.destination for b in self.bindings.values()))


def split_topic(key: str) -> list[str]:
    return key.split(".") if key else []


class _TopicNode:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        self.destinations: dict[Any, int] = {}


class TopicExchange(Exchange):
    type = "topic"

    def _index_init(self) -> None:
        self._root = _TopicNode()

    def _index_add(self, binding: Binding) -> None:
        node = self._root
        for word in split_topic(binding.routing_key):
            node = node.children.setdefault(word, _TopicNode())
        node.destinations[binding.destination] = node.destinations.get(binding.destination, 0) + 1

    def _index_remove(self, binding: Binding) -> None:
        path = [self._root]
        words = split_topic(binding.routing_key)
        for word in words:
            path.append(path[-1].children[word])
        node = path[-1]
        count = node.destinations[binding.destination] - 1
        if count:
            node.destinations[binding.destination] = count
        else:
            del node.destinations[binding.destination]
        for parent, word, child in zip(
            reversed(path[:-1]), reversed(words), reversed(path[1:]), strict=True
        ):
            if child.children or child.destinations:
                break
            del parent.children[word]

    def route(self, routing_keys: Iterable[str], headers: Mapping[str, Any]) -> list[Any]:
        out: dict[Any, None] = {}
        for key in [routing_keys] if isinstance(routing_keys, str) else routing_keys:
            _match(self._root, split_topic(key), 0, out)
        return list(out)


def _match(node: _TopicNode, words: list[str], i: int, out: dict[Any, None]) -> None:
    children = node.children
    if i == len(words):
        if node.destinations:
            out.update(dict.fromkeys(node.destinations))
    else:
        child = children.get(words[i])
        if child is not None:
            _match(child, words, i + 1, out)
        star = children.get("*")
        if star is not None:
            _match(star, words, i + 1, out)
    hash_node = children.get("#")
    if hash_node is not None:
        for j in range(i, len(words) + 1):
            _match(hash_node, words, j, out)


class HeadersExchange(Exchange):
    type = "headers"

    def check_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        if "x-match" not in arguments:
            return
        value = arguments["x-match"]
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str):
            raise PreconditionFailed(
                f"Invalid x-match field type {wire_type_name(value)} "
                f"(value {erlang_term(value)}); "
                "expected longstr"
            )
        if value not in X_MATCH_VALUES:
            raise PreconditionFailed(
                f'Invalid x-match field value <<"{value}">>; expected all, any, all-with-x, '
                "or any-with-x"
            )

    def route(self, routing_keys: Iterable[str], headers: Mapping[str, Any]) -> list[Any]:
        out: dict[Any, None] = {}
        for binding in self.bindings.values():
            if binding.destination not in out and headers_match(binding.arguments, headers):
                out[binding.destination] = None
        return list(out)


def headers_match(arguments: dict[str, Any], headers: Mapping[str, Any]) -> bool:
    """RabbitMQ's headers-exchange match of one binding against a message's headers."""
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode("utf-8", "replace")
    with_x: bool = mode.endswith("-with-x")
    want_all: bool = mode.startswith("all")
    for key, expected in arguments.items():
        if key == "x-match" or (not with_x and key.startswith("x-")):
            continue
        present = key in headers
        ok = present and (expected is None or _same_value(expected, headers[key]))
        if want_all and not ok:
            return False
        if ok and not want_all:
            return True
    return want_all


def _same_value(a: object, b: object) -> bool:
    """RabbitMQ compares the values only, not their AMQP types: a longstr and a byte array
    with the same bytes are equal, and so are a short and a long with the same value."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, str | bytes | bytearray) and isinstance(b, str | bytes | bytearray):
        return _raw(a) == _raw(b)
    return type(a) is type(b) and a == b


def _raw(value: str | bytes | bytearray) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)
