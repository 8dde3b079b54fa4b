// Scenarios run with amqplib (the Node AMQP 0.9.1 client) against a broker given by URL.
// Usage: node scenarios.js URL SCENARIO QUEUE_PREFIX. Prints one JSON object: what the client
// saw. tests/e2e/test_node_clients.py runs each scenario against Leveret and against the
// reference RabbitMQ and compares the two outputs.
'use strict';
const amqp = require('amqplib');

const [url, scenario, prefix] = process.argv.slice(2);
const wait = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function failure(err) {
  return err ? { code: err.code, message: err.message } : null;
}

// Resolves with the channel's or connection's error, or null if none comes within ms.
// `promise`'s outcome, or `late` after `ms`: the timer is cleared either way, so that it does
// not keep the process alive once the scenario is done.
async function within(promise, ms, late) {
  let timer;
  const timeout = new Promise((resolve) => { timer = setTimeout(resolve, ms, late); });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function nextError(emitter, ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), ms);
    emitter.once('error', (err) => { clearTimeout(timer); resolve(err); });
  });
}

const scenarios = {
  // Publish with confirms, consume with a prefetch, ack: the everyday path.
  async basics(conn) {
    const ch = await conn.createConfirmChannel();
    const q = `${prefix}-basics`;
    await ch.assertQueue(q, { durable: true });
    for (let i = 0; i < 5; i++) ch.sendToQueue(q, Buffer.from(`m${i}`), { persistent: true });
    await ch.waitForConfirms();
    await ch.prefetch(2);
    const got = [];
    await new Promise((resolve) => {
      ch.consume(q, (msg) => {
        if (msg === null) { got.push('cancelled'); return; }
        got.push(msg.content.toString());
        ch.ack(msg);
        if (got.length === 5) resolve();
      });
    });
    await ch.deleteQueue(q);
    await wait(300);
    return { received: got };
  },

  // connection.update-secret mid-stream: the consumer keeps receiving.
  async update_secret(conn) {
    const ch = await conn.createConfirmChannel();
    const q = `${prefix}-secret`;
    await ch.assertQueue(q, { durable: false, autoDelete: false });
    const got = [];
    let arrived = null;
    const { consumerTag } = await ch.consume(q, (msg) => {
      if (msg === null) return;
      got.push(msg.content.toString());
      ch.ack(msg);
      if (arrived) arrived();
    });
    const publish = async (body) => {
      const seen = new Promise((resolve) => { arrived = resolve; });
      ch.sendToQueue(q, Buffer.from(body));
      await ch.waitForConfirms();
      await seen;
    };
    await publish('before');
    await conn.updateSecret(Buffer.from('guest'), 'token refresh');
    await publish('after');
    await ch.cancel(consumerTag);
    await ch.deleteQueue(q);
    return { received: got };
  },

  // A secret that is not the password: the broker answers update-secret-ok, or closes the
  // connection with its code and text if it refuses the secret.
  async update_secret_wrong_password(conn) {
    const closed = new Promise((resolve) => conn.once('close', () => resolve(true)));
    const errored = nextError(conn, 2000);
    const answered = conn.updateSecret(Buffer.from('not-the-password'), 'token refresh')
      .then(() => 'update-secret-ok', (err) => failure(err));
    const outcome = await within(Promise.race([answered, closed]), 5000, 'nothing');
    const err = await errored;
    return { error: failure(err), first: outcome === true ? 'closed' : outcome };
  },

  // A second exclusive consumer from another channel of the same connection.
  async exclusive_other_channel(conn) {
    const q = `${prefix}-excl`;
    const ch1 = await conn.createChannel();
    await ch1.assertQueue(q, { durable: false });
    await ch1.consume(q, () => {}, { exclusive: true });
    const ch2 = await conn.createChannel();
    const errored = nextError(ch2, 5000);
    let refused = null;
    try {
      await ch2.consume(q, () => {}, { exclusive: true });
    } catch (err) {
      refused = err;
    }
    const err = await errored;
    await ch1.deleteQueue(q);
    return { error: failure(refused || err) };
  },

  // The consuming channel deletes its own queue: is the consumer told (a null message)?
  async delete_under_consumer(conn) {
    const q = `${prefix}-del`;
    const ch = await conn.createChannel();
    await ch.assertQueue(q, { durable: false });
    const events = [];
    await ch.consume(q, (msg) => { events.push(msg === null ? 'cancelled' : 'message'); });
    const reply = await ch.deleteQueue(q);
    events.push('delete-ok');
    await wait(300);
    return { events, message_count: reply.messageCount };
  },

  // connection.close with a channel's publishes still buffered: amqplib sends the close ahead
  // of them (amqplib's own suite, 'find high watermark'). The broker must read on after its
  // close-ok until the client closes, or the client's writes fail and close never resolves.
  async close_behind_publishes(conn) {
    const ch = await conn.createChannel();
    const q = `${prefix}-behind`;
    await ch.assertQueue(q, { exclusive: true });
    let sent = 0;
    while (ch.sendToQueue(q, Buffer.from('0123456789'))) sent++;
    const errors = [];
    conn.on('error', (err) => errors.push(err.code || err.message));
    const close = await within(
      conn.close().then(() => 'closed', (err) => `rejected: ${err.code || err.message}`),
      10000, 'no close-ok within 10 s');
    return { filled: sent > 100, close, errors };
  },
};

(async () => {
  const conn = await amqp.connect(url);
  conn.on('error', () => {});
  let result;
  try {
    result = await scenarios[scenario](conn);
  } finally {
    try { await conn.close(); } catch (err) { /* already closed */ }
  }
  process.stdout.write(JSON.stringify(result) + '\n');
})().catch((err) => {
  process.stdout.write(JSON.stringify({ crashed: failure(err) }) + '\n');
  process.exit(1);
});
