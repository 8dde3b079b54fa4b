"""The `x-delay` header as the delayed-message plugin 3.x reads it
(`rabbit_delayed_message_utils:get_delay`): an integer of any AMQP integer type as it is; a
string as Erlang's binary_to_integer reads it; a float or decimal truncated; anything else
means no delay. A delay above 0 and at most 2^32 - 1 ms holds a message.

Shared by the delayed exchange (delayed_exchange.py) and its log (delayed_log.py). Must not
know the exchange, the store or AMQP encodings. Pure functions.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Mapping
from typing import Any

MAX_DELAY_MS = 4294967295  # the plugin's ERL_MAX_T: a longer delay routes at once
_ERLANG_INT = re.compile(r"[+-]?[0-9]+")


def delay_of(headers: Mapping[str, Any]) -> int | None:
    """The plugin's get_delay: the x-delay header as an integer, or None (no delay)."""
    if "x-delay" not in headers:
        return None
    value = headers["x-delay"]
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        # binary_to_integer: the plugin's route crashes on anything else; Leveret routes it
        # at once instead (docs/DELAYED-MESSAGES.md)
        return int(text) if _ERLANG_INT.fullmatch(text) else None
    if isinstance(value, float):
        return math.trunc(value) if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        return math.trunc(value) if value.is_finite() else None
    return None


def held_delay(headers: Mapping[str, Any]) -> int | None:
    """The delay a message is held for, or None when it is routed at once."""
    delay = delay_of(headers)
    return delay if delay is not None and 0 < delay <= MAX_DELAY_MS else None
