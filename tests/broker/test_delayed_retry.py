"""How a quorum queue's delayed retry is resolved from its arguments and its policy, as
rabbit_quorum_queue:get_delayed_retry_config/1 resolves it (the behaviour itself, with a real
broker and pika: tests/e2e/test_quorum_delayed_retry.py)."""

from __future__ import annotations

from typing import Any

import pytest

from leveret.broker.model.delayed_retry import DelayedRetry, resolve


@pytest.mark.parametrize(("arguments", "policy", "expected"), [
    ({}, {}, None),
    ({"x-delayed-retry-type": "all"}, {}, None),  # no min: disabled
    ({"x-delayed-retry-type": "all", "x-delayed-retry-min": 100}, {},
     DelayedRetry("all", 100, 100)),  # no max: min
    ({"x-delayed-retry-type": b"failed", "x-delayed-retry-min": 100,
      "x-delayed-retry-max": 900}, {}, DelayedRetry("failed", 100, 900)),
    # the policy's type wins; min and max are the lower of the two
    ({"x-delayed-retry-type": "failed", "x-delayed-retry-min": 100, "x-delayed-retry-max": 900},
     {"delayed-retry-type": "returned", "delayed-retry-min": 50, "delayed-retry-max": 2000},
     DelayedRetry("returned", 50, 900)),
    ({"x-delayed-retry-type": "all", "x-delayed-retry-min": 100},
     {"delayed-retry-type": "disabled"}, None),
    ({"x-delayed-retry-type": "soon", "x-delayed-retry-min": 100}, {}, None),
    ({"x-delayed-retry-type": "all", "x-delayed-retry-min": -5}, {}, None),
    ({"x-delayed-retry-type": "all", "x-delayed-retry-min": "100"}, {}, None),
    ({"x-delayed-retry-type": "all", "x-delayed-retry-min": 100, "x-delayed-retry-max": 0},
     {}, DelayedRetry("all", 100, 100)),  # an invalid max: min
])  # fmt: skip
def test_resolve(arguments: dict[str, Any], policy: dict[str, Any],
                 expected: DelayedRetry | None) -> None:
    assert resolve(arguments, policy) == expected


def test_the_wait_is_min_times_the_delivery_count_capped_at_max() -> None:
    retry = DelayedRetry("all", 100, 250)
    assert [retry.ready_at(1000, count) for count in (0, 1, 2, 3)] == [1100, 1100, 1200, 1250]
    assert str(retry) == "all (min: 100ms, max: 250ms)"
    assert retry.delays(True) and retry.delays(False)
    failed = DelayedRetry("failed", 1, 1)
    assert failed.delays(True) and not failed.delays(False)
    assert DelayedRetry("returned", 1, 1).delays(False)
    assert not DelayedRetry("returned", 1, 1).delays(True)
