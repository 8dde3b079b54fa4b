"""A pytest plugin that records how many tests passed, so CI can fail when none ran.

When LEVERET_CI_REPORT names a file, the counts (passed, failed, skipped, errors) are written
there at the end of the session as JSON.
"""

from __future__ import annotations

import json
import os
from typing import Any

_counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" and report.passed:
        _counts["passed"] += 1
    elif report.failed:
        _counts["failed" if report.when == "call" else "errors"] += 1
    elif report.skipped:
        _counts["skipped"] += 1


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    path = os.environ.get("LEVERET_CI_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({**_counts, "exitstatus": int(exitstatus)}, fh)
