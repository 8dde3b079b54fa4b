"""The UI's server side, over plain HTTP (no browser): the pages need no login and carry a
strict Content-Security-Policy, the UI's requests get a 401 without the browser's login dialog,
state changes refuse what a cross-site page could send, and the stream read endpoint."""

from __future__ import annotations

import pika
from support.brokers import InProcessBroker
from support.management import Http


def test_the_page_and_its_files_need_no_login(managed_broker: InProcessBroker) -> None:
    http = Http.of(managed_broker)
    page = http.get("/", auth=False)
    assert page.status == 200 and '<div id="app">' in page.text
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "script-src 'self' 'sha256-" in policy
    assert "frame-ancestors 'none'" in policy
    for path in ("/ui/app.js", "/ui/vendor/preact-11.2.0/preact.mjs",
                 "/ui/vendor/uplot-1.6.32/uPlot.esm.js", "/ui/vendor/htm-3.1.1/LICENSE"):
        assert http.get(path, auth=False).status == 200, path
    assert http.get("/ui/nothing.js", auth=False).status == 404
    assert http.get("/api/overview", auth=False).status == 401


def test_the_uis_401_has_no_www_authenticate(managed_broker: InProcessBroker) -> None:
    http = Http.of(managed_broker)
    plain = http.get("/api/overview", auth=False)
    assert plain.status == 401 and plain.headers["WWW-Authenticate"].startswith("Basic")
    from_ui = http.get("/api/overview", auth=False,
                       headers={"X-Requested-With": "leveret-ui"})
    assert from_ui.status == 401 and "WWW-Authenticate" not in from_ui.headers
    assert from_ui.body == {"error": "not_authorised", "reason": "Login failed"}


def test_a_browsers_cross_site_change_is_refused(managed_broker: InProcessBroker) -> None:
    http = Http.of(managed_broker)
    refused = {"error": "forbidden", "reason": "cross-site requests may not change the broker"}
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "http://evil.example"}, {"Origin": "null"}):
        reply = http.call("PUT", "/api/vhosts/forged", {}, headers=headers)
        assert (reply.status, reply.body) == (403, refused), headers
    assert http.get("/api/vhosts/forged").status == 404
    # a read is never refused; the UI's own requests are same-origin
    assert http.get("/api/vhosts", headers={"Sec-Fetch-Site": "cross-site"}).status == 200
    same = {"Sec-Fetch-Site": "same-origin", "Origin": f"http://127.0.0.1:{http.port}"}
    assert http.call("PUT", "/api/vhosts/mine", {}, headers=same).status == 201
    origin_only = {"Origin": f"http://127.0.0.1:{http.port}"}
    assert http.call("DELETE", "/api/vhosts/mine", headers=origin_only).status == 204


def test_read_a_stream_at_an_offset(managed_broker: InProcessBroker) -> None:
    http = Http.of(managed_broker)
    connection = pika.BlockingConnection(pika.URLParameters(managed_broker.url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_declare("orders")
    for i in range(10):
        channel.basic_publish("", "events", f"e{i}".encode(),
                              pika.BasicProperties(headers={"n": i}))
    channel.basic_publish("", "events", b"\xff\xfe")
    connection.close()
    base = "/api/leveret/streams/%2F/events/messages"
    reply = http.ok(f"{base}?offset=3&count=2")
    assert (reply["first_offset"], reply["committed_offset"]) == (0, 10)
    assert [(m["offset"], m["payload"]) for m in reply["messages"]] == [(3, "e3"), (4, "e4")]
    first = reply["messages"][0]
    assert first["properties"]["headers"] == {"n": 3}
    assert (first["routing_key"], first["payload_encoding"]) == ("events", "string")
    assert [m["offset"] for m in http.ok(base)["messages"]] == list(range(10))
    assert http.ok(f"{base}?offset=10")["messages"][0]["payload_encoding"] == "base64"
    assert http.ok(f"{base}?offset=50")["messages"] == []
    for query, reason in (("count=0", "count must be between 1 and 100"),
                          ("count=101", "count must be between 1 and 100"),
                          ("count=x", "count must be a number"),
                          ("offset=-1", "offset must be 0 or more")):
        assert http.get(f"{base}?{query}").body == {"error": "bad_request", "reason": reason}
    assert http.get("/api/leveret/streams/%2F/orders/messages").body == {
        "error": "bad_request", "reason": "orders is not a stream"}
    assert http.get("/api/leveret/streams/%2F/nothing/messages").status == 404
    assert http.get("/api/leveret/streams/nowhere/events/messages").status == 404


def test_reading_a_stream_needs_the_read_permission(managed_broker: InProcessBroker) -> None:
    http = Http.of(managed_broker)
    assert http.put("/api/queues/%2F/events", {"durable": True, "arguments": {
        "x-queue-type": "stream"}}).status == 201
    assert http.put("/api/users/watcher", {"password": "w", "tags": "management"}).status == 201
    base = "/api/leveret/streams/%2F/events/messages"
    watcher = http.as_user("watcher", "w")
    assert watcher.get(base).body == {"error": "not_authorised",
                                      "reason": "User not authorised to access virtual host"}
    assert http.put("/api/permissions/%2F/watcher",
                    {"configure": "", "write": "", "read": "^other$"}).status == 201
    assert watcher.get(base).body == {
        "error": "not_authorised",
        "reason": "access to queue 'events' in vhost '/' refused for user 'watcher'"}
    assert http.put("/api/permissions/%2F/watcher",
                    {"configure": "", "write": "", "read": ".*"}).status == 204
    assert watcher.get(base).body["messages"] == []
