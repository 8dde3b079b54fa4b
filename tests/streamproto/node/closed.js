// The Node client's "closed_connection listener is invoked by the server if it closes the
// connection" (its test/e2e/connection_closed_listener.test.ts), then its documented recovery
// (client.restart()): a client with a publisher and a consumer, each with a
// connectionClosedListener; the management API closes every connection of the client, as its
// test's rabbit.closeAllConnections() does (DELETE /api/connections/{name}); each listener is
// called once; client.restart() reopens them, and a message published then is consumed.
// Prints one JSON line with what it saw.
const rabbit = require("rabbitmq-stream-js-client")

const [port, managementPort, stream] = [Number(process.argv[2]), Number(process.argv[3]),
                                        process.argv[4]]
const hostname = process.argv[5] || "localhost"
const auth = "Basic " + Buffer.from("guest:guest").toString("base64")
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function api(method, path) {
  const response = await fetch(`http://127.0.0.1:${managementPort}${path}`,
                               { method, headers: { authorization: auth } })
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status}`)
  return method === "GET" ? response.json() : null
}

async function eventually(check, timeout, what) {
  const deadline = Date.now() + timeout
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`)
    await sleep(10)
  }
}

async function ours(name) {
  const all = await api("GET", "/api/connections")
  return all.filter((c) => (c.client_properties || {}).connection_name === name)
}

async function main() {
  const name = `node-closed-${stream}`
  const calls = { client: 0, publisher: 0, consumer: 0 }
  const received = []
  const client = await rabbit.connect({
    hostname, port, username: "guest", password: "guest", vhost: "/", heartbeat: 0,
    connectionName: name, listeners: { connection_closed: () => { calls.client++ } },
  })
  await client.createStream({ stream, arguments: {} })
  const publisher = await client.declarePublisher({
    stream, publisherRef: "the-publisher", connectionClosedListener: () => { calls.publisher++ },
  })
  await client.declareConsumer({
    stream, consumerRef: "the-consumer", offset: rabbit.Offset.first(),
    connectionClosedListener: () => { calls.consumer++ },
  }, (message) => { received.push(message.content.toString()) })
  await publisher.send(Buffer.from("before"))
  await eventually(() => received.length === 1, 10000, "the first message")

  // the management API lists the client's connections once its statistics are out (RabbitMQ
  // every 5 s by default; its test sleeps 5 s), then closes each
  let listed = []
  for (const deadline = Date.now() + 15000; listed.length < 3 && Date.now() < deadline;) {
    listed = await ours(name)
    if (listed.length < 3) await sleep(50)
  }
  for (const connection of listed) {
    await api("DELETE", `/api/connections/${encodeURIComponent(connection.name)}`)
  }
  await eventually(() => calls.client >= 1 && calls.publisher >= 1 && calls.consumer >= 1, 5000,
                   `the close listeners: ${JSON.stringify(calls)}`)
  await sleep(500)  // its test then checks for 5 s that none is called twice
  const afterClose = { ...calls }

  await client.restart()  // as its README's connection_closed example does
  await publisher.send(Buffer.from("after"))
  await eventually(() => received.includes("after"), 10000, "the message sent after restart")
  const reopened = (await ours(name)).length
  await client.close()
  const admin = await rabbit.connect({
    hostname, port, username: "guest", password: "guest", vhost: "/", heartbeat: 0,
  })
  await admin.deleteStream({ stream })
  await admin.close()
  console.log(JSON.stringify({ listed: listed.length, afterClose, received, reopened }))
}

main().catch((error) => { console.error(error); process.exit(1) })
