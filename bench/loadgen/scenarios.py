"""The benchmark scenarios of issue 8 by letter, and the one entry point that runs one.

(a) to (e), (h), (i) and (q) live in throughput.py; (f), (g) and (m) in capacity.py; (j) in
connections.py; what they share in common.py. A scenario that raises becomes one result line
with ok: false and the error.

It must not know any broker. Threading contract: main thread.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from loadgen.capacity import scenario_f, scenario_g, scenario_m
from loadgen.common import Options, result
from loadgen.connections import scenario_j
from loadgen.measure import BrokerProbe
from loadgen.throughput import (
    scenario_a,
    scenario_b,
    scenario_c,
    scenario_d,
    scenario_e,
    scenario_h,
    scenario_i,
    scenario_q,
)

__all__ = ["SCENARIOS", "Options", "run"]

SCENARIOS: dict[str, Callable[[Options, BrokerProbe], list[dict]]] = {
    "a": scenario_a,
    "b": scenario_b,
    "c": scenario_c,
    "d": scenario_d,
    "e": scenario_e,
    "f": scenario_f,
    "g": scenario_g,
    "h": scenario_h,
    "i": scenario_i,
    "j": scenario_j,
    "m": scenario_m,
    "q": scenario_q,
}


def run(scenario: str, opts: Options) -> list[dict]:
    probe = BrokerProbe(opts.broker_pids)
    try:
        return SCENARIOS[scenario](opts, probe)
    except Exception as exc:  # noqa: BLE001 - one failed scenario is one ok:false line
        return [
            result(
                opts,
                scenario,
                messages=0,
                seconds=1e-9,
                cpu=None,
                loadgen_cpu=None,
                errors=[f"{type(exc).__name__}: {exc}"],
                traceback=traceback.format_exc().splitlines()[-6:],
            )
        ]
