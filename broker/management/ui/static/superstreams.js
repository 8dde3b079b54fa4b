// Super streams: their partitions (binding key, offsets) and, per consumer group, which
// member is active on which partition, the group's offset lag on each and its change per
// second (sampled from the polls, as a stream's page does per consumer). Add and delete.

import {del, enc, put} from './api.js';
import {Confirm, Err, fmtNum, html, LagChange, lagChangeClass, lagChangeText, queueHref,
  useChange, usePoll, useState, useSubmit, VhostSelect} from './lib.js';

const groupKey = (g) => `${g.vhost}|${g.stream}|${g.reference}`;

// One consumer group (a reference) across the partitions: on each, its active member, its
// offset lag (the committed offset minus the active member's offset) and the lag's change
// per second; then the group's total lag and change.
function Group({reference, byPartition, partitions, change}) {
  let total = 0;
  let totalChange;
  for (const g of Object.values(byPartition)) {
    total += g.offset_lag || 0;
    const rate = change[groupKey(g)];
    if (rate !== undefined) totalChange = (totalChange || 0) + rate;
  }
  return html`<tr data-reference=${reference}><td>${reference}</td>${partitions.map((p) => {
    const group = byPartition[p.name];
    if (!group) return html`<td class="empty">no member</td>`;
    const active = group.members.find((m) => m.state === 'active');
    const rate = change[groupKey(group)];
    const lag = group.offset_lag || 0;
    return html`<td>${active ? html`<span class="active">${active.connection_name}${' '}
      #${active.subscription_id}</span>` : html`<span class="inactive">none active</span>`}
      <span class="sub">${' '}(${group.members.length} member${group.members.length === 1 ? '' :
        's'})</span><br /><span class=${lag > 1000 ? 'lag behind' : 'lag'}
        data-testid="partition-lag">lag ${fmtNum(lag)}</span>${rate !== undefined &&
        html`${' '}<span class=${lagChangeClass(rate)} data-testid="partition-lag-change">${
          lagChangeText(rate)}</span>`}</td>`;
  })}<td class=${total > 1000 ? 'behind' : ''} data-testid="group-lag">${fmtNum(total)}</td>
    <${LagChange} rate=${totalChange} /></tr>`;
}

function SuperStream({s, groups, change, reload}) {
  const references = {};
  for (const g of groups) {
    if (s.partitions.some((p) => p.name === g.stream)) {
      (references[g.reference] ||= {})[g.stream] = g;
    }
  }
  return html`<section class="superstream" data-testid="super-stream"><h2>${s.name}
      <span class="sub">in ${s.vhost}</span></h2>
    <table><thead><tr><th>Partition</th><th>Stream</th><th>Binding key</th><th>Messages</th>
      <th>Committed offset</th></tr></thead><tbody>${s.partitions.map((p) => html`<tr>
      <td>${p.partition_index}</td><td><a href=${queueHref(s.vhost, p.name)}>${p.name}</a></td>
      <td>${p.binding_key}</td><td>${fmtNum(p.messages)}</td>
      <td>${fmtNum(p.committed_offset)}</td></tr>`)}</tbody></table>
    <h3>Consumer groups</h3>
    ${Object.keys(references).length ? html`<table data-testid="consumer-groups"><thead><tr>
      <th>Reference</th>${s.partitions.map((p) => html`<th>Partition ${p.partition_index}</th>`)}
      <th>Total lag</th><th>Lag change</th>
      </tr></thead><tbody>${Object.entries(references).map(([ref, byPartition]) =>
        html`<${Group} reference=${ref} byPartition=${byPartition}
          partitions=${s.partitions} change=${change} />`)}</tbody></table>` :
      html`<p class="empty">No single active consumer group.</p>`}
    <${Confirm} label="Delete" question=${`Delete super stream ${s.name} and its partitions?`}
      action=${() => del(`/api/leveret/super-streams/${enc(s.vhost)}/${enc(s.name)}`)}
      done=${reload} /></section>`;
}

function AddSuperStream({reload}) {
  const [vhost, setVhost] = useState('/');
  const [name, setName] = useState('');
  const [partitions, setPartitions] = useState(3);
  const [submit, status] = useSubmit(async () => {
    await put(`/api/leveret/super-streams/${enc(vhost)}/${enc(name)}`,
      {partitions: Number(partitions)});
    reload();
  }, () => `Super stream ${name} added.`);
  return html`<form class="inline" onSubmit=${submit} aria-label="add super stream">
    <h2>Add a super stream</h2>
    <label>Virtual host <${VhostSelect} value=${vhost} onChange=${setVhost} /></label>
    <label>Name <input name="name" required value=${name}
      onInput=${(e) => setName(e.target.value)} /></label>
    <label>Partitions <input name="partitions" type="number" min="1" value=${partitions}
      onInput=${(e) => setPartitions(e.target.value)} /></label>
    <button type="submit">Add</button>${status}</form>`;
}

export function SuperStreams() {
  const {data, error, reload} = usePoll('/api/leveret/super-streams', 3000);
  const {data: groups, error: groupError} = usePoll('/api/leveret/consumer-groups', 3000);
  const change = useChange(groups, (gs) => gs.map((g) => [groupKey(g), g.offset_lag || 0]));
  return html`<div class="page"><h1>Super streams</h1>
    <${Err} error=${error} /><${Err} error=${groupError} />
    ${data && data.length === 0 && html`<p class="empty">No super stream.</p>`}
    ${(data || []).map((s) => html`<${SuperStream} s=${s} groups=${groups || []}
      change=${change} reload=${reload} />`)}
    <${AddSuperStream} reload=${reload} /></div>`;
}
