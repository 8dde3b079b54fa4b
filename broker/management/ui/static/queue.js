// One queue or stream: its properties, arguments and consumers (with their offset lag for a
// stream), a live chart, get messages (queue) or read at an offset (stream), purge, delete.

import {del, enc, get, post} from './api.js';
import {Chart, Confirm, Err, fmtBytes, fmtNum, html, jsonText, LagChange, useChange, useEffect,
  usePoll, useRates, useState, useSubmit} from './lib.js';

function Message({m}) {
  return html`<div class="message" data-testid="message">
    <div class="meta">${m.offset !== undefined && html`<span>offset <b>${m.offset}</b></span>`}
      <span>exchange ${m.exchange || '(AMQP default)'}</span>
      <span>routing key ${m.routing_key}</span>
      ${m.redelivered && html`<span>redelivered</span>`}
      <span>${fmtNum(m.payload_bytes)} bytes, ${m.payload_encoding}</span></div>
    ${Object.keys(m.properties || {}).length > 0 &&
      html`<pre class="props">${JSON.stringify(m.properties)}</pre>`}
    <pre class="payload">${m.payload}</pre></div>`;
}

function GetMessages({vhost, name}) {
  const [count, setCount] = useState(1);
  const [ackmode, setAckmode] = useState('ack_requeue_true');
  const [messages, setMessages] = useState(null);
  const [submit, status] = useSubmit(async () => {
    const got = await post(`/api/queues/${enc(vhost)}/${enc(name)}/get`,
      {count: Number(count), ackmode, encoding: 'auto'});
    setMessages(got);
    return got;
  }, (got) => (got.length ? '' : 'The queue is empty.'));
  return html`<section><h2>Get messages</h2>
    <form class="inline" onSubmit=${submit} aria-label="get messages">
      <label>Count <input name="count" type="number" min="1" value=${count}
        onInput=${(e) => setCount(e.target.value)} /></label>
      <label>Then <select name="ackmode" value=${ackmode}
        onChange=${(e) => setAckmode(e.target.value)}>
        <option value="ack_requeue_true">requeue them</option>
        <option value="ack_requeue_false">ack them (remove)</option>
        <option value="reject_requeue_false">reject them (dead-letter)</option></select></label>
      <button type="submit">Get</button>${status}</form>
    ${messages && messages.map((m) => html`<${Message} m=${m} />`)}</section>`;
}

function ReadStream({vhost, name, first}) {
  const [offset, setOffset] = useState(String(first ?? 0));
  const [count, setCount] = useState(10);
  const [result, setResult] = useState(null);
  const [submit, status] = useSubmit(async () => {
    const query = new URLSearchParams({offset: String(offset), count: String(count)});
    const got = await get(`/api/leveret/streams/${enc(vhost)}/${enc(name)}/messages?${query}`);
    setResult(got);
    return got;
  }, (got) => (got.messages.length ? '' : `Nothing committed at offset ${offset} yet.`));
  return html`<section><h2>Read messages</h2>
    <form class="inline" onSubmit=${submit} aria-label="read stream">
      <label>From offset <input name="offset" type="number" min="0" value=${offset}
        onInput=${(e) => setOffset(e.target.value)} /></label>
      <label>Count <input name="count" type="number" min="1" value=${count}
        onInput=${(e) => setCount(e.target.value)} /></label>
      <button type="submit">Read</button>${status}</form>
    ${result && html`<p class="sub">Showing ${result.messages.length} from offset ${offset}${' '}
      (stream holds ${result.first_offset} to ${result.committed_offset}).</p>`}
    ${result && result.messages.map((m) => html`<${Message} m=${m} />`)}</section>`;
}

// Each stream consumer's lag change per second between the last two samples of the queue:
// positive means it falls behind, negative that it catches up.
const consumerKey = (c) => `${c.channel_details && c.channel_details.name}|${c.consumer_tag}`;

function useLagChange(queue) {
  return useChange(queue && queue.type === 'stream' ? queue : null,
    (q) => (q.consumer_details || []).map((c) => [consumerKey(c),
      (c.stream && c.stream.offset_lag) || 0]));
}

function Consumers({queue, lagChange = {}}) {
  const stream = queue.type === 'stream';
  const rows = queue.consumer_details || [];
  const cols = ['Consumer tag', 'Channel', 'Ack', 'Prefetch', 'Active'];
  if (stream) cols.push('Reference', 'Delivered offset', 'Stored offset', 'Lag', 'Lag change');
  return html`<section><h2>Consumers (${rows.length})</h2>
    <table data-testid="consumers"><thead><tr>${cols.map((c) => html`<th>${c}</th>`)}</tr></thead>
    <tbody>${rows.map((c) => {
      const s = c.stream || {};
      const lag = s.offset_lag || 0;
      return html`<tr><td>${c.consumer_tag}</td>
        <td>${c.channel_details && c.channel_details.name}</td>
        <td>${c.ack_required ? 'manual' : 'auto'}</td><td>${fmtNum(c.prefetch_count)}</td>
        <td>${c.active ? 'yes' : `no (${c.activity_status})`}</td>
        ${stream && html`<td>${s.reference}</td><td>${fmtNum(s.offset)}</td>
          <td>${s.stored_offset === null || s.stored_offset === undefined ? '' :
            fmtNum(s.stored_offset)}</td>
          <td class=${lag > 1000 ? 'behind' : ''}>${fmtNum(lag)}</td>
          <${LagChange} rate=${lagChange[consumerKey(c)]} />`}</tr>`;
    })}
    ${rows.length === 0 && html`<tr><td colspan=${cols.length} class="empty">No consumer.
      </td></tr>`}</tbody></table></section>`;
}

function Groups({vhost, name}) {
  const {data, error} = usePoll(`/api/leveret/consumer-groups/${enc(vhost)}`, 3000);
  const groups = (data || []).filter((g) => g.stream === name);
  if (!groups.length && !error) return null;
  return html`<section><h2>Single active consumer groups</h2><${Err} error=${error} />
    <table data-testid="groups"><thead><tr><th>Reference</th><th>Member</th>
      <th>Connection</th><th>State</th></tr></thead><tbody>
    ${groups.map((g) => g.members.map((m, i) => html`<tr>
      <td>${i === 0 ? g.reference : ''}</td><td>${m.subscription_id}</td>
      <td>${m.connection_name}</td><td class=${m.state}>${m.state}</td></tr>`))}
    </tbody></table></section>`;
}

function Tracking({vhost, name}) {
  const {data, error} = usePoll(`/api/leveret/streams/${enc(vhost)}/${enc(name)}/tracking`,
    5000);
  if (!data) return html`<${Err} error=${error} />`;
  return html`<section><h2>Offset tracking</h2><${Err} error=${error} />
    <table><thead><tr><th>Kind</th><th>Name</th><th>Offset or publishing id</th></tr></thead>
    <tbody>${(data.consumers || []).map((c) => html`<tr><td>consumer</td>
      <td>${c.reference}</td><td>${fmtNum(c.stored_offset)}</td></tr>`)}
    ${(data.publishers || []).map((p) => html`<tr><td>publisher</td>
      <td>${p.reference}</td><td>${fmtNum(p.last_publishing_id)}</td></tr>`)}
    ${!(data.consumers || []).length && !(data.publishers || []).length &&
      html`<tr><td colspan="3" class="empty">No stored offset or publisher.</td></tr>`}
    </tbody></table></section>`;
}

function Props({queue}) {
  const stream = queue.type === 'stream';
  const rows = [
    ['Type', queue.type], ['Node', queue.node], ['State', queue.state],
    ['Features', [queue.durable && 'durable', queue.auto_delete && 'auto-delete',
      queue.exclusive && 'exclusive'].filter(Boolean).join(', ')],
    ['Policy', queue.policy || ''], ['Arguments', jsonText(queue.arguments)],
  ];
  if (queue.members) {  // a quorum queue or a stream: its leader and members (RabbitMQ's)
    const online = new Set(queue.online || []);
    rows.push(['Leader', queue.leader || ''],
      ['Members', queue.members.map((m) => (online.has(m) ? m : `${m} (down)`)).join(', ')]);
  }
  if (queue.type === 'quorum') {
    rows.push(['Delivery limit', typeof queue.delivery_limit === 'number' ?
      fmtNum(queue.delivery_limit) : (queue.delivery_limit || '')]);
  }
  if (stream) {
    rows.push(['First offset', fmtNum(queue.first_offset)],
      ['Committed offset', fmtNum(queue.committed_offset)],
      ['Next offset', fmtNum(queue.next_offset)], ['Segments', fmtNum(queue.segments)],
      ['Size', fmtBytes(queue.bytes)]);
    if (queue.super_stream) {
      rows.push(['Super stream', `${queue.super_stream} (partition ${queue.partition_index})`]);
    }
  } else {
    rows.push(['Messages', fmtNum(queue.messages)], ['Ready', fmtNum(queue.messages_ready)],
      ['Unacked', fmtNum(queue.messages_unacknowledged)]);
  }
  return html`<table class="props" data-testid="properties"><tbody>${rows.map(([k, v]) =>
    html`<tr><th>${k}</th><td>${v}</td></tr>`)}</tbody></table>`;
}

const LABELS = {appended: 'Appended', delivered: 'Delivered', publish: 'Publish',
  deliver_get: 'Deliver / get', ack: 'Ack', redeliver: 'Redeliver', get: 'Get'};

export function QueuePage({vhost, name}) {
  const path = `/api/queues/${enc(vhost)}/${enc(name)}`;
  const {data: queue, error, reload} = usePoll(path, 2000);
  const [gone, setGone] = useState(false);
  const stream = queue && queue.type === 'stream';
  const sample = queue && (stream ? {appended: queue.committed_offset,
    delivered: (queue.message_stats || {}).deliver_get} : queue.message_stats);
  const keys = stream ? ['appended', 'delivered'] : ['publish', 'deliver_get', 'ack', 'redeliver',
    'get'];
  const rates = useRates(sample, keys);
  const lagChange = useLagChange(queue);
  useEffect(() => setGone(false), [path]);
  if (gone) {
    return html`<div class="page"><p class="note" role="status">Deleted ${name}.${' '}
      <a href="#/queues">Back to the queues.</a></p></div>`;
  }
  const lag = stream ? (queue.consumer_details || []).reduce(
    (sum, c) => sum + ((c.stream && c.stream.offset_lag) || 0), 0) : 0;
  return html`<div class="page"><h1>${stream ? 'Stream' : 'Queue'} <span class="name"
      data-testid="queue-name">${name}</span></h1>
    <p class="sub">in virtual host ${vhost}</p>
    <${Err} error=${error} />
    ${queue && html`<div class="columns"><${Props} queue=${queue} />
      <div class="grow"><${Chart} key=${stream ? 's' : 'q'}
        title=${stream ? 'Messages per second' : 'Messages per second'}
        times=${rates.times} series=${keys.map((k, i) => ({label: LABELS[k],
          values: rates.values[i]}))} />
        ${stream && html`<p class="sub" data-testid="lag">Consumers' total lag:${' '}
          <b>${fmtNum(lag)}</b> messages behind the committed offset.</p>`}</div></div>
      <${Consumers} queue=${queue} lagChange=${lagChange} />
      ${stream && html`<${Groups} vhost=${vhost} name=${name} />`}
      ${stream ? html`<${ReadStream} vhost=${vhost} name=${name} first=${queue.first_offset} />
        <${Tracking} vhost=${vhost} name=${name} />` :
        html`<${GetMessages} vhost=${vhost} name=${name} />`}
      <section class="actions"><h2>Actions</h2>
        ${!stream && html`<${Confirm} label="Purge" question=${`Remove every message of ${name}?`}
          action=${() => del(`${path}/contents`)} done=${reload} />`}
        <${Confirm} label="Delete" question=${`Delete ${name} and its messages?`}
          action=${() => del(path)} done=${() => setGone(true)} /></section>`}
  </div>`;
}
