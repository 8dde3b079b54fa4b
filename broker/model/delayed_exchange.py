"""Delayed exchanges: an exchange of any type that holds a message with `x-delay` until it is due.

Two ways to declare one, both registered through exchange_types.py: the delayed-message
plugin's type `x-delayed-message` with `x-delayed-type` naming the type that routes (its 406
texts when that argument is missing or wrong), and LavinMQ's `x-delayed-exchange: true` on an
exchange of any type. Either way the exchange is an instance of `delayed_variant(cls)`: the
routing type's class with `DelayedMixin` in front, so its bindings and routing are that type's.

`x-delay` is read as the plugin reads it (x_delay.py): a delay above 0 and at most 2^32 - 1
ms holds the message; any other routes it at once, untouched. The vhost's routing asks
`hold` of every delayed exchange a publish reaches (`keeps_messages`), through a binding or
as an alternate exchange too, as the plugin's route is called for each (vhost.py). A held
message is routed at its due time with its properties as published, except that `x-delay`
then reads minus the delay (the plugin's marker that the message went through the delay).

The held messages are in the exchange's log (delayed_log.py), found through the vhost's
`delayed_logs` port: on one node the exchange's own, in a folder of the vhost's
`exchange_env`; in a cluster a replicated log of the topology, whose leader routes what falls
due through this exchange (`route_due`, with each copy's id for its targets: delayed_ids.py)
and the vhost's `route_held`. This module must not know AMQP
encodings, the session or the storage engine's files.
Threading: single-threaded, on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from leveret.broker.model.delayed_ids import ID_HEADER
from leveret.broker.model.delayed_log import DelayedLog, DelayedLogs
from leveret.broker.model.delayed_store import DelayedStore
from leveret.broker.model.errors import InternalError, PreconditionFailed
from leveret.broker.model.exchange import Exchange
from leveret.broker.model.message import Confirm, InboundMessage
from leveret.broker.model.x_delay import MAX_DELAY_MS, delay_of, held_delay
from leveret.broker.process import logs

log = logs.get("leveret.delayed")
RETRY_MS = 1_000  # a copy a target refused is held again for this long
RETRIES = 120  # then it is dropped (logged, counted): two minutes of refusals

TYPE = "x-delayed-message"
TYPE_ARG = "x-delayed-type"
LAVINMQ_ARG = "x-delayed-exchange"


class DelayedMixin:
    """What a delayed exchange adds to its routing type: the hold, through its log."""

    keeps_messages = True
    delayed_log: DelayedLog | None = None  # its own log (one node), else None
    delayed_logs: DelayedLogs | None = None  # where its log is (the vhost's port)
    _vhost: Any = None
    _tries: dict[object, int] = {}

    def hold(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        delay = held_delay(message.headers)
        if delay is None:
            return False
        logs = self.delayed_logs
        target = logs.log_for(self, self._vhost) if logs is not None else None
        if target is None:
            raise InternalError("delayed exchange has no log")
        target.publish(message, confirm)
        return True

    @property
    def store(self) -> DelayedStore | None:
        """The store of the log this node holds for the exchange (None: held elsewhere)."""
        logs = self.delayed_logs
        target = logs.log_for(self, self._vhost) if logs is not None else None
        return target.store if isinstance(target, DelayedLog) else None

    def opened(self, vhost: Any) -> None:
        if vhost.exchange_env is None:
            raise InternalError("this vhost keeps no delayed messages")
        self._vhost = vhost
        self._tries = {}  # refused copies held again, by id: how often
        self.delayed_logs = vhost.delayed_logs
        self.delayed_log = self.delayed_logs.opened(self, vhost)

    def route_due(self, vhost: Any, batch: list[tuple[int, InboundMessage]],
                  log_id: str) -> None:
        """Messages fell due: each goes through this exchange's routing with x-delay set to
        minus its delay, as the plugin's swap_delay_header does, and stamped with its id in
        the log (delayed_ids.py: a target takes it once, whichever leader routes it); one
        finding no queue (even through the alternate exchange) is counted unroutable."""
        store = self.store
        for offset, held in batch:
            headers = dict(held.headers)
            ident = headers.setdefault(ID_HEADER, f"{log_id}:{offset}")  # (kept if held again)
            delay = delay_of(headers)
            if delay is not None:
                headers["x-delay"] = -delay
            done = _recorded(store, offset)
            confirm = Confirm(0, self._retry_refused(held, ident, done))
            local = Confirm(0, done)
            if not vhost.route_held(self, held.replace(headers=headers), confirm,
                                    remote_only=True, local=local) and store is not None:
                store.unroutable_total += 1
            local.seal()
            confirm.seal()

    def _retry_refused(self, held: InboundMessage, ident: object,
                       done: Callable[..., None]) -> Any:
        """The callback of a routed copy's confirm, which waits for its targets on other
        nodes only (a queue of this node takes it or refuses it as before): when one refused
        it (its node down), the message is held again, with its id, RETRY_MS from now, to be
        routed again to every target (those that took it drop the second copy), at most
        RETRIES times by this leader. Then `done` (the copy may be recorded as routed: its
        retry, if any, is in the same write, before the ROUTED record)."""

        def settled(confirm: Confirm) -> None:
            try:
                _retry(confirm)
            finally:
                done()

        def _retry(confirm: Confirm) -> None:
            tries = self._tries
            if not confirm.rejected:
                if tries:
                    tries.pop(ident, None)
                return
            store = self.store
            if store is None or not store.leading or store.closed:
                return  # deposed, or gone: a new leader routes it again, or nothing does
            count = tries.get(ident, 0) + 1
            if count > RETRIES:
                tries.pop(ident, None)
                store.refused_total += 1
                log.error("a delayed message's target kept refusing it; it is dropped",
                          exchange=getattr(self, "name", ""), id=str(ident), tries=count - 1)
                return
            tries[ident] = count
            headers = dict(held.headers)
            headers[ID_HEADER] = ident
            store.hold(held.replace(headers=headers), store.scheduler.now_ms() + RETRY_MS, None)

        return settled

    def held_info(self) -> dict[str, Any]:
        """The figures of the log this node leads ({} elsewhere: a replica keeps no index, a
        node without a member nothing; the management API asks the leader's node)."""
        store = self.store
        if store is None or not store.leading:
            return {}
        return {"messages_delayed": store.count, "next_due_ms": store.next_due(),
                "delayed_routed": store.routed_total,
                "delayed_unroutable": store.unroutable_total,
                "delayed_refused": store.refused_total}

    def commit_pending(self) -> None:
        if self.delayed_log is not None:
            self.delayed_log.commit_pending()

    def close(self) -> None:
        own = self.delayed_log
        if own is None:
            return
        if self.durable:  # type: ignore[attr-defined]
            own.close()
        else:  # a transient exchange and what it holds end with the broker
            own.store.destroy()

    def removed(self) -> None:
        if self.delayed_log is not None:
            self.delayed_log.store.destroy()
            self.delayed_log = None


_VARIANTS: dict[tuple[type[Exchange], str | None], type[Exchange]] = {}


def delayed_variant(cls: type[Exchange], type_name: str | None = None) -> type[Exchange]:
    """`cls` with the delay in front; it reports `type_name` (x-delayed-message) if given."""
    key = (cls, type_name)
    variant = _VARIANTS.get(key)
    if variant is None:
        attrs: dict[str, Any] = {"__module__": __name__}
        if type_name is not None:
            attrs["type"] = type_name
            attrs["delayed_type"] = cls.type
        variant = cast("type[Exchange]",
                       type(f"Delayed{cls.__name__}", (DelayedMixin, cls), attrs))
        _VARIANTS[key] = variant
    return variant


def delayed_type_of(arguments: Mapping[str, Any]) -> str | None:
    value = arguments.get(TYPE_ARG)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def delayed_message_type(types: Mapping[str, type[Exchange]]) -> type[Exchange]:
    """The class the registry gives `x-delayed-message` while a declaration is checked: it
    validates `x-delayed-type` against the registered `types` as the plugin does (the class
    to build is `delayed_variant` of the routing type)."""

    class DelayedMessageType(Exchange):
        type = TYPE

        @classmethod
        def validate(cls, arguments: Mapping[str, Any]) -> None:
            inner = delayed_type_of(arguments)
            if inner == TYPE:
                raise PreconditionFailed(
                    "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")
            if inner is None:
                raise PreconditionFailed(
                    "Invalid argument, 'x-delayed-type' must be an existing exchange type")
            inner_cls = types.get(inner)
            if inner_cls is None:
                raise PreconditionFailed(f"unknown exchange type '{inner}'")
            inner_cls.validate(arguments)

    return DelayedMessageType


UNKNOWN: dict[str, Any] = dict.fromkeys((
    "messages_delayed", "next_due_ms", "delayed_routed", "delayed_unroutable",
    "delayed_refused"))  # the figures while no leader of the exchange's log answers


def holds_delayed(exchange: object) -> bool:
    """Whether `exchange` is a delayed one (its figures are its log leader's)."""
    return isinstance(exchange, DelayedMixin)


def is_delayed(exchange_type: str, arguments: Mapping[str, Any]) -> bool:
    """Whether an exchange so declared is a delayed one (in a cluster its log is a record of
    its own in the topology: broker/topology/cluster.py)."""
    return exchange_type == TYPE or arguments.get(LAVINMQ_ARG) is True


def _recorded(store: DelayedStore | None, offset: int) -> Callable[..., None]:
    """Called once by the copy's remote confirm and once by its local one: at the second, the
    held message is recorded as routed (a ROUTED record). Before that a new leader routes it
    again (its targets drop a copy they took, by its id): a ROUTED record committed before a
    local quorum queue's copy is, or before a copy held again is, would lose the message with
    this node (issue 30's fault suite: docs/DELAYED-MESSAGES.md, "Under the fault suite")."""
    left = [2]
    term = store.term if store is not None else 0

    def settled(_confirm: Confirm | None = None) -> None:
        left[0] -= 1
        if left[0] == 0 and store is not None:
            store.routed_one(offset, term)

    return settled


__all__ = ["MAX_DELAY_MS", "delay_of", "held_delay"]
