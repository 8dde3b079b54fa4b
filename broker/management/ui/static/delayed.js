// A delayed exchange's held messages (docs/DELAYED-MESSAGES.md): how many, the next due time,
// the first N in due order, and deleting one. It only calls the API (api.js).

import {del, enc} from './api.js';
import {Confirm, Err, fmtNum, html, usePoll, useState} from './lib.js';

export function delayedHref(vhost, name) {
  return `#/delayed/${enc(vhost)}/${enc(name)}`;
}

function when(ms) {
  return ms ? new Date(ms).toISOString() : 'none';
}

// null while no leader of the exchange's log answers (a cluster's election)
export function figure(n) {
  return n === null ? 'unknown' : fmtNum(n ?? 0);
}

function Held({m, vhost, name, reload}) {
  return html`<tr data-testid="held"><td>${when(m.due_ms)}</td><td>${m.id}</td>
    <td>${m.routing_key}</td><td>${fmtNum(m.payload_bytes)} bytes, ${m.payload_encoding}</td>
    <td><pre class="payload">${m.payload}</pre></td>
    <td><${Confirm} label="Delete" question="Delete this held message?"
      action=${() => del(`/api/leveret/exchanges/${enc(vhost)}/${enc(name)}/delayed/${m.id}`)}
      done=${reload} /></td></tr>`;
}

export function DelayedPage({vhost, name}) {
  const base = `/api/exchanges/${enc(vhost)}/${enc(name)}`;
  const exchange = usePoll(base);
  const [count, setCount] = useState(20);
  const [shown, setShown] = useState(20);
  const held = usePoll(
    `/api/leveret/exchanges/${enc(vhost)}/${enc(name)}/delayed?count=${shown}`, 5000);
  const x = exchange.data;
  const messages = held.data || [];
  const list = (event) => { event.preventDefault(); setShown(Number(count)); };
  return html`<div class="page"><h1>Delayed messages of ${name}</h1>
    <p class="sub">Exchange ${name} in virtual host ${vhost}</p>
    <${Err} error=${exchange.error} />
    ${x && html`<p data-testid="delayed-summary">${figure(x.messages_delayed)} held,${' '}
      next due ${x.messages_delayed === null ? 'unknown' : when(x.next_due_ms)};${' '}
      ${figure(x.delayed_routed)} routed,${' '}
      ${figure(x.delayed_unroutable)} unroutable since the broker started</p>`}
    <form class="inline" onSubmit=${list} aria-label="list held messages">
      <label>The first <input name="count" type="number" min="0" max="1000" value=${count}
        onInput=${(e) => setCount(e.target.value)} /></label>
      <button type="submit">List</button></form>
    ${held.error && held.error.status !== 404 && html`<${Err} error=${held.error} />`}
    <table data-testid="held-messages"><thead><tr><th>Due</th><th>Id</th><th>Routing key</th>
      <th>Size</th><th>Payload</th><th></th></tr></thead>
    <tbody>${messages.map((m) => html`<${Held} m=${m} vhost=${vhost} name=${name}
      reload=${held.reload} />`)}
    ${(messages.length === 0 && (held.data || held.error)) && html`<tr><td colspan="6"
      class="empty">Nothing held.</td></tr>`}</tbody></table></div>`;
}
