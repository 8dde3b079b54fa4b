// The overview: message rates (from the API's cumulative counters, sampled every 2 s),
// totals, the node and its alarms, the listeners.

import {Chart, Err, fmtBytes, fmtDuration, fmtNum, html, usePoll, useRates} from './lib.js';

const RATES = [['publish', 'Publish'], ['deliver_get', 'Deliver / get'], ['confirm', 'Confirm'],
  ['ack', 'Ack'], ['redeliver', 'Redeliver'], ['get', 'Get'],
  ['return_unroutable', 'Returned unroutable']];

function Totals({overview}) {
  const q = overview.queue_totals || {};
  const o = overview.object_totals || {};
  const cells = [
    ['Messages', q.messages], ['Ready', q.messages_ready],
    ['Unacked', q.messages_unacknowledged], ['Connections', o.connections],
    ['Channels', o.channels], ['Exchanges', o.exchanges], ['Queues', o.queues],
    ['Consumers', o.consumers],
  ];
  return html`<div class="totals" data-testid="totals">${cells.map(([label, value]) =>
    html`<div class="total" data-total=${label.toLowerCase()}><span class="value">${fmtNum(value ?? 0)}</span>
      <span class="label">${label}</span></div>`)}</div>`;
}

function Node({node}) {
  if (!node) return null;
  const alarms = [node.mem_alarm && 'memory', node.disk_free_alarm && 'disk'].filter(Boolean);
  return html`<section><h2>Node</h2>
    ${alarms.length ? html`<p class="error" role="alert" data-testid="alarms">Alarm in force: ${alarms.join(' and ')}: publishers are blocked.</p>` :
      html`<p class="ok" data-testid="alarms">No alarm.</p>`}
    <table class="props"><tbody>
      <tr><th>Name</th><td>${node.name}</td></tr>
      <tr><th>Uptime</th><td>${fmtDuration(node.uptime)}</td></tr>
      <tr><th>Memory</th><td>${fmtBytes(node.mem_used)} of ${fmtBytes(node.mem_limit)}${' '}
        (high watermark)</td></tr>
      <tr><th>Disk free</th><td>${fmtBytes(node.disk_free)}${' '}
        (limit ${fmtBytes(node.disk_free_limit)})</td></tr>
      <tr><th>File descriptors</th><td>${fmtNum(node.fd_used)} of ${fmtNum(node.fd_total)}</td></tr>
      <tr><th>Processors</th><td>${node.processors}</td></tr>
    </tbody></table></section>`;
}

export function Overview() {
  const {data: overview, error} = usePoll('/api/overview', 2000);
  const {data: nodes, error: nodeError} = usePoll('/api/nodes', 5000);
  const rates = useRates(overview && overview.message_stats, RATES.map(([k]) => k));
  const me = overview && nodes && nodes.find((n) => n.name === overview.node);
  return html`<div class="page"><h1>Overview</h1>
    <${Err} error=${error} />
    ${overview && html`<p class="sub">${overview.product_name} ${overview.product_version}${' '}
      (RabbitMQ API ${overview.rabbitmq_version}), cluster ${overview.cluster_name},${' '}
      node ${overview.node}</p>`}
    <section><h2>Message rates</h2>
      <div class="rates" data-testid="rates">${RATES.map(([key, label], i) =>
        html`<span class="rate" data-rate=${key}>${label}${' '}
          <b>${fmtNum(rates.latest[i])}</b> /s</span>`)}</div>
      <${Chart} title="Messages per second" times=${rates.times}
        series=${RATES.map(([, label], i) => ({label, values: rates.values[i]}))} />
    </section>
    ${overview && html`<section><h2>Totals</h2><${Totals} overview=${overview} /></section>`}
    <${Err} error=${nodeError} />
    <${Node} node=${me} />
    ${nodes && nodes.length > 1 && html`<section><h2>Cluster</h2><table><thead><tr>
      <th>Node</th><th>Running</th><th>Uptime</th><th>Alarms</th></tr></thead><tbody>
      ${nodes.map((n) => html`<tr><td>${n.name}</td><td>${n.running ? 'yes' : 'no'}</td>
        <td>${fmtDuration(n.uptime)}</td>
        <td>${[n.mem_alarm && 'memory', n.disk_free_alarm && 'disk'].filter(Boolean)
          .join(', ') || 'none'}</td></tr>`)}</tbody></table></section>`}
    ${overview && html`<section><h2>Listeners</h2><table><thead><tr><th>Protocol</th>
      <th>Address</th><th>Port</th></tr></thead><tbody>${(overview.listeners || []).map((l) =>
        html`<tr><td>${l.protocol}</td><td>${l.ip_address}</td><td>${l.port}</td></tr>`)}
      </tbody></table></section>`}
  </div>`;
}
