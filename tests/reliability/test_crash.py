"""kill -9 at random moments under load; every promise holds after each restart.

The short variant (3 rounds) runs in every CI run; the slow variant (50 rounds) runs with
`pytest -m slow` and its figures go into docs/RELIABILITY.md.
"""

from __future__ import annotations

import random

import pytest
from support.brokers import BrokerProcess
from support.crash import Ledger, check, declare_topology, run_round


def crash_rounds(broker: BrokerProcess, rounds: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    declare_topology(broker.port)
    ledger = Ledger()
    restarts = []
    for _ in range(rounds):
        restarts.append(run_round(broker, ledger, rng))
        figures = check(broker, ledger)
        print("round", len(restarts), f"restart {restarts[-1]:.2f}s", figures)
    return restarts


def test_crash_consistency_short(broker_process: BrokerProcess) -> None:
    restarts = crash_rounds(broker_process, rounds=3, seed=7)
    assert len(restarts) == 3
    assert max(restarts) < 10  # a generous bound; the slow variant records real figures


@pytest.mark.slow
def test_crash_consistency_fifty_rounds(broker_process: BrokerProcess) -> None:
    restarts = crash_rounds(broker_process, rounds=50, seed=2026)
    print(f"restart seconds: max {max(restarts):.2f}, mean {sum(restarts) / len(restarts):.2f}")
