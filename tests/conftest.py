"""Shared fixtures: Leveret in-process and as a subprocess, and the reference RabbitMQ."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.brokers import BrokerProcess, InProcessBroker
from support.ports import free_port, wait_for_port
from support.reference import Reference, running, start_reference, start_stream_management_reference

from leveret.broker.process import logs

logs.configure("json", "warning")

# .ci/run's second pass (a wire worker beside the main process) sets this: a test's run against
# the reference RabbitMQ gives the same answer whatever Leveret's worker setting, so it runs in
# the first pass only
LEVERET_ONLY = "LEVERET_CI_LEVERET_ONLY"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get(LEVERET_ONLY):
        return
    kept, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        against_rabbitmq = any(value == "rabbitmq" for value in params.values()
                               if isinstance(value, str))
        (dropped if against_rabbitmq else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    """A fresh Leveret on a free port, in this process."""
    server = InProcessBroker(tmp_path / "data").start()
    yield server
    server.stop()


@pytest.fixture
def managed_broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    """A fresh Leveret with its management HTTP API on a free port (config.management_port)."""
    server = InProcessBroker(tmp_path / "data", management_port=free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh `leveret serve` subprocess (for restarts and kill -9), on a data directory of
    its own: a test may also have an in-process broker, and one data directory serves one
    server (the second is refused)."""
    proc = BrokerProcess(tmp_path / "process-data").start()
    yield proc
    proc.kill()


@pytest.fixture(scope="session")
def reference() -> Iterator[Reference]:
    """The reference RabbitMQ, started once per test session."""
    yield from running(start_reference)


@pytest.fixture(scope="session")
def stream_reference() -> Iterator[Reference]:
    """RabbitMQ 3.10.8 with its stream, management and stream management plugins, once for the
    whole session (or a skip): the stream protocol's reference and the management API's. Its
    node is `...@localhost`, and no advertised host is set: it announces `localhost`, as
    RabbitMQ announces the host of its node name. Its management API shows a new connection,
    and a queue's message counts, within a second (its collectors sample every 500 ms, not
    every 5 s). Tests leave nothing behind in it that another test could see."""
    reference = start_stream_management_reference(
        "collect_statistics_interval = 500\n"
        "management.sample_retention_policies.global.minute = 1\n"
        "management.sample_retention_policies.basic.minute = 1\n"
        "management.sample_retention_policies.detailed.10 = 1\n")
    if isinstance(reference, str):
        pytest.skip(reference)
    try:
        wait_for_port(reference.stream_port, 60)
        wait_for_port(reference.management_port, 60)
    except TimeoutError:
        if reference.stop is not None:
            reference.stop()
        pytest.skip("the reference RabbitMQ's stream or management listener did not start")
    yield reference
    if reference.stop is not None:
        reference.stop()


@pytest.fixture(params=["leveret", "rabbitmq"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A differential target: (name, port), for Leveret and for the reference RabbitMQ."""
    if request.param == "rabbitmq":
        ref = request.getfixturevalue("reference")
        yield ("rabbitmq", ref.port)
        return
    server = InProcessBroker(tmp_path / "data").start()
    yield ("leveret", server.port)
    server.stop()
