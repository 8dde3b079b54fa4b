"""Random schedules of appends, deliveries, lost links, elections, crashes and late topology
updates against the real replication state machines (tests/faults/simulation.py), with the
invariants of docs/REPLICATION.md checked after every step, and, once the faults stop, the
stream must converge: every member the same committed log, everything published committed."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from .simulation import Simulation, VirtualClockLoop

NODES = ["n1", "n2", "n3"]
node = st.sampled_from(NODES)


class Replication(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="leveret-sim-"))
        self.loop = VirtualClockLoop()
        self.sim = self.loop.run_until_complete(self._start())

    async def _start(self) -> Simulation:
        sim = Simulation(self.root)
        await sim.settle()
        return sim

    def _do(self, step: Callable[..., None], *args: Any) -> None:
        """One step inside the loop, then every task as far as it goes."""
        async def run() -> None:
            step(*args)
            await self.sim.settle()
        self.loop.run_until_complete(run())

    @rule(name=node, count=st.integers(1, 3))
    def publish(self, name: str, count: int) -> None:
        self._do(self.sim.publish, name, count)

    @rule(index=st.integers(0, 5), times=st.integers(1, 6))
    def deliver(self, index: int, times: int) -> None:
        for _ in range(times):
            self._do(self.sim.deliver, index)

    @rule(a=node, b=node)
    def sever(self, a: str, b: str) -> None:
        if a != b:
            self._do(self.sim.sever, a, b)

    @rule(a=node, b=node)
    def heal(self, a: str, b: str) -> None:
        self._do(self.sim.heal, a, b)

    @rule(seconds=st.sampled_from([0.2, 1.0, 5.0]))
    def wait(self, seconds: float) -> None:
        self._do(self.sim.wait, seconds)

    @rule(name=node)
    def elect(self, name: str) -> None:
        self._do(self.sim.elect, name)

    @rule(name=node)
    def apply(self, name: str) -> None:
        self._do(self.sim.apply, name)

    @rule(name=node)
    def crash(self, name: str) -> None:
        self._do(self.sim.crash, name)

    @rule(name=node)
    def restart(self, name: str) -> None:
        self._do(self.sim.restart, name)

    @invariant()
    def safe(self) -> None:
        self.sim.check()
        assert not self.sim.violations, self.sim.violations

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self._drain())
        finally:
            for node_ in self.sim.nodes.values():
                if node_.log is not None:
                    node_.log.close()
            self.loop.run_until_complete(self._cancel_all())
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    async def _cancel_all() -> None:
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _drain(self) -> None:
        """Heal everything, let every node apply the record, deliver until quiet: the stream
        converges, and nothing confirmed was lost on the way."""
        sim = self.sim
        for a in NODES:
            sim.restart(a)
            for b in NODES:
                sim.heal(a, b)
        for _ in range(400):
            for name in NODES:  # (an election still under way may finish meanwhile)
                sim.apply(name)
            sim.wait(0.2)
            await sim.settle()
            if not sim.net.pending() and sim.converged():
                break
            for _direction in sim.net.pending():
                sim.deliver(0)
        sim.check()
        assert not sim.violations, sim.violations
        assert sim.converged(), f"no convergence once the faults stopped:\n{sim.describe()}"


TestReplication = Replication.TestCase
TestReplication.settings = settings(
    max_examples=int(os.environ.get('SIM_EXAMPLES', 150)), stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@pytest.mark.slow
class TestReplicationLong(Replication.TestCase):  # type: ignore[misc,valid-type]
    settings = settings(max_examples=3000, stateful_step_count=120, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow])

