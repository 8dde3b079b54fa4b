"""Policies: a pattern, what it applies to, a priority and a definition, as in RabbitMQ.

A queue or exchange gets the one matching policy with the highest priority (the pattern is an
unanchored regular expression, as RabbitMQ matches it). Pure data and matching; the vhost tells
queues when the policies change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")


@dataclass
class Policy:
    name: str
    pattern: str
    definition: dict[str, Any] = field(default_factory=dict)
    apply_to: str = "all"
    priority: int = 0

    def applies(self, kind: str, queue_type: str, name: str) -> bool:
        if self.apply_to == "exchanges" and kind != "exchanges":
            return False
        if self.apply_to != "exchanges" and self.apply_to != "all" and kind != "queues":
            return False
        if self.apply_to == "streams" and queue_type != "stream":
            return False
        if self.apply_to == "classic_queues" and queue_type != "classic":
            return False
        if self.apply_to == "quorum_queues" and queue_type != "quorum":
            return False
        try:
            return re.search(self.pattern, name) is not None
        except re.error:
            return False


def effective(policies: dict[str, Policy], kind: str, queue_type: str, name: str) -> Policy | None:
    best: Policy | None = None
    for policy in policies.values():
        if policy.applies(kind, queue_type, name) and (
            best is None or policy.priority > best.priority
        ):
            best = policy
    return best
