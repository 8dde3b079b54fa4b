// The Node stream client against a stream listener: create a stream, publish with a
// reference (deduplication), query the publisher sequence, consume from first, store and
// query an offset, delete. Prints one JSON line with what it saw.
const rabbit = require("rabbitmq-stream-js-client")

async function main() {
  const [port, stream] = [Number(process.argv[2]), process.argv[3]]
  const client = await rabbit.connect({
    hostname: "127.0.0.1", port, username: "guest", password: "guest", vhost: "/",
  })
  await client.createStream({ stream, arguments: {} })
  const publisher = await client.declarePublisher({ stream, publisherRef: "node-pub" })
  for (let i = 0; i < 5; i++) {
    await publisher.send(Buffer.from(`m${i}`), { applicationProperties: { i: `p${i}` } })
  }
  await publisher.flush()
  const sequence = Number(await publisher.getLastPublishingId())
  const received = []
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out")), 10000)
    client.declareConsumer({ stream, offset: rabbit.Offset.first() }, (message) => {
      received.push([Number(message.offset), message.content.toString(),
                     message.applicationProperties.i])
      if (received.length === 5) { clearTimeout(timer); resolve() }
    }).catch(reject)
  })
  const consumer = await client.declareConsumer(
    { stream, offset: rabbit.Offset.first(), consumerRef: "node-reader" }, () => {})
  await consumer.storeOffset(3n)
  let stored = null
  for (let i = 0; i < 50 && stored === null; i++) {
    try { stored = Number(await consumer.queryOffset()) } catch (e) { await new Promise((r) => setTimeout(r, 50)) }
  }
  await client.close()
  // the stream is deleted on a fresh connection, once the publisher and consumers are closed
  const admin = await rabbit.connect({
    hostname: "127.0.0.1", port, username: "guest", password: "guest", vhost: "/",
  })
  await admin.deleteStream({ stream })
  await admin.close()
  console.log(JSON.stringify({ sequence, received, stored }))
}

main().catch((error) => { console.error(error); process.exit(1) })
