"""Nemeses: the faults a round inflicts on the cluster, each chosen and timed by the round's rng.

Role: every nemesis picks its targets (mostly the stream's current leader) and a duration from
the `random.Random` it is given, applies the fault, holds it, and heals it, returning a
`Fault` that says what was done and when. The same seed makes the same choices, so a round can
be replayed (the timing of the cluster's answers is of course its own).

| name | fault |
|---|---|
| isolate-leader | the leader drops every packet from and to its peers (etcd, clients: spared) |
| isolate-leader-etcd | the same, and the leader is cut from etcd too |
| split | {leader} against {the other two}; etcd on one side (chosen), clients reach everyone |
| bridge | two members cannot see each other, the third sees both (which node bridges: chosen) |
| one-way | the leader's packets to its peers are dropped, or theirs to it (direction: chosen) |
| kill-leader | kill -9 of the leader's node, restarted with the same data after a while |
| pause-leader | SIGSTOP of the leader's node past its etcd lease, then SIGCONT |

Cuts are nftables rules inside the nodes' namespaces (net.Namespace.cut): drops, so the cut is
silent. `majority_cut` says whether the fault cuts the leader off from a majority of the
members, where a failover is expected and timed.

Must not know: the workload or the checker. Threading: the test's thread.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from faults.cluster import FaultCluster, lease_ttl_s


@dataclass
class Fault:
    nemesis: str
    description: str
    old_leader: str
    applied_at: float = 0.0
    healed_at: float = 0.0
    majority_cut: bool = False
    extra: dict[str, str] = field(default_factory=dict)


class Nemesis:
    """Base: `inflict` applies, holds for `hold_s`, and heals."""

    name = ""
    majority_cut = True

    def hold_s(self, rng: random.Random) -> float:
        return rng.uniform(5.0, 8.0)

    def apply(self, cluster: FaultCluster, leader: str, rng: random.Random) -> str:
        raise NotImplementedError

    def heal(self, cluster: FaultCluster) -> None:
        cluster.net.heal_all()

    def inflict(self, cluster: FaultCluster, leader: str, rng: random.Random,
                clock: Callable[[], float] = time.monotonic) -> Fault:
        hold = self.hold_s(rng)
        fault = Fault(self.name, "", leader, majority_cut=self.majority_cut)
        try:
            fault.description = self.apply(cluster, leader, rng) + f" for {hold:.1f} s"
            fault.applied_at = clock()  # in force from here on
            time.sleep(hold)
        finally:
            self.heal(cluster)
            fault.healed_at = clock()
        return fault


def _ips(cluster: FaultCluster, names: list[str]) -> list[str]:
    return [cluster.nodes[n].ns.ip for n in names]


def _peers(cluster: FaultCluster, node: str) -> list[str]:
    return [n for n in cluster.names if n != node]


class IsolateLeader(Nemesis):
    name = "isolate-leader"

    def apply(self, cluster: FaultCluster, leader: str, rng: random.Random) -> str:
        peers = _ips(cluster, _peers(cluster, leader))
        cluster.nodes[leader].ns.cut(drop_in=peers, drop_out=peers)
        return f"{leader} (leader) cut from its peers"


class IsolateLeaderAndEtcd(Nemesis):
    name = "isolate-leader-etcd"

    def apply(self, cluster: FaultCluster, leader: str, rng: random.Random) -> str:
        cut = [*_ips(cluster, _peers(cluster, leader)), cluster.net.etcd_ip]
        cluster.nodes[leader].ns.cut(drop_in=cut, drop_out=cut)
        return f"{leader} (leader) cut from its peers and etcd"


class Split(Nemesis):
    """A majority/minority split with the leader alone in the minority; etcd lands on one
    side (the majority's two times in three), clients see both."""

    name = "split"

    def apply(self, cluster: FaultCluster, leader: str, rng: random.Random) -> str:
        majority = _peers(cluster, leader)
        etcd_with_majority = rng.random() < 2 / 3
        etcd = [cluster.net.etcd_ip]
        minority_cut = _ips(cluster, majority) + (etcd if etcd_with_majority else [])
        cluster.nodes[leader].ns.cut(drop_in=minority_cut, drop_out=minority_cut)
        for node in majority:
            cut = _ips(cluster, [leader]) + ([] if etcd_with_majority else etcd)
            cluster.nodes[node].ns.cut(drop_in=cut, drop_out=cut)
        side = "majority" if etcd_with_majority else "minority"
        return f"split [{leader}] | [{', '.join(majority)}], etcd with the {side}"


class Bridge(Nemesis):
    """Two nodes that cannot see each other and a third that sees both; etcd sees all."""

    name = "bridge"
    majority_cut = False  # every member still reaches a majority (itself and the bridge)

    def apply(self, cluster: FaultCluster, leader: str, rng: random.Random) -> str:
        bridge = rng.choice(cluster.names)
        a, b = _peers(cluster, bridge)
        cluster.nodes[a].ns.cut(drop_in=_ips(cluster, [b]), drop_out=_ips(cluster, [b]))
        cluster.nodes[b].ns.cut(drop_in=_ips(cluster, [a]), drop_out=_ips(cluster, [a]))
        return f"bridge: {a} x {b} cannot see each other, {bridge} sees both (leader {leader})"


class OneWay(Nemesis):
    """The leader's packets to its peers are lost, or its peers' packets to it."""

    name = "one-way"

    def apply(self, cluster: FaultCluster, leader: str, rng: random.Random) -> str:
        peers = _ips(cluster, _peers(cluster, leader))
        if rng.random() < 0.5:
            cluster.nodes[leader].ns.cut(drop_out=peers)
            return f"{leader} (leader) -> peers dropped (it still hears them)"
        cluster.nodes[leader].ns.cut(drop_in=peers)
        return f"peers -> {leader} (leader) dropped (they still hear it)"


class KillLeader(Nemesis):
    name = "kill-leader"

    def hold_s(self, rng: random.Random) -> float:
        return rng.uniform(1.0, 6.0)

    def apply(self, cluster: FaultCluster, leader: str, rng: random.Random) -> str:
        cluster.nodes[leader].kill()
        return f"kill -9 of {leader} (leader), restarted"

    def heal(self, cluster: FaultCluster) -> None:
        for node in cluster.nodes.values():
            if not node.alive:
                node.start()


class PauseLeader(Nemesis):
    name = "pause-leader"

    def hold_s(self, rng: random.Random) -> float:
        return lease_ttl_s() + rng.uniform(1.0, 3.0)

    def apply(self, cluster: FaultCluster, leader: str, rng: random.Random) -> str:
        cluster.nodes[leader].pause()
        return f"SIGSTOP of {leader} (leader) past its {lease_ttl_s()} s lease, then SIGCONT"

    def heal(self, cluster: FaultCluster) -> None:
        for node in cluster.nodes.values():
            if node.paused:
                node.resume()


NEMESES: dict[str, Nemesis] = {n.name: n for n in (
    IsolateLeader(), IsolateLeaderAndEtcd(), Split(), Bridge(), OneWay(), KillLeader(),
    PauseLeader())}
