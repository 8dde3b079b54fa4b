// The list pages: connections, channels, exchanges, queues and streams. Each is paged and
// filtered by the server; the forms declare and delete through the API.

import {del, enc, put} from './api.js';
import {delayedHref, figure} from './delayed.js';
import {Confirm, fmtBytes, fmtNum, html, jsonText, PagedList, queueHref, useState, useSubmit,
  VhostSelect} from './lib.js';

export function Connections() {
  return html`<div class="page"><h1>Connections</h1>
    <${PagedList} path="/api/connections" testid="connections"
      columns=${['Name', 'User', 'Virtual host', 'Client', 'Protocol', 'Channels', 'Node', '']}
      row=${(c) => html`<tr><td>${c.name}</td><td>${c.user}</td><td>${c.vhost}</td>
        <td>${(c.client_properties && (c.client_properties.product || '')) || ''}</td>
        <td>${c.protocol}</td><td>${fmtNum(c.channels)}</td><td>${c.node}</td>
        <td><${Confirm} label="Close" question="Close this connection?"
          action=${() => del(`/api/connections/${enc(c.name)}`)} /></td></tr>`} /></div>`;
}

export function Channels() {
  return html`<div class="page"><h1>Channels</h1>
    <${PagedList} path="/api/channels" testid="channels"
      columns=${['Channel', 'User', 'Virtual host', 'Mode', 'Prefetch', 'Unacked', 'Consumers']}
      row=${(c) => html`<tr><td>${c.name}</td><td>${c.user}</td><td>${c.vhost}</td>
        <td>${[c.confirm && 'confirm', c.transactional && 'transactional'].filter(Boolean)
          .join(', ')}</td><td>${fmtNum(c.prefetch_count)}</td>
        <td>${fmtNum(c.messages_unacknowledged)}</td><td>${fmtNum(c.consumer_count)}</td>
      </tr>`} /></div>`;
}

function DeclareExchange() {
  const [vhost, setVhost] = useState('/');
  const [name, setName] = useState('');
  const [type, setType] = useState('direct');
  const [durable, setDurable] = useState(true);
  const [submit, status] = useSubmit(
    () => put(`/api/exchanges/${enc(vhost)}/${enc(name)}`,
      {type, durable, auto_delete: false, internal: false, arguments: {}}),
    () => `Exchange ${name} declared.`);
  return html`<form class="inline" onSubmit=${submit} aria-label="declare exchange">
    <h2>Declare an exchange</h2>
    <label>Virtual host <${VhostSelect} value=${vhost} onChange=${setVhost} /></label>
    <label>Name <input name="name" required value=${name}
      onInput=${(e) => setName(e.target.value)} /></label>
    <label>Type <select name="type" value=${type} onChange=${(e) => setType(e.target.value)}>
      ${['direct', 'fanout', 'topic', 'headers'].map((t) =>
        html`<option value=${t}>${t}</option>`)}</select></label>
    <label><input type="checkbox" checked=${durable}
      onChange=${(e) => setDurable(e.target.checked)} /> durable</label>
    <button type="submit">Declare</button>${status}</form>`;
}

// a delayed exchange's held messages (docs/DELAYED-MESSAGES.md), linked to their page, or nothing
function delayed(x) {
  if (x.messages_delayed === undefined) return '';
  const next = x.next_due_ms ? `, next due ${new Date(x.next_due_ms).toISOString()}` : '';
  return html`<a href=${delayedHref(x.vhost, x.name)}>delayed: ${figure(x.messages_delayed)}${' '}
    held${next}</a>`;
}

export function Exchanges() {
  return html`<div class="page"><h1>Exchanges</h1>
    <${PagedList} path="/api/exchanges" testid="exchanges"
      columns=${['Name', 'Virtual host', 'Type', 'Features', 'Arguments', '']}
      row=${(x) => html`<tr><td>${x.name || '(AMQP default)'}</td><td>${x.vhost}</td>
        <td>${x.type}</td><td>${[x.durable && 'durable', x.auto_delete && 'auto-delete',
          x.internal && 'internal', delayed(x)].filter(Boolean)
          .flatMap((f, i) => (i ? [', ', f] : [f]))}</td>
        <td class="args">${jsonText(x.arguments)}</td>
        <td>${x.name && !x.name.startsWith('amq.') && html`<${Confirm} label="Delete"
          question=${`Delete exchange ${x.name}?`}
          action=${() => del(`/api/exchanges/${enc(x.vhost)}/${enc(x.name)}`)} />`}</td>
      </tr>`} />
    <${DeclareExchange} /></div>`;
}

function depth(q) {
  if (q.type === 'stream') {
    return html`<span title="first / committed offset">offsets${' '}
      ${fmtNum(q.first_offset)} to ${fmtNum(q.committed_offset)} (${fmtBytes(q.bytes)})</span>`;
  }
  return html`<span>${fmtNum(q.messages)} (${fmtNum(q.messages_ready)}${' '}
    ready, ${fmtNum(q.messages_unacknowledged)} unacked)</span>`;
}

function DeclareQueue() {
  const [vhost, setVhost] = useState('/');
  const [name, setName] = useState('');
  const [type, setType] = useState('classic');
  const [durable, setDurable] = useState(true);
  const [args, setArgs] = useState('');
  const [submit, status] = useSubmit(async () => {
    let extra = {};
    if (args.trim()) {
      try {
        extra = JSON.parse(args);
      } catch (e) {
        throw new Error(`The arguments are not valid JSON: ${e.message}`);
      }
    }
    return put(`/api/queues/${enc(vhost)}/${enc(name)}`, {durable, auto_delete: false,
      arguments: {...extra, 'x-queue-type': type}});
  }, () => `Queue ${name} declared.`);
  return html`<form class="inline" onSubmit=${submit} aria-label="declare queue">
    <h2>Declare a queue or stream</h2>
    <label>Virtual host <${VhostSelect} value=${vhost} onChange=${setVhost} /></label>
    <label>Name <input name="name" required value=${name}
      onInput=${(e) => setName(e.target.value)} /></label>
    <label>Type <select name="type" value=${type} onChange=${(e) => setType(e.target.value)}>
      <option value="classic">classic</option><option value="quorum">quorum</option>
      <option value="stream">stream</option>
    </select></label>
    <label><input type="checkbox" checked=${durable}
      onChange=${(e) => setDurable(e.target.checked)} /> durable</label>
    <label>Arguments (JSON) <input name="arguments" placeholder='{"x-max-age": "7D"}'
      value=${args} onInput=${(e) => setArgs(e.target.value)} /></label>
    <button type="submit">Declare</button>${status}</form>`;
}

export function Queues() {
  return html`<div class="page"><h1>Queues and streams</h1>
    <${PagedList} path="/api/queues" testid="queues"
      columns=${['Name', 'Virtual host', 'Type', 'Messages or offsets', 'Consumers', 'Node',
        'Arguments']}
      row=${(q) => html`<tr><td><a href=${queueHref(q.vhost, q.name)}>${q.name}</a>
          ${q.super_stream && html` <span class="tag">partition${' '}
            ${q.partition_index} of ${q.super_stream}</span>`}</td>
        <td>${q.vhost}</td><td>${q.type}</td><td>${depth(q)}</td>
        <td>${fmtNum(q.consumers)}</td><td>${q.node}</td>
        <td class="args">${jsonText(q.arguments)}</td></tr>`} />
    <${DeclareQueue} /></div>`;
}
