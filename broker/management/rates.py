"""Message rates for the management API, from cumulative counters sampled every few seconds.

RabbitMQ's API shows `message_stats` with a `<counter>_details: {"rate": r}` beside each
counter. Leveret already keeps the counters (a queue's `stats_published` and
`stats_delivered`, a confirm channel's `confirms.confirmed`); the views report them with rate
0.0. This module samples them every `SAMPLE_S` seconds on the broker's loop (a timer: no work
per message) and fills in the rates afterwards, in the API's answers for `/api/overview` and
`/api/queues[/{vhost}[/{name}]]` (`fill`, a middleware), so the resource modules stay unaware.

Per vhost it keeps monotonic totals (publish, deliver_get, deliver, confirm): each sample adds
every live queue's and channel's growth since the previous sample, so a queue deleted or a
channel closed never makes a total go back. A rate is the growth of the last interval per
second. With `msg_rates_age` and `msg_rates_incr` (seconds), the overview's details also carry
RabbitMQ's `samples` ({"sample": total, "timestamp": ms}, newest first), `avg_rate` and `avg`,
from the last 10 minutes of samples. Only this node's queues are sampled: in a cluster, queues
held by other nodes keep rate 0.0.

Runs on the broker's event loop thread; knows the model's counters, not AMQP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from leveret.broker.management.http import BROKER, CURRENT_USER, sees_everything

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

SAMPLE_S = 5.0
HISTORY = 120  # samples kept: 10 minutes
KEYS = ("publish", "deliver_get", "deliver", "confirm")
RATES: web.AppKey[Sampler] = web.AppKey("rates")


class Sampler:
    """Monotonic per-vhost totals and per-queue counters, with the last interval's rates."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.totals: dict[str, dict[str, int]] = {}  # vhost -> key -> monotonic total
        self.history: deque[tuple[float, dict[str, dict[str, int]]]] = deque(maxlen=HISTORY)
        self.vhost_rates: dict[str, dict[str, float]] = {}
        self.queue_rates: dict[tuple[str, str], dict[str, float]] = {}
        self._queues: dict[int, tuple[Any, int, int]] = {}  # id -> (queue, published, delivered)
        self._channels: dict[int, tuple[Any, int]] = {}  # id -> (channel, confirmed)
        self._last: float | None = None

    def sample(self, now: float | None = None) -> None:
        """Take one sample: add each object's growth to its vhost's totals, derive rates."""
        now = time.monotonic() if now is None else now
        first = self._last is None
        dt = max(1e-3, now - self._last) if self._last is not None else 0.0
        growth: dict[str, dict[str, int]] = {}
        queues: dict[int, tuple[Any, int, int]] = {}
        queue_rates: dict[tuple[str, str], dict[str, float]] = {}
        for vhost in self.broker.vhosts.values():
            grown = growth.setdefault(vhost.name, dict.fromkeys(KEYS, 0))
            for queue in vhost.queues.values():
                published = int(getattr(queue, "stats_published", 0))
                delivered = int(getattr(queue, "stats_delivered", 0))
                seen = self._queues.get(id(queue))
                before = (seen[1], seen[2]) if seen is not None and seen[0] is queue else (
                    (published, delivered) if first else (0, 0))
                queues[id(queue)] = (queue, published, delivered)
                d_pub, d_del = max(0, published - before[0]), max(0, delivered - before[1])
                grown["publish"] += d_pub
                grown["deliver_get"] += d_del
                grown["deliver"] += d_del
                if dt:
                    queue_rates[(vhost.name, queue.name)] = {
                        "publish": d_pub / dt, "deliver_get": d_del / dt, "deliver": d_del / dt}
        channels: dict[int, tuple[Any, int]] = {}
        for session in list(self.broker.connections):
            where = getattr(session, "vhost", None)
            if where is None:
                continue
            grown = growth.setdefault(where.name, dict.fromkeys(KEYS, 0))
            for channel in list(getattr(session, "channels", {}).values()):
                confirms = getattr(channel, "confirms", None)
                if confirms is None:
                    continue
                confirmed = int(confirms.confirmed)
                seen_channel = self._channels.get(id(channel))
                before_c = seen_channel[1] if seen_channel is not None and \
                    seen_channel[0] is channel else (confirmed if first else 0)
                channels[id(channel)] = (channel, confirmed)
                grown["confirm"] += max(0, confirmed - before_c)
        self._queues, self._channels = queues, channels
        for name, grown in growth.items():
            total = self.totals.setdefault(name, dict.fromkeys(KEYS, 0))
            for key in KEYS:
                total[key] += grown[key]
        if dt:
            self.vhost_rates = {name: {k: v / dt for k, v in grown.items()}
                                for name, grown in growth.items()}
            self.queue_rates = queue_rates
        self._last = now
        stamp = time.time()
        self.history.append((stamp, {n: dict(t) for n, t in self.totals.items()}))

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
        cutoff = time.time() - age_s
        picked: list[dict[str, Any]] = []
        next_at: float | None = None
        for stamp, totals in reversed(self.history):
            if stamp < cutoff:
                break
            if next_at is not None and stamp > next_at:
                continue
            value = sum(t.get(key, 0) for n, t in totals.items()
                        if vhosts is None or n in vhosts)
            picked.append({"sample": value, "timestamp": int(stamp * 1000)})
            next_at = stamp - incr_s + SAMPLE_S / 2
        return picked


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


def _fill_overview(sampler: Sampler, request: web.Request, data: dict[str, Any]) -> None:
    stats = data.get("message_stats")
    if not isinstance(stats, dict):
        return
    user = CURRENT_USER.get(None)
    vhosts = None if user is None or sees_everything(user) else set(user.permissions)
    rates = sampler.overview_rates(vhosts)
    ages = _ages(request)
    for key in KEYS:
        if f"{key}_details" in stats:
            samples = sampler.samples(vhosts, *ages, key) if ages else None
            stats[f"{key}_details"] = _details(rates[key], samples)
    if "rates_mode" in data:  # not when the request's `columns` left it out
        data["rates_mode"] = "basic"


def _fill_queue(sampler: Sampler, item: Any) -> None:
    if not isinstance(item, dict):
        return
    stats = item.get("message_stats")
    rates = sampler.queue_rates.get((item.get("vhost"), item.get("name")))  # type: ignore[arg-type]
    if not isinstance(stats, dict) or rates is None:
        return
    for key, rate in rates.items():
        if f"{key}_details" in stats:
            stats[f"{key}_details"] = {"rate": round(rate, 1)}


def _is_queue_path(raw_path: str) -> bool:
    """/api/queues, /api/queues/{vhost} or /api/queues/{vhost}/{name} (quoted, so a `/` in a
    name is `%2F`)."""
    parts = raw_path.split("/")
    return parts[1:3] == ["api", "queues"] and len(parts) <= 5


@web.middleware
async def fill(request: web.Request,
               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
               ) -> web.StreamResponse:
    response = await handler(request)
    sampler = request.app.get(RATES)
    if (sampler is None or request.method != "GET" or response.status != 200
            or not isinstance(response, web.Response) or response.body is None):
        return response
    overview = request.path == "/api/overview"
    if not overview and not _is_queue_path(request.rel_url.raw_path):
        return response
    try:
        data = json.loads(bytes(response.body))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return response
    if overview and isinstance(data, dict):
        _fill_overview(sampler, request, data)
    else:
        items = data.get("items") if isinstance(data, dict) and "items" in data else data
        for item in items if isinstance(items, list) else [items]:
            _fill_queue(sampler, item)
    response.body = json.dumps(data, ensure_ascii=False).encode("utf-8")
    return response


async def _run(app: web.Application) -> AsyncIterator[None]:
    sampler = Sampler(app[BROKER])
    app[RATES] = sampler

    async def loop() -> None:
        while True:
            sampler.sample()
            await asyncio.sleep(SAMPLE_S)

    task = asyncio.get_running_loop().create_task(loop())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def setup(app: web.Application) -> None:
    app.cleanup_ctx.append(_run)
