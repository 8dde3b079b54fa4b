"""Getting a Spark session that can use the data source, without the usual pitfalls.

`register(spark)` registers `LeveretDataSource` under the name `leveret` on a session the
user already has. `local_session()` builds a local one for scripts, examples and tests and
handles what goes wrong on a fresh machine: Spark's Python workers must run the same
interpreter as the driver (it sets `PYSPARK_PYTHON` and `PYSPARK_DRIVER_PYTHON` to
`sys.executable` unless they are set), Spark needs Java 17 or newer (`check_java` says how
to get it on Debian before the JVM fails with a less helpful message), and a local session
binds its driver to loopback so that a host name that does not resolve, or a firewall,
cannot get in the way.

Runs in the driver process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

from leveret.spark.errors import LeveretSparkError

JAVA_HELP = ("Spark 4 needs Java 17 or newer. On Debian or Ubuntu: "
             "apt-get install openjdk-17-jre-headless (or set JAVA_HOME to a JDK 17+)")


def register(spark: Any) -> Any:
    """Register the `leveret` format on `spark`; returns the session, for chaining."""
    from leveret.spark.datasource import LeveretDataSource

    spark.dataSource.register(LeveretDataSource)
    return spark


def java_version() -> int | None:
    """The major version of the `java` Spark will start (JAVA_HOME first), or None."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java(minimum: int = 17) -> int:
    """Raise a helpful error unless Java `minimum`+ is there; returns the major version."""
    version = java_version()
    if version is None:
        raise LeveretSparkError(f"no java found (JAVA_HOME or PATH). {JAVA_HELP}")
    if version < minimum:
        raise LeveretSparkError(f"found Java {version}. {JAVA_HELP}")
    return version


def set_python_env() -> None:
    """Spark's Python workers run the interpreter running this code, unless told otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def local_session(
    app_name: str = "leveret",
    master: str = "local[2]",
    conf: dict[str, str] | None = None,
) -> Any:
    """A SparkSession on this machine, bound to loopback, with `leveret` registered."""
    check_java()
    set_python_env()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return register(builder.getOrCreate())
