"""Take the web UI's screenshots for docs/ (docs/ui-overview.png, docs/ui-stream.png).

    python tests/ui/screenshots.py [OUTPUT_DIR]

Starts a real `leveret serve` on free ports, gives it something to show (a pika publisher, a
stream with a consumer that keeps up and one that falls behind), and photographs the overview
and the stream's page with Debian's headless Chromium through Playwright. Not a test.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import pika  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from ui.conftest import UiBroker, chromium_path, log_in  # noqa: E402


def publish(url: str, stop: threading.Event) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare("orders", durable=True)
    channel.queue_declare("orders.events", durable=True,
                          arguments={"x-queue-type": "stream", "x-max-age": "7D"})
    n = 0
    while not stop.is_set():
        for _ in range(40):
            n += 1
            body = f'{{"order": {n}, "state": "paid"}}'.encode()
            props = pika.BasicProperties(content_type="application/json",
                                         headers={"source": "checkout"})
            channel.basic_publish("", "orders.events", body, props)
            if n % 3 == 0:
                channel.basic_publish("", "orders", body, props)
        connection.sleep(0.1)
    connection.close()


def consume(url: str, name: str, prefetch: int, ack_every: float, stop: threading.Event) -> None:
    """A stream consumer that acks what it has received every `ack_every` seconds (with its
    prefetch, that sets how fast it goes)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    received = [0]

    def on_message(ch: object, method: object, props: object, body: bytes) -> None:
        received[0] = method.delivery_tag  # type: ignore[attr-defined]

    channel.basic_consume("orders.events", on_message, consumer_tag=name,
                          arguments={"x-stream-offset": "first"})
    acked, last = 0, time.monotonic()
    while not stop.is_set():
        connection.process_data_events(time_limit=0.05)
        if received[0] > acked and time.monotonic() - last >= ack_every:
            acked, last = received[0], time.monotonic()
            channel.basic_ack(acked, multiple=True)
    connection.close()


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"
    executable = chromium_path()
    if executable is None:
        sys.exit("no Chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        broker = UiBroker(Path(tmp) / "data").start()
        stop = threading.Event()
        threads = [threading.Thread(target=publish, args=(broker.amqp_url, stop))]
        threads[0].start()
        time.sleep(1)
        threads += [
            threading.Thread(target=consume, args=(broker.amqp_url, "billing", 1000, 0.1, stop)),
            threading.Thread(target=consume, args=(broker.amqp_url, "audit", 100, 1.0, stop)),
        ]
        for thread in threads[1:]:
            thread.start()
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=executable,
                                                     args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(broker.url)
                log_in(page)
                page.wait_for_selector("text=Message rates")
                time.sleep(40)  # let the live chart draw
                page.screenshot(path=str(out / "ui-overview.png"))
                page.goto(broker.url + "#/queues/%2F/orders.events")
                page.wait_for_selector("text=Read messages")
                time.sleep(30)
                form = page.locator("form[aria-label='read stream']")
                form.locator("input[name=offset]").fill("1200")
                form.locator("input[name=count]").fill("3")
                form.locator("button[type=submit]").click()
                page.wait_for_selector("[data-testid=message]")
                page.set_viewport_size({"width": 1280, "height": 1250})
                page.screenshot(path=str(out / "ui-stream.png"))
                browser.close()
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
            broker.process.kill()


if __name__ == "__main__":
    main()
