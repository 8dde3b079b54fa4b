"""Browser tests of the web UI: a real `leveret serve` and Debian's headless Chromium, driven by
Playwright (its Python package only; the browser is the system's, never downloaded).

They skip, saying why, where no Chromium is installed (`apt-get install chromium`; .ci/run
installs it) or Playwright is missing (`pip install -e .[test]`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.brokers import BrokerProcess
from support.management import Http
from support.ports import free_port, wait_for_port

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    configured = os.environ.get("LEVERET_CHROMIUM")
    if configured:
        return configured
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class UiBroker:
    """`leveret serve` with its management listener (the UI) on a known port."""

    def __init__(self, data_dir: Path) -> None:
        self.http_port = free_port()
        self.process = BrokerProcess(data_dir, args=["--management-port", str(self.http_port)])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/"

    @property
    def amqp_url(self) -> str:
        return self.process.url

    @property
    def http(self) -> Http:
        return Http(self.http_port)

    def start(self) -> UiBroker:
        self.process.start()
        wait_for_port(self.http_port, 60)  # the management listener opens after the AMQP one
        return self


@pytest.fixture(scope="module")
def ui_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiBroker]:
    broker = UiBroker(tmp_path_factory.mktemp("ui") / "data").start()
    yield broker
    broker.process.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium: install Debian's `chromium` (.ci/run does) or set "
                    "LEVERET_CHROMIUM to a Chromium binary")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=executable, headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, ui_broker: UiBroker) -> Iterator[Any]:
    """A fresh browser tab on the UI, with the page's errors collected in `page.errors`."""
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  accept_downloads=True)
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    tab.errors = []
    tab.dialogs = []
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))

    def dialog(d: Any) -> None:
        tab.dialogs.append(d.message)
        d.dismiss()
    tab.on("dialog", dialog)
    tab.goto(ui_broker.url)
    yield tab
    context.close()
    assert tab.errors == []
    assert tab.dialogs == []


def log_in(page: Any, user: str = "guest", password: str = "guest") -> None:
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("form[aria-label=login] button[type=submit]")
