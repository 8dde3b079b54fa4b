"""The web UI in headless Chromium against a real `leveret serve`: log in, the overview moving
while a pika client publishes, declaring and deleting a queue, getting and purging, reading a
stream at an offset, definitions export and import, markup in names shown as text, a consumer
group followed while members come and go, a stream consumer's and a consumer group's growing
lag, and the charts' lines for every kind of rate."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from support.management import q

from .conftest import UiBroker, log_in

pytest.importorskip("playwright", reason="Playwright for Python is not installed")
from playwright.sync_api import expect

expect.set_options(timeout=30_000)  # a loaded 2-core machine: wait, never race


def channel_of(ui_broker: UiBroker) -> tuple[Any, Any]:
    connection = pika.BlockingConnection(pika.URLParameters(ui_broker.amqp_url))
    return connection, connection.channel()


def test_login_refuses_a_wrong_password_then_lets_the_user_in(page: Any) -> None:
    log_in(page, "guest", "wrong")
    expect(page.get_by_role("alert")).to_have_text("Not allowed: Login failed")
    log_in(page)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.locator(".me")).to_contain_text("guest (administrator)")
    page.click("text=Log out")
    expect(page.locator("form[aria-label=login]")).to_be_visible()


def test_a_user_without_a_management_tag_is_told_why(page: Any, ui_broker: UiBroker) -> None:
    assert ui_broker.http.put("/api/users/plain", {"password": "p", "tags": ""}).status in (
        201, 204)
    log_in(page, "plain", "p")
    expect(page.get_by_role("alert")).to_have_text("Not allowed: Not management user")


@pytest.fixture
def publisher(ui_broker: UiBroker) -> Iterator[threading.Event]:
    """A pika client publishing to queue `ui-load` until the test ends."""
    stop = threading.Event()
    ready = threading.Event()

    def run() -> None:
        connection, channel = channel_of(ui_broker)
        channel.queue_declare("ui-load")
        ready.set()
        while not stop.is_set():
            for _ in range(20):
                channel.basic_publish("", "ui-load", b"load")
            connection.sleep(0.05)
        channel.queue_purge("ui-load")
        connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    yield stop
    stop.set()
    thread.join(30)


def test_overview_counters_and_rate_chart_move_while_a_client_publishes(
        page: Any, publisher: threading.Event) -> None:
    log_in(page)
    expect(page.locator(".chart canvas")).to_have_count(1)
    # the rate is derived from the API's cumulative publish counter, sampled every 2 s
    publish_rate = page.locator("[data-rate=publish] b")
    expect(publish_rate).not_to_have_text("0", timeout=60_000)
    messages = page.locator("[data-total=messages] .value")
    expect(messages).not_to_have_text("0")
    first = int(messages.inner_text().replace(",", ""))
    page.wait_for_function(
        "n => Number(document.querySelector('[data-total=messages] .value')"
        ".textContent.replace(/,/g, '')) > n", arg=first, timeout=60_000)
    expect(page.locator("[data-total=queues] .value")).not_to_have_text("0")
    expect(page.get_by_test_id("alarms")).to_have_text("No alarm.")


def test_declare_get_purge_and_delete_a_queue(page: Any, ui_broker: UiBroker) -> None:
    http = ui_broker.http
    log_in(page)
    page.click("nav >> text=Queues and streams")
    form = page.locator("form[aria-label='declare queue']")
    form.locator("input[name=name]").fill("ui-orders")
    form.locator("input[name=arguments]").fill("{not json")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("alert")).to_contain_text("The arguments are not valid JSON")
    form.locator("input[name=arguments]").fill('{"x-max-length": 100}')
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("status")).to_have_text("Queue ui-orders declared.")
    assert http.get("/api/queues/%2F/ui-orders").body["arguments"]["x-max-length"] == 100

    connection, channel = channel_of(ui_broker)
    for body in (b"first", b"second"):
        channel.basic_publish("", "ui-orders", body)
    connection.close()

    page.locator("[data-testid=queues] input[name=filter]").fill("ui-orders")
    page.click("[data-testid=queues] >> text=ui-orders")
    expect(page.get_by_test_id("queue-name")).to_have_text("ui-orders")
    get_form = page.locator("form[aria-label='get messages']")
    get_form.locator("input[name=count]").fill("2")
    get_form.locator("button[type=submit]").click()
    expect(page.locator("[data-testid=message] .payload")).to_have_text(["first", "second"])

    page.click("button:has-text('Purge')")
    page.click("button:has-text('Yes, purge')")
    expect(page.get_by_test_id("properties")).to_contain_text("Messages0")
    assert http.get("/api/queues/%2F/ui-orders").body["messages"] == 0

    page.click("section.actions button:has-text('Delete')")
    page.click("button:has-text('Yes, delete')")
    expect(page.get_by_role("status")).to_contain_text("Deleted ui-orders.")
    assert http.get("/api/queues/%2F/ui-orders").status == 404


def test_an_api_refusal_is_shown_in_plain_words(page: Any) -> None:
    log_in(page)
    page.click("nav >> text=Queues and streams")
    form = page.locator("form[aria-label='declare queue']")
    form.locator("input[name=name]").fill("ui-transient-stream")
    form.locator("select[name=type]").select_option("stream")
    form.locator("input[type=checkbox]").uncheck()
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("alert")).to_have_text(
        "The broker refused the request: invalid property 'non-durable' for queue "
        "'ui-transient-stream' in vhost '/'")


def test_a_quorum_queue_shows_its_type_leader_and_members(page: Any, ui_broker: UiBroker) -> None:
    connection, channel = channel_of(ui_broker)
    channel.queue_declare("ui-quorum", durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 7})
    connection.close()
    node = ui_broker.http.get("/api/queues/%2F/ui-quorum").body["leader"]
    log_in(page)
    page.goto(page.url.split("#")[0] + "#/queues/%2F/ui-quorum")
    properties = page.get_by_test_id("properties")
    expect(properties).to_contain_text("Typequorum")
    expect(properties).to_contain_text(f"Leader{node}")
    expect(properties).to_contain_text(f"Members{node}")
    expect(properties).to_contain_text("Delivery limit7")


def test_read_a_stream_at_an_offset(page: Any, ui_broker: UiBroker) -> None:
    connection, channel = channel_of(ui_broker)
    channel.queue_declare("ui-events", durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for i in range(20):
        channel.basic_publish("", "ui-events", f"event {i}".encode())
    connection.close()
    log_in(page)
    page.goto(page.url.split("#")[0] + "#/queues/%2F/ui-events")
    expect(page.get_by_test_id("queue-name")).to_have_text("ui-events")
    expect(page.get_by_test_id("properties")).to_contain_text("Committed offset19")
    form = page.locator("form[aria-label='read stream']")
    form.locator("input[name=offset]").fill("5")
    form.locator("input[name=count]").fill("3")
    form.locator("button[type=submit]").click()
    messages = page.get_by_test_id("message")
    expect(messages.locator(".payload")).to_have_text(["event 5", "event 6", "event 7"])
    expect(messages.first.locator(".meta")).to_contain_text("offset 5")

    form.locator("input[name=offset]").fill("100")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("status")).to_have_text("Nothing committed at offset 100 yet.")
    form.locator("input[name=count]").fill("1000")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("alert")).to_have_text(
        "The broker refused the request: count must be between 1 and 100")


def test_export_and_import_definitions(page: Any, ui_broker: UiBroker, tmp_path: Path) -> None:
    http = ui_broker.http
    assert http.put("/api/queues/%2F/ui-exported", {"durable": True}).status in (201, 204)
    log_in(page)
    page.click("nav >> text=Definitions")
    page.click("text=Export definitions")
    expect(page.get_by_test_id("exported")).to_contain_text('"name": "ui-exported"')
    with page.expect_download() as download:
        page.click("[data-testid=download]")
    saved = tmp_path / "defs.json"
    download.value.save_as(saved)
    exported = json.loads(saved.read_text())
    assert "ui-exported" in {queue["name"] for queue in exported["queues"]}

    form = page.locator("form[aria-label='import definitions']")
    form.locator("textarea").fill("{broken")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("alert")).to_contain_text("The definitions are not valid JSON")
    form.locator("textarea").fill(json.dumps({"vhosts": [{"name": "ui-imported"}]}))
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("status")).to_have_text("Definitions imported.")
    assert http.get("/api/vhosts/ui-imported").status == 200


HOSTILE = "<img src=x onerror=alert(1)>"


def test_markup_in_a_queue_name_and_a_header_is_shown_as_text(
        page: Any, ui_broker: UiBroker) -> None:
    connection, channel = channel_of(ui_broker)
    channel.queue_declare(HOSTILE)
    channel.basic_publish("", HOSTILE, b"<script>alert(2)</script>",
                          pika.BasicProperties(headers={"note": "<b>bold</b>"}))
    connection.close()
    log_in(page)
    page.click("nav >> text=Queues and streams")
    page.locator("[data-testid=queues] input[name=filter]").fill("onerror")
    link = page.locator("[data-testid=queues] a")
    expect(link).to_have_count(1)  # the server's filtered page has replaced the full one
    expect(link).to_have_text(HOSTILE)
    link.click()
    expect(page.get_by_test_id("queue-name")).to_have_text(HOSTILE)
    page.locator("form[aria-label='get messages'] button[type=submit]").click()
    message = page.get_by_test_id("message")
    expect(message.locator(".payload")).to_have_text("<script>alert(2)</script>")
    expect(message.locator(".props")).to_contain_text('"note":"<b>bold</b>"')
    assert page.locator("main img, main b:text('bold'), main script").count() == 0
    assert http_gone(ui_broker)


def http_gone(ui_broker: UiBroker) -> bool:
    """Clean up the hostile queue through the API (its name quoted in the URL)."""
    return ui_broker.http.delete(f"/api/queues/%2F/{q(HOSTILE)}").status == 204


def test_follow_a_consumer_group_while_members_come_and_go(
        page: Any, ui_broker: UiBroker) -> None:
    http = ui_broker.http
    assert http.put("/api/leveret/super-streams/%2F/invoices", {"partitions": 2}).status == 201
    partitions = [p["name"] for p in http.ok("/api/leveret/super-streams/%2F/invoices")[
        "partitions"]]
    members = []
    for _ in range(2):
        connection = pika.BlockingConnection(pika.URLParameters(ui_broker.amqp_url))
        for partition in partitions:  # a channel each: a consumer tag is per channel
            channel = connection.channel()
            channel.basic_qos(prefetch_count=10)
            channel.basic_consume(partition, lambda *args: None, consumer_tag="billing",
                                  arguments={"x-single-active-consumer": True,
                                             "x-stream-offset": "first"})
        members.append(connection)
    log_in(page)
    page.click("nav >> text=Super streams")
    group = page.get_by_test_id("consumer-groups")
    expect(group.locator("tbody tr td").first).to_have_text("billing")
    expect(group.locator("tbody td .sub")).to_have_text([" (2 members)", " (2 members)"])

    def active() -> list[str]:
        groups = http.ok("/api/leveret/consumer-groups/%2F")
        by_stream = {g["stream"]: g for g in groups if g["reference"] == "billing"}
        return [next(m["connection_name"] for m in by_stream[p]["members"]
                     if m["state"] == "active") for p in partitions]

    expect(group.locator("tbody td .active")).to_have_text([f"{a} #billing" for a in active()])
    members[0].close()  # the first member leaves: the second takes every partition
    expect(group.locator("tbody td .sub")).to_have_text([" (1 member)", " (1 member)"])
    survivor = active()
    assert len(set(survivor)) == 1
    expect(group.locator("tbody td .active")).to_have_text([f"{a} #billing" for a in survivor])
    members[1].close()
    expect(group).to_have_count(0)  # the group ends with its last member
    expect(page.get_by_test_id("super-stream")).to_contain_text(
        "No single active consumer group.")


def test_a_stream_consumer_falling_behind_shows_its_lag_growing(
        page: Any, ui_broker: UiBroker) -> None:
    connection, channel = channel_of(ui_broker)
    channel.queue_declare("ui-lagging", durable=True, arguments={"x-queue-type": "stream"})
    channel.basic_qos(prefetch_count=5)  # takes 5, never acks: it stops at offset 4
    channel.basic_consume("ui-lagging", lambda *args: None, consumer_tag="slow",
                          arguments={"x-stream-offset": "first"})
    stop = threading.Event()

    def run() -> None:
        publisher, out = channel_of(ui_broker)
        while not stop.is_set():
            for _ in range(20):
                out.basic_publish("", "ui-lagging", b"tick")
            publisher.sleep(0.05)
        publisher.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        log_in(page)
        page.goto(page.url.split("#")[0] + "#/queues/%2F/ui-lagging")
        row = page.get_by_test_id("consumers").locator("tbody tr")
        expect(row.locator("td").first).to_have_text("slow")
        expect(row.locator("td").nth(6)).to_have_text("4")  # delivered offset
        expect(row.get_by_test_id("lag-change")).to_have_text(re.compile(r"^\+[0-9,]+/s$"))
        expect(row.get_by_test_id("lag-change")).to_have_class("behind")
        expect(page.get_by_test_id("lag")).not_to_contain_text("lag: 0 ")
    finally:
        stop.set()
        thread.join(30)
        connection.close()


def test_users_vhosts_permissions_and_policies(page: Any, ui_broker: UiBroker) -> None:
    http = ui_broker.http
    log_in(page)
    page.click("nav >> text=Virtual hosts")
    form = page.locator("form[aria-label='add vhost']")
    form.locator("input[name=name]").fill("ui-shop")
    form.locator("select[name=default_queue_type]").select_option("quorum")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("status")).to_have_text("Virtual host ui-shop saved.")
    assert http.get("/api/vhosts/ui-shop").body["default_queue_type"] == "quorum"
    row = page.get_by_test_id("vhosts").locator("tr", has_text="ui-shop")
    expect(row.locator("td").nth(3)).to_have_text("quorum", timeout=15_000)  # the list polls

    page.click("nav >> text=Users")
    form = page.locator("form[aria-label='add user']")
    form.locator("input[name=name]").fill("ui-alice")
    form.locator("input[name=password]").fill("secret")
    form.locator("input[name=tags]").fill("management")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("status")).to_have_text("User ui-alice saved.")
    assert http.get("/api/users/ui-alice").body["tags"] == ["management"]

    page.click("nav >> text=Permissions")
    form = page.locator("form[aria-label='set permission']")
    form.locator("select[name=vhost]").select_option("ui-shop")
    form.locator("input[name=user]").fill("ui-alice")
    form.locator("input[name=write]").fill("^orders$")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("status")).to_have_text("Permissions of ui-alice on ui-shop set.")
    assert http.get("/api/permissions/ui-shop/ui-alice").body["write"] == "^orders$"
    form.locator("input[name=user]").fill("nobody")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("alert")).to_have_text(
        "The broker refused the request: vhost or user not found")

    page.click("nav >> text=Policies")
    form = page.locator("form[aria-label='add policy']")
    form.locator("select[name=vhost]").select_option("ui-shop")
    form.locator("input[name=name]").fill("ui-retention")
    form.locator("input[name=pattern]").fill("^events")
    form.locator("input[name=definition]").fill("{max-age")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("alert")).to_contain_text("The definition is not valid JSON")
    form.locator("input[name=definition]").fill('{"max-age": "1D"}')
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("status")).to_have_text("Policy ui-retention saved.")
    rows = page.get_by_test_id("policies").locator("tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.locator("td").nth(4)).to_have_text('{"max-age":"1D"}')
    rows.locator("button:has-text('Delete')").click()
    rows.locator("button:has-text('Yes, delete')").click()
    expect(page.get_by_test_id("policies").locator("td.empty")).to_have_text("Nothing here.")
    assert http.get("/api/policies/ui-shop/ui-retention").status == 404

    # what a management user may not do is refused in plain words
    page.click("text=Log out")
    log_in(page, "ui-alice", "secret")
    page.click("nav >> text=Virtual hosts")
    form = page.locator("form[aria-label='add vhost']")
    form.locator("input[name=name]").fill("ui-not-mine")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("alert")).to_have_text("Not allowed: Not administrator user")


def test_connections_channels_and_exchanges(page: Any, ui_broker: UiBroker) -> None:
    http = ui_broker.http
    parameters = pika.URLParameters(ui_broker.amqp_url)
    parameters.client_properties = {"connection_name": "ui-closing"}
    connection = pika.BlockingConnection(parameters)
    connection.channel().confirm_delivery()
    name = wait_for_connection(http, "ui-closing")
    log_in(page)
    page.click("nav >> text=Channels")
    expect(page.get_by_test_id("channels").locator("tbody tr", has_text="confirm")
           ).not_to_have_count(0)

    page.click("nav >> text=Connections")
    row = page.get_by_test_id("connections").locator("tbody tr", has_text=name)
    expect(row).to_contain_text("guest")
    row.locator("button:has-text('Close')").click()
    row.locator("button:has-text('Yes, close')").click()
    with pytest.raises(pika.exceptions.ConnectionClosed):
        for _ in range(300):
            connection.process_data_events(time_limit=0.1)
    # gone from the API once the broker has closed the socket: at once with one process, a
    # round trip later with a wire worker (which closes it and says so)
    for _ in range(50):
        if http.get(f"/api/connections/{q(name)}").status == 404:
            break
        threading.Event().wait(0.1)
    assert http.get(f"/api/connections/{q(name)}").status == 404

    page.click("nav >> text=Exchanges")
    form = page.locator("form[aria-label='declare exchange']")
    form.locator("input[name=name]").fill("ui-audit")
    form.locator("select[name=type]").select_option("topic")
    form.locator("button[type=submit]").click()
    expect(form.get_by_role("status")).to_have_text("Exchange ui-audit declared.")
    assert http.get("/api/exchanges/%2F/ui-audit").body["type"] == "topic"
    page.locator("[data-testid=exchanges] input[name=filter]").fill("ui-audit")
    row = page.get_by_test_id("exchanges").locator("tbody tr")
    expect(row).to_have_count(1)
    row.locator("button:has-text('Delete')").click()
    row.locator("button:has-text('Yes, delete')").click()
    expect(page.get_by_test_id("exchanges").locator("td.empty")).to_have_text("Nothing here.")
    assert http.get("/api/exchanges/%2F/ui-audit").status == 404

    # a delayed exchange shows what it holds (docs/DELAYED-MESSAGES.md)
    connection = pika.BlockingConnection(pika.URLParameters(ui_broker.amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare("ui-delayed", "x-delayed-message",
                             arguments={"x-delayed-type": "direct"})
    channel.basic_publish("ui-delayed", "k", b"m",
                          pika.BasicProperties(headers={"x-delay": 3_600_000}))
    for body in (b"first", b"second"):
        channel.basic_publish("ui-delayed", "k", body,
                              pika.BasicProperties(headers={"x-delay": 7_200_000}))
    page.locator("[data-testid=exchanges] input[name=filter]").fill("ui-delayed")
    expect(page.get_by_test_id("exchanges").locator("tbody tr")).to_contain_text(
        "delayed: 3 held, next due ")

    # its page lists the held messages in due order and deletes one
    page.get_by_test_id("exchanges").locator("a:has-text('delayed: 3 held')").click()
    expect(page.get_by_role("heading", name="Delayed messages of ui-delayed")).to_be_visible()
    expect(page.get_by_test_id("delayed-summary")).to_contain_text("3 held, next due 20")
    held = page.get_by_test_id("held")
    expect(held).to_have_count(3)
    expect(held.nth(0).locator("pre.payload")).to_have_text("m")  # due in 1 h, the others 2 h
    form = page.locator("form[aria-label='list held messages']")
    form.locator("input[name=count]").fill("2")
    form.locator("button[type=submit]").click()
    expect(held).to_have_count(2)
    held.nth(0).locator("button:has-text('Delete')").click()
    held.nth(0).locator("button:has-text('Yes, delete')").click()
    expect(held).to_have_count(2)  # the two left: the first now 'first'
    expect(held.nth(0).locator("pre.payload")).to_have_text("first")
    expect(page.get_by_test_id("delayed-summary")).to_contain_text("2 held", timeout=15_000)
    assert http.get("/api/exchanges/%2F/ui-delayed").body["messages_delayed"] == 2
    channel.exchange_delete("ui-delayed")
    connection.close()


def wait_for_connection(http: Any, client_name: str) -> str:
    """The API's name of the connection the client named `client_name`, once it is listed."""
    for _ in range(300):
        for item in http.get("/api/connections").body or []:
            if (item.get("client_properties") or {}).get("connection_name") == client_name:
                return str(item["name"])
        threading.Event().wait(0.1)
    raise AssertionError(f"connection {client_name} never showed in /api/connections")


def test_a_consumer_group_falling_behind_shows_its_lag_growing_on_each_partition(
        page: Any, ui_broker: UiBroker) -> None:
    """The super streams page: a group's offset lag on each partition and its change per
    second, positive (in red) while a publisher outruns the group's members."""
    http = ui_broker.http
    assert http.put("/api/leveret/super-streams/%2F/ledgers", {"partitions": 2}).status == 201
    partitions = [p["name"] for p in http.ok("/api/leveret/super-streams/%2F/ledgers")[
        "partitions"]]
    member = pika.BlockingConnection(pika.URLParameters(ui_broker.amqp_url))
    for partition in partitions:
        channel = member.channel()
        channel.basic_qos(prefetch_count=5)  # takes 5 of each partition, never acks
        channel.basic_consume(partition, lambda *args: None, consumer_tag="reports",
                              arguments={"x-single-active-consumer": True,
                                         "x-stream-offset": "first"})
    stop = threading.Event()

    def run() -> None:
        publisher, out = channel_of(ui_broker)
        while not stop.is_set():
            for partition in partitions:
                for _ in range(10):
                    out.basic_publish("", partition, b"tick")
            publisher.sleep(0.05)
        publisher.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        log_in(page)
        page.click("nav >> text=Super streams")
        row = page.locator("[data-testid=consumer-groups] tr[data-reference=reports]")
        expect(row.locator("td").first).to_have_text("reports")
        growing = re.compile(r"^\+[0-9,]+/s$")
        expect(row.get_by_test_id("partition-lag-change")).to_have_text([growing, growing])
        expect(row.get_by_test_id("partition-lag-change").first).to_have_class("behind")
        expect(row.get_by_test_id("lag-change")).to_have_text(growing)
        expect(row.get_by_test_id("lag-change")).to_have_class("behind")
        expect(row.get_by_test_id("group-lag")).not_to_have_text("0")
        expect(row.get_by_test_id("partition-lag").first).to_have_text(
            re.compile(r"^lag [0-9,]+$"))
    finally:
        stop.set()
        thread.join(30)
        member.close()
        assert http.delete("/api/leveret/super-streams/%2F/ledgers").status == 204


def test_the_charts_show_ack_redeliver_get_and_returns(page: Any, ui_broker: UiBroker) -> None:
    """The overview's chart and a queue's chart have a line for each kind of the API's
    message_stats, beside publish, deliver/get and confirm; the overview's ack rate moves
    while a client gets and acks."""
    stop = threading.Event()
    ready = threading.Event()

    def run() -> None:
        connection, channel = channel_of(ui_broker)
        channel.queue_declare("ui-acks")
        ready.set()
        while not stop.is_set():
            channel.basic_publish("", "ui-acks", b"job")
            method, _props, _body = channel.basic_get("ui-acks")
            if method is not None:
                channel.basic_ack(method.delivery_tag)
            connection.sleep(0.02)
        connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert ready.wait(30)
        log_in(page)
        legend = page.locator(".chart .u-legend .u-label")
        expect(legend).to_have_text(["Time", "Publish", "Deliver / get", "Confirm", "Ack",
                                     "Redeliver", "Get", "Returned unroutable"])
        for kind in ("ack", "redeliver", "get", "return_unroutable"):
            expect(page.locator(f"[data-rate={kind}]")).to_have_count(1)
        expect(page.locator("[data-rate=ack] b")).not_to_have_text("0", timeout=60_000)
        page.goto(page.url.split("#")[0] + "#/queues/%2F/ui-acks")
        expect(page.get_by_test_id("queue-name")).to_have_text("ui-acks")
        expect(legend).to_have_text(["Time", "Publish", "Deliver / get", "Ack", "Redeliver",
                                     "Get"])
    finally:
        stop.set()
        thread.join(30)
        ui_broker.http.delete("/api/queues/%2F/ui-acks")
