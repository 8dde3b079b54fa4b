"""Fixtures of the Spark tests: one local Spark session, and the exactly-once job.

The session runs `local[2,4]`: two cores, and up to four attempts per task (plain `local[2]`
never retries a task, and the exactly-once tests need Spark's retry). It binds to loopback,
runs its Python workers on this interpreter, keeps the UI off, uses two shuffle partitions
and starts its JVM for short jobs (QUICK_JVM). Every test module in this folder starts with
`pytest.importorskip("pyspark")`, so the folder skips cleanly without the `spark` extra.

Helpers shared by the modules here live in `sparkkit.py` beside this file; this folder is put
on sys.path so that they import as `from sparkkit import ...` (`conftest` itself is taken:
tests/conftest.py is importable as `conftest`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
# Tests run short jobs: the JVM's C1 compiler alone and the serial GC start Spark about twice
# as fast on a small machine (never use this for a benchmark).
QUICK_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from leveret.spark import local_session
    from leveret.spark.session import java_version

    if (java_version() or 0) < 17:
        pytest.skip("Spark needs Java 17+: apt-get install openjdk-17-jre-headless")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = local_session(
        "leveret-tests",
        master="local[2,4]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.extraJavaOptions": QUICK_JVM,
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    job = load_job()
    session.dataSource.register(job.FaultyLeveret)
    yield session
    session.stop()


def load_job() -> ModuleType:
    """tests/spark/exactly_once_job.py as a module whose classes pickle by value (Spark's
    workers could not import it by name)."""
    name = "leveret_exactly_once_job"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / "exactly_once_job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


@pytest.fixture
def job() -> ModuleType:
    return load_job()
