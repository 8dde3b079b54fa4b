"""Schedules the simulation's random search once found, replayed step by step as regression
tests (tests/faults/test_replication_simulation.py's state machine, same invariants, same
convergence check at the end). Each was shrunk by hand from what hypothesis printed, and each
fails on the code it was found on."""

from __future__ import annotations

import pytest

from .test_replication_simulation import Replication

# A leader that took epochs 2 and 3 without writing (one tracking chunk each), then wrote in 3,
# and was fenced into epoch 4. Its sync took the replica's epoch-2 range, which starts and ends
# at one offset, for a range it lacks, cut the replica from offset 2, and m3, confirmed at a
# quorum, was left on the leader only (broker/cluster/replication.py:agreement).
CONFIRMED_ENTRY_CUT_FROM_A_REPLICA = """
deliver 1 4; elect n2; publish n1 2; deliver 0 1; deliver 0 1; deliver 0 1; elect n3
deliver 0 6; deliver 0 2; deliver 4 3; publish n1 1; deliver 0 3; elect n2; deliver 5 4
deliver 0 4
"""

# The same misreading with the replica's commit point already past the cut: the replica
# refuses every sync ("the leader would cut offset 2, committed here") and never converges.
REPLICA_REFUSES_EVERY_SYNC = """
deliver 1 4; elect n2; publish n1 2; deliver 0 1; deliver 0 1; deliver 0 1; deliver 2 3
deliver 0 3; elect n2; deliver 1 3; deliver 3 5; deliver 4 5; publish n1 1; deliver 5 3
deliver 1 5; publish n1 2; elect n3
"""


def replay(schedule: str) -> None:
    state = Replication()
    try:
        state.safe()
        for step in schedule.replace("\n", ";").split(";"):
            if not step.strip():
                continue
            rule, *args = step.split()
            if rule == "deliver":
                state.deliver(index=int(args[0]), times=int(args[1]))
            elif rule == "publish":
                state.publish(name=args[0], count=int(args[1]))
            else:
                getattr(state, rule)(*args)
            state.safe()
    finally:
        state.teardown()  # (heals, settles and asserts convergence)


@pytest.mark.parametrize("schedule", [CONFIRMED_ENTRY_CUT_FROM_A_REPLICA,
                                      REPLICA_REFUSES_EVERY_SYNC],
                         ids=["confirmed-entry-cut-from-a-replica", "replica-refuses-every-sync"])
def test_a_schedule_found_once(schedule: str) -> None:
    replay(schedule)
