// The Node stream client's view of chunks: publish 5,000 messages with a reference, then read
// the first chunk's header (epoch, trailer length: the client logs each Deliver's header at
// debug level) and what a consumer from `last` gets. Prints one JSON line.
const rabbit = require("rabbitmq-stream-js-client")

const headers = []
const logger = {
  debug: (line) => {
    const text = String(line)
    const epoch = /epoch: (\d+)n?/.exec(text)
    const trailer = /trailerLength: (\d+)/.exec(text)
    const first = /chunkFirstOffset: (\d+)n?/.exec(text)
    const entries = /numEntries: (\d+)/.exec(text)
    if (epoch && trailer && first && entries) {
      headers.push({ first: Number(first[1]), entries: Number(entries[1]),
                     epoch: Number(epoch[1]), trailer: Number(trailer[1]) })
    }
  },
  info: () => {}, error: () => {}, warn: () => {},
}

async function consume(client, stream, offset, until) {
  const received = []
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out")), 20000)
    client.declareConsumer({ stream, offset }, (message) => {
      received.push(message.content.toString())
      if (until(received)) { clearTimeout(timer); resolve() }
    }).catch(reject)
  })
  await new Promise((r) => setTimeout(r, 300)) // nothing more arrives
  return received
}

async function main() {
  const [port, stream] = [Number(process.argv[2]), process.argv[3]]
  const params = { hostname: "127.0.0.1", port, username: "guest", password: "guest", vhost: "/" }
  const client = await rabbit.connect(params, logger)
  await client.createStream({ stream, arguments: {} })
  const publisher = await client.declarePublisher({ stream, publisherRef: "node-pub" })
  for (let i = 0; i < 5000; i++) {
    await publisher.send(Buffer.from(`m${i}`))
  }
  await publisher.flush()
  for (let i = 0; i < 100 && Number(await publisher.getLastPublishingId()) < 5000; i++) {
    await new Promise((r) => setTimeout(r, 50))
  }
  const fromLast = await consume(client, stream, rabbit.Offset.last(),
                                 (got) => got[got.length - 1] === "m4999")
  headers.length = 0
  const fromFirst = await consume(client, stream, rabbit.Offset.first(),
                                  (got) => got.length === 5000)
  await client.close()
  const admin = await rabbit.connect(params)
  await admin.deleteStream({ stream })
  await admin.close()
  console.log(JSON.stringify({ last: fromLast.length, lastOfLast: fromLast[fromLast.length - 1],
                               first: fromFirst.length, headers }))
}

main().catch((error) => { console.error(error); process.exit(1) })
