"""Message rates for the management API, from cumulative counters sampled every few seconds.

RabbitMQ's API shows `message_stats` with a `<kind>_details: {"rate": r}` beside each counter.
The model keeps the counters as plain integers bumped on the hot path (a queue's
`stats_published`, `stats_delivered`, `stats_ack`...; a channel's `stats_publish`,
`stats_ack`... and its delivery tags; an exchange's `stats_publish_in`/`stats_publish_out`; a
connection's bytes); the views report them with rate 0.0. This module samples them every
`SAMPLE_S` seconds on the broker's loop (a timer: no work per message) and fills in the rates
afterwards (`fill`, a middleware) in the API's answers for the overview, vhosts, queues,
exchanges, channels and connections, so the resource modules stay unaware. With
`collect_statistics = "none"` no sampler runs and the middleware takes `message_stats` out.

Per vhost it keeps monotonic totals: each sample adds every live queue's and channel's growth
since the previous sample, so a queue deleted or a channel closed never makes a total go back.
A rate is the growth of the last interval per second. With `msg_rates_age` and `msg_rates_incr`
(seconds), every object's details also carry RabbitMQ's `samples` ({"sample": total,
"timestamp": ms}, newest first), `avg_rate` and `avg`, from the last 10 minutes of samples (an
object keeps its own counters' history while it lives). A stream's single-active-consumer
groups (`/api/leveret/consumer-groups`) get `offset_lag_details`: the rate of change of the
group's offset lag (positive: falling behind), with samples of the lag. Only this node's queues
are sampled: in a cluster, queues held by other nodes keep rate 0.0.

Runs on the broker's event loop thread; knows the model's counters, not AMQP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from aiohttp import web

from leveret.broker.management import streamops, views
from leveret.broker.management.http import BROKER, CURRENT_USER, sees_everything
from leveret.broker.model.stream import StreamQueue
from leveret.broker.process import logs

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

SAMPLE_S = 5.0
HISTORY = 120  # samples kept: 10 minutes
QUEUE_KEYS = ("publish", "deliver_get", "deliver", "deliver_no_ack", "get", "get_no_ack", "ack",
              "redeliver")
CHANNEL_KEYS = ("publish", "confirm", "return_unroutable", "deliver_get", "deliver",
                "deliver_no_ack", "get", "get_no_ack", "ack", "redeliver")
KEYS = (*QUEUE_KEYS, "confirm", "return_unroutable")  # a vhost's and the overview's
EXCHANGE_KEYS = ("publish_in", "publish_out")
CONNECTION_KEYS = ("recv_oct", "send_oct")
GROUP_KEYS = ("offset_lag",)
RATES: web.AppKey[Sampler] = web.AppKey("rates")
log = logs.get("leveret.management")

Seen = dict[int, tuple[object, tuple[int, ...]]]  # id(object) -> (the object, its counters)
History = deque[tuple[float, tuple[int, ...]]]
# an object's key, as the API shows it: a connection's or channel's name, a queue's or an
# exchange's (vhost, name), a group's (vhost, stream, reference)
Key: TypeAlias = "str | tuple[str, str] | tuple[str, str, str]"
Histories = dict[Key, tuple[object, History]]  # an object's key -> (the object, its samples)


def _record(old: Histories, new: Histories, key: Key, obj: object, stamp: float,
            values: tuple[int, ...]) -> None:
    """Append the object's counters to its history (a new one for an object not seen, or
    a new object under a name that an earlier one had)."""
    was = old.get(key)
    history: History = was[1] if was is not None and was[0] is obj else deque(maxlen=HISTORY)
    history.append((stamp, values))
    new[key] = (obj, history)


def _pick(entries: Sequence[tuple[float, int]], age_s: int, incr_s: int) -> list[dict[str, Any]]:
    """RabbitMQ's `samples` from (timestamp, value) pairs oldest first: one every `incr_s`
    over the last `age_s`, newest first."""
    cutoff = time.time() - age_s
    picked: list[dict[str, Any]] = []
    next_at: float | None = None
    for stamp, value in reversed(entries):
        if stamp < cutoff:
            break
        if next_at is not None and stamp > next_at:
            continue
        picked.append({"sample": value, "timestamp": int(stamp * 1000)})
        next_at = stamp - incr_s + SAMPLE_S / 2
    return picked


def _growth(seen: Seen, now_seen: Seen, obj: object, values: tuple[int, ...],
            first: bool) -> list[int]:
    """What `obj`'s counters grew by since the last sample (all of them for an object not
    seen before, none at the very first sample), noting its values for the next."""
    was = seen.get(id(obj))
    before = was[1] if was is not None and was[0] is obj else (
        values if first else (0,) * len(values))
    now_seen[id(obj)] = (obj, values)
    return [max(0, v - b) for v, b in zip(values, before, strict=True)]


class Sampler:
    """Monotonic per-vhost totals and per-object counters, with the last interval's rates."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.totals: dict[str, dict[str, int]] = {}  # vhost -> key -> monotonic total
        self.history: deque[tuple[float, dict[str, dict[str, int]]]] = deque(maxlen=HISTORY)
        self.vhost_rates: dict[str, dict[str, float]] = {}
        self.queue_rates: dict[tuple[str, str], dict[str, float]] = {}
        self.exchange_rates: dict[tuple[str, str], dict[str, float]] = {}
        self.channel_rates: dict[str, dict[str, float]] = {}
        self.connection_rates: dict[str, dict[str, float]] = {}
        self.group_rates: dict[tuple[str, str, str], dict[str, float]] = {}
        self.histories: dict[str, Histories] = {"queue": {}, "exchange": {}, "channel": {},
                                                "connection": {}, "group": {}}
        self._seen: dict[str, Seen] = {"queue": {}, "exchange": {}, "channel": {},
                                       "connection": {}}
        self._last: float | None = None

    def sample(self, now: float | None = None) -> None:
        """Take one sample: add each object's growth to its vhost's totals, derive rates."""
        now = time.monotonic() if now is None else now
        stamp = time.time()
        hist = self.histories
        kept: dict[str, Histories] = {kind: {} for kind in hist}
        first = self._last is None
        dt = max(1e-3, now - self._last) if self._last is not None else 0.0
        per_s = (1.0 / dt) if dt else 0.0
        growth: dict[str, dict[str, int]] = {}
        seen = self._seen
        fresh: dict[str, Seen] = {kind: {} for kind in seen}
        queue_rates: dict[tuple[str, str], dict[str, float]] = {}
        exchange_rates: dict[tuple[str, str], dict[str, float]] = {}
        group_rates: dict[tuple[str, str, str], dict[str, float]] = {}
        for vhost in self.broker.vhosts.values():
            grown = growth.setdefault(vhost.name, dict.fromkeys(KEYS, 0))
            for queue in vhost.queues.values():
                counts = views.queue_counts(queue)
                values = tuple(counts[k] for k in QUEUE_KEYS)
                _record(hist["queue"], kept["queue"], (vhost.name, queue.name), queue, stamp,
                        values)
                deltas = _growth(seen["queue"], fresh["queue"], queue, values, first)
                for key, delta in zip(QUEUE_KEYS, deltas, strict=True):
                    grown[key] += delta
                queue_rates[(vhost.name, queue.name)] = {
                    k: d * per_s for k, d in zip(QUEUE_KEYS, deltas, strict=True)}
                if queue.type == "stream" and isinstance(queue, StreamQueue) and queue.groups:
                    self._sample_groups(queue, stamp, per_s, kept["group"], group_rates)
            for exchange in vhost.exchanges.values():
                values = (exchange.stats_publish_in, exchange.stats_publish_out)
                _record(hist["exchange"], kept["exchange"], (vhost.name, exchange.name),
                        exchange, stamp, values)
                deltas = _growth(seen["exchange"], fresh["exchange"], exchange, values, first)
                exchange_rates[(vhost.name, exchange.name)] = {
                    k: d * per_s for k, d in zip(EXCHANGE_KEYS, deltas, strict=True)}
        channel_rates: dict[str, dict[str, float]] = {}
        connection_rates: dict[str, dict[str, float]] = {}
        for session in list(self.broker.connections):
            where = getattr(session, "vhost", None)
            if where is None or not hasattr(session, "channels"):
                continue
            values = (int(session.bytes_received), int(session.bytes_sent))
            connection = views.connection_name(session)
            _record(hist["connection"], kept["connection"], connection, session, stamp, values)
            deltas = _growth(seen["connection"], fresh["connection"], session, values, first)
            connection_rates[connection] = {
                k: d * per_s for k, d in zip(CONNECTION_KEYS, deltas, strict=True)}
            grown = growth.setdefault(where.name, dict.fromkeys(KEYS, 0))
            for channel in list(session.channels.values()):
                counts = views.channel_counts(channel)
                values = tuple(counts[k] for k in CHANNEL_KEYS)
                name = views.channel_name(session, channel)
                _record(hist["channel"], kept["channel"], name, channel, stamp, values)
                deltas = _growth(seen["channel"], fresh["channel"], channel, values, first)
                rates = {k: d * per_s for k, d in zip(CHANNEL_KEYS, deltas, strict=True)}
                channel_rates[name] = rates
                grown["confirm"] += deltas[1]
                grown["return_unroutable"] += deltas[2]
        self._seen = fresh
        self.histories = kept
        for name, grown in growth.items():
            total = self.totals.setdefault(name, dict.fromkeys(KEYS, 0))
            for key in KEYS:
                total[key] += grown[key]
        if dt:
            self.vhost_rates = {name: {k: v * per_s for k, v in grown.items()}
                                for name, grown in growth.items()}
            self.queue_rates = queue_rates
            self.exchange_rates = exchange_rates
            self.channel_rates = channel_rates
            self.connection_rates = connection_rates
            self.group_rates = group_rates
        self._last = now
        self.history.append((stamp, {n: dict(t) for n, t in self.totals.items()}))

    def _sample_groups(self, stream: StreamQueue, stamp: float, per_s: float, kept: Histories,
                       rates: dict[tuple[str, str, str], dict[str, float]]) -> None:
        """A group's lag is a level, not a counter: its rate is the change since the last
        sample, negative when the group catches up (a group new since then: 0.0)."""
        for reference, lag in streamops.group_lags(stream).items():
            key = (stream.vhost.name, stream.name, reference)
            was = self.histories["group"].get(key)
            before = was[1][-1][1][0] if was is not None and was[0] is stream else lag
            _record(self.histories["group"], kept, key, stream, stamp, (lag,))
            rates[key] = {"offset_lag": (lag - before) * per_s}

    # -- what a request sees -------------------------------------------------------------------

    def overview_rates(self, vhosts: set[str] | None) -> dict[str, float]:
        out = dict.fromkeys(KEYS, 0.0)
        for name, rates in self.vhost_rates.items():
            if vhosts is None or name in vhosts:
                for key in KEYS:
                    out[key] += rates.get(key, 0.0)
        return out

    def samples(self, vhosts: set[str] | None, age_s: int, incr_s: int,
                key: str) -> list[dict[str, Any]]:
        """RabbitMQ's `samples`: the total every `incr_s` over the last `age_s`, newest
        first."""
        return _pick([(stamp, sum(t.get(key, 0) for n, t in totals.items()
                                  if vhosts is None or n in vhosts))
                      for stamp, totals in self.history], age_s, incr_s)

    def object_samples(self, kind: str, name: Key, keys: tuple[str, ...], age_s: int,
                       incr_s: int, key: str) -> list[dict[str, Any]]:
        """An object's `samples` of one counter (its value then), newest first; none for an
        object the sampler has not seen yet."""
        found = self.histories[kind].get(name)
        if found is None:
            return []
        at = keys.index(key)
        return _pick([(stamp, values[at]) for stamp, values in found[1]], age_s, incr_s)


def _ages(request: web.Request) -> tuple[int, int] | None:
    try:
        age = int(request.query.get("msg_rates_age", ""))
        incr = int(request.query.get("msg_rates_incr", ""))
    except ValueError:
        return None
    return (age, incr) if age > 0 and incr > 0 else None


def _details(rate: float, samples: list[dict[str, Any]] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"rate": round(rate, 1)}
    if samples is not None:
        out["samples"] = samples
        if len(samples) >= 2:
            newest, oldest = samples[0], samples[-1]
            span = (newest["timestamp"] - oldest["timestamp"]) / 1000
            out["avg_rate"] = round((newest["sample"] - oldest["sample"]) / span, 1) \
                if span > 0 else 0.0
        else:
            out["avg_rate"] = 0.0
        out["avg"] = (sum(s["sample"] for s in samples) / len(samples)) if samples else 0.0
    return out


def _visible_vhosts() -> set[str] | None:
    user = CURRENT_USER.get(None)
    return None if user is None or sees_everything(user) else set(user.permissions)


def _fill_overview(sampler: Sampler, request: web.Request, data: dict[str, Any]) -> None:
    stats = data.get("message_stats")
    if not isinstance(stats, dict):
        return
    vhosts = _visible_vhosts()
    rates = sampler.overview_rates(vhosts)
    ages = _ages(request)
    for key in KEYS:
        if f"{key}_details" in stats:
            samples = sampler.samples(vhosts, *ages, key) if ages else None
            stats[f"{key}_details"] = _details(rates[key], samples)
    if "rates_mode" in data:  # not when the request's `columns` left it out
        data["rates_mode"] = "basic"


def _fill_item(item: object, rates: dict[str, float] | None, field: str = "message_stats",
               samples: Callable[[str], list[dict[str, Any]]] | None = None) -> None:
    """Each `<kind>_details` of the item's `field` (the item itself for "") gets the rate."""
    if not isinstance(item, dict) or rates is None:
        return
    stats = item.get(field) if field else item
    if not isinstance(stats, dict):
        return
    for key, rate in rates.items():
        if f"{key}_details" in stats:
            stats[f"{key}_details"] = _details(rate, samples(key) if samples else None)


def _kind(raw_path: str) -> str | None:
    """Which objects an /api answer lists, by its path (quoted, so a `/` in a name is %2F):
    a list, a vhost's list or one object; None for the rest (bindings, permissions...)."""
    parts = raw_path.rstrip("/").split("/")[1:]
    if len(parts) < 2 or parts[0] != "api":
        return None
    if parts[1:3] == ["leveret", "consumer-groups"] and len(parts) in (3, 4, 6):
        return "group"
    if parts[1] == "leveret":
        return None
    if parts[-1] == "channels" or (parts[1] == "channels" and len(parts) <= 3):
        return "channel"
    if parts[-1] == "connections" or (parts[1] == "connections" and len(parts) <= 3):
        return "connection"
    if parts[1] in ("queues", "exchanges") and len(parts) <= 4:
        return parts[1][:-1]
    if parts[1] == "vhosts" and len(parts) <= 3:
        return "vhost"
    return None


def _fill(sampler: Sampler, request: web.Request, kind: str, item: object) -> None:
    if not isinstance(item, dict):
        return
    ages = _ages(request)

    def samples(name: Key, keys: tuple[str, ...]) -> Callable[[str], list[dict[str, Any]]] | None:
        if ages is None:
            return None
        return lambda k: sampler.object_samples(kind, name, keys, *ages, k)

    # the names the rates are kept under (a missing one is "", which names nothing here)
    key = (item.get("vhost", ""), item.get("name", ""))
    if kind == "queue":
        _fill_item(item, sampler.queue_rates.get(key),
                   samples=samples(key, QUEUE_KEYS))
    elif kind == "exchange":
        _fill_item(item, sampler.exchange_rates.get(key),
                   samples=samples(key, EXCHANGE_KEYS))
    elif kind == "channel":
        name = item.get("name", "")
        _fill_item(item, sampler.channel_rates.get(name),
                   samples=samples(name, CHANNEL_KEYS))
    elif kind == "connection":
        name = item.get("name", "")
        _fill_item(item, sampler.connection_rates.get(name),
                   field="", samples=samples(name, CONNECTION_KEYS))
    elif kind == "group":
        group = (item.get("vhost", ""), item.get("stream", ""), item.get("reference", ""))
        _fill_item(item, sampler.group_rates.get(group, {"offset_lag": 0.0}),
                   field="", samples=samples(group, GROUP_KEYS))
    elif kind == "vhost":
        name = str(item.get("name"))
        in_vhost = (lambda k: sampler.samples({name}, *ages, k)) if ages else None
        stats = item.get("message_stats")
        if isinstance(stats, dict):  # counted by channels, which come and go: the totals
            for counted in ("confirm", "return_unroutable"):
                if counted in stats:
                    stats[counted] = sampler.totals.get(name, {}).get(counted, 0)
        _fill_item(item, sampler.vhost_rates.get(name, dict.fromkeys(KEYS, 0.0)),
                   samples=in_vhost)


def _strip(data: dict[str, Any], kind: str | None, item: object) -> None:
    """collect_statistics none: no message statistics, as RabbitMQ's API then shows."""
    if kind is None:  # the overview
        if "message_stats" in data:
            data["message_stats"] = {}
    elif kind == "group" and isinstance(item, dict):
        item.pop("offset_lag_details", None)
    elif isinstance(item, dict):
        item.pop("message_stats", None)


@web.middleware
async def fill(request: web.Request,
               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
               ) -> web.StreamResponse:
    response = await handler(request)
    if (request.method != "GET" or response.status != 200
            or not isinstance(response, web.Response) or response.body is None):
        return response
    overview = request.path == "/api/overview"
    kind = None if overview else _kind(request.rel_url.raw_path)
    if not overview and kind is None:
        return response
    sampler = request.app.get(RATES)
    off = request.app[BROKER].config.collect_statistics == "none"
    if sampler is None and not off:
        return response
    body = response.body
    if not isinstance(body, bytes | bytearray):  # a Payload: not an answer built as JSON
        return response
    try:
        data = json.loads(bytes(body))
    except (TypeError, ValueError):
        return response
    if overview:
        if isinstance(data, dict):
            if off:
                _strip(data, None, data)
            elif sampler is not None:
                _fill_overview(sampler, request, data)
    else:
        assert kind is not None
        items = data.get("items") if isinstance(data, dict) and "items" in data else data
        for item in items if isinstance(items, list) else [items]:
            if off:
                _strip(data, kind, item)
            elif sampler is not None:
                _fill(sampler, request, kind, item)
    response.body = json.dumps(data, ensure_ascii=False).encode("utf-8")
    return response


async def _run(app: web.Application) -> AsyncIterator[None]:
    if app[BROKER].config.collect_statistics == "none":
        yield  # no sampler, no rates (the counters cost too little to switch off)
        return
    sampler = Sampler(app[BROKER])
    app[RATES] = sampler

    async def loop() -> None:
        while True:
            try:
                sampler.sample()
            except Exception:  # one bad sample must not stop the rates for good
                log.exception("rates sample failed")
            await asyncio.sleep(SAMPLE_S)

    task = asyncio.get_running_loop().create_task(loop())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def setup(app: web.Application) -> None:
    app.cleanup_ctx.append(_run)
