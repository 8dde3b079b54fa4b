"""Running a client scenario program (Node, Java, Go) and reading what it saw.

A scenario program takes (URL, SCENARIO, QUEUE_PREFIX) and prints one JSON object as its last
line of output; tests compare that object between Leveret and the reference RabbitMQ.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any


def run_scenario(command: list[str], url: str, scenario: str, prefix: str,
                 timeout_s: float = 60) -> dict[str, Any]:
    result = subprocess.run([*command, url, scenario, prefix], capture_output=True, text=True,
                            timeout=timeout_s, check=False)
    assert result.stdout, f"{scenario}: no output (exit {result.returncode}):\n{result.stderr}"
    return dict(json.loads(result.stdout.splitlines()[-1]))
