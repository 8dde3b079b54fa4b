// Shared pieces of the UI: the htm binding, polling, paged server-side lists, confirm
// buttons, the chart and number formats. Every value is rendered as text by Preact (never as
// HTML), so a name with markup in it shows as that markup's text.

import {h} from 'preact';
import {useCallback, useEffect, useRef, useState} from 'preact/hooks';
import htm from 'htm';
import uPlot from 'uplot';
import {enc, get} from './api.js';

export const html = htm.bind(h);
export {useCallback, useEffect, useRef, useState};

export function fmtNum(n) {
  if (n === null || n === undefined || n === '') return '';
  if (typeof n !== 'number') return String(n);
  return n.toLocaleString('en-US', {maximumFractionDigits: 1});
}

export function fmtBytes(n) {
  if (typeof n !== 'number') return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function fmtDuration(ms) {
  let s = Math.floor((ms || 0) / 1000);
  const d = Math.floor(s / 86400); s %= 86400;
  const hr = Math.floor(s / 3600); s %= 3600;
  const m = Math.floor(s / 60); s %= 60;
  return d ? `${d}d ${hr}h` : hr ? `${hr}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
}

export function jsonText(value) {
  if (value === null || value === undefined) return '';
  if (typeof value === 'object' && Object.keys(value).length === 0) return '';
  return JSON.stringify(value);
}

export function queueHref(vhost, name) {
  return `#/queues/${enc(vhost)}/${enc(name)}`;
}

export function Err({error}) {
  if (!error) return null;
  return html`<p class="error" role="alert">${error.message || String(error)}</p>`;
}

export function Note({text}) {
  return text ? html`<p class="note" role="status">${text}</p>` : null;
}

// Fetch `path` now and every `every` ms while mounted; `reload()` fetches at once.
export function usePoll(path, every = 5000) {
  const [state, setState] = useState({data: null, error: null});
  const [tick, setTick] = useState(0);
  useEffect(() => {
    if (!path) return undefined;
    let live = true;
    const load = () => get(path).then(
      (data) => live && setState({data, error: null}),
      (error) => live && setState((s) => ({data: s.data, error})));
    load();
    const timer = every ? setInterval(load, every) : null;
    return () => { live = false; if (timer) clearInterval(timer); };
  }, [path, every, tick]);
  return {...state, reload: () => setTick((t) => t + 1)};
}

// A button that asks "really?" in place before it acts; errors show next to it.
export function Confirm({label, question, action, done}) {
  const [asking, setAsking] = useState(false);
  const [error, setError] = useState(null);
  const go = async () => {
    setError(null);
    try {
      await action();
      setAsking(false);
      if (done) done();
    } catch (e) {
      setError(e);
    }
  };
  if (!asking) {
    return html`<span><button class="danger" onClick=${() => setAsking(true)}>${label}</button>
      <${Err} error=${error} /></span>`;
  }
  return html`<span class="confirm">${question}
    <button class="danger" onClick=${go}>Yes, ${label.toLowerCase()}</button>
    <button onClick=${() => setAsking(false)}>Cancel</button><${Err} error=${error} /></span>`;
}

// A list the server pages and filters (page, page_size, name, use_regex), as the API does.
export function PagedList({path, columns, row, filter = true, every = 5000, pageSize = 20,
                           testid}) {
  const [page, setPage] = useState(1);
  const [name, setName] = useState('');
  const [regex, setRegex] = useState(false);
  const query = new URLSearchParams({page: String(page), page_size: String(pageSize)});
  if (name) { query.set('name', name); query.set('use_regex', regex ? 'true' : 'false'); }
  const {data, error} = usePoll(`${path}?${query}`, every);
  const items = data ? data.items : [];
  return html`<div class="list" data-testid=${testid}>
    ${filter && html`<div class="filter">
      <label>Filter <input name="filter" value=${name}
        onInput=${(e) => { setName(e.target.value); setPage(1); }} /></label>
      <label><input type="checkbox" checked=${regex}
        onChange=${(e) => setRegex(e.target.checked)} /> regular expression</label></div>`}
    <${Err} error=${error} />
    <table><thead><tr>${columns.map((c) => html`<th>${c}</th>`)}</tr></thead>
    <tbody>${items.map(row)}
      ${data && items.length === 0 && html`<tr><td colspan=${columns.length} class="empty">
        Nothing here.</td></tr>`}</tbody></table>
    ${data && html`<div class="pager">
      <button disabled=${page <= 1} onClick=${() => setPage(page - 1)}>Previous</button>
      <span>Page ${data.page} of ${data.page_count} (${fmtNum(data.filtered_count)}${' '}
        shown of ${fmtNum(data.total_count)})</span>
      <button disabled=${page >= data.page_count} onClick=${() => setPage(page + 1)}>Next</button>
    </div>`}</div>`;
}

// The vhosts the user may see, for the forms' selects.
export function useVhosts() {
  const {data} = usePoll('/api/vhosts', 0);
  return data ? data.map((v) => v.name) : ['/'];
}

export function VhostSelect({value, onChange}) {
  const vhosts = useVhosts();
  return html`<select name="vhost" value=${value} onChange=${(e) => onChange(e.target.value)}>
    ${vhosts.map((v) => html`<option value=${v}>${v}</option>`)}</select>`;
}

// A form's submit: runs `action`, then shows `okText` or the API's error in plain words.
export function useSubmit(action, okText) {
  const [state, setState] = useState({error: null, note: ''});
  const submit = async (event) => {
    if (event) event.preventDefault();
    setState({error: null, note: ''});
    try {
      const result = await action();
      setState({error: null, note: typeof okText === 'function' ? okText(result) : okText});
    } catch (error) {
      setState({error, note: ''});
    }
  };
  return [submit, html`<${Err} error=${state.error} /><${Note} text=${state.note} />`];
}

const COLORS = ['#2f7ed8', '#e4572e', '#17a398', '#8e44ad', '#f39c12', '#7f8c8d', '#c0392b',
  '#2c3e50'];

// A live line chart (uPlot) of `series` ({label, values}) over `times` (seconds).
export function Chart({title, times, series, height = 220, unit = '/s'}) {
  const box = useRef(null);
  const plot = useRef(null);
  const labels = series.map((s) => s.label).join('|');
  useEffect(() => {
    const width = Math.max(300, (box.current && box.current.clientWidth) || 600);
    const opts = {
      title, width, height,
      series: [{}, ...series.map((s, i) => ({
        label: s.label, stroke: COLORS[i % COLORS.length], width: 2,
        value: (u, v) => (v === null || v === undefined ? '-' : `${fmtNum(v)}${unit}`)}))],
      axes: [{}, {size: 60, values: (u, vals) => vals.map((v) => fmtNum(v))}],
      scales: {y: {range: (u, min, max) => [0, Math.max(1, max * 1.1)]}},
    };
    plot.current = new uPlot(opts, [times, ...series.map((s) => s.values)], box.current);
    const resize = () => plot.current && box.current &&
      plot.current.setSize({width: Math.max(300, box.current.clientWidth), height});
    window.addEventListener('resize', resize);
    return () => {
      window.removeEventListener('resize', resize);
      plot.current.destroy();
      plot.current = null;
    };
  }, [labels, title]);
  useEffect(() => {
    if (plot.current) plot.current.setData([times, ...series.map((s) => s.values)]);
  });
  return html`<div class="chart" ref=${box}></div>`;
}

// Rates from cumulative counters sampled every poll: {times, series, latest}; a counter that
// goes back (a queue deleted) counts as no change.
export function useRates(sample, keys, size = 90) {
  const hist = useRef({times: [], values: keys.map(() => []), last: null});
  const h0 = hist.current;
  if (sample && sample !== h0.seen) {
    h0.seen = sample;
    const now = Date.now() / 1000;
    if (!h0.last || now - h0.last.t >= 0.2) {
      if (h0.last) {
        const dt = now - h0.last.t;
        h0.times.push(now);
        keys.forEach((k, i) => {
          const diff = (sample[k] || 0) - (h0.last.v[k] || 0);
          h0.values[i].push(Math.max(0, diff) / dt);
        });
        if (h0.times.length > size) {
          h0.times.shift();
          h0.values.forEach((v) => v.shift());
        }
      }
      h0.last = {t: now, v: {...sample}};
    }
  }
  const h1 = hist.current;
  const latest = keys.map((k, i) => h1.values[i][h1.values[i].length - 1] ?? 0);
  return {times: h1.times, values: h1.values, latest};
}

// Each entry's change per second of a level (an offset lag) between the last two answers of
// a poll: `entries(source)` gives [key, value] pairs. Positive: the level grows (a consumer
// falls behind); negative: it shrinks (it catches up). A key seen once has no change yet.
export function useChange(source, entries) {
  const last = useRef({seen: null, at: 0, values: {}, change: {}});
  const state = last.current;
  if (source && source !== state.seen) {
    const now = Date.now() / 1000;
    const values = {};
    const change = {};
    for (const [key, value] of entries(source)) {
      values[key] = value;
      if (key in state.values && now > state.at) {
        change[key] = (value - state.values[key]) / (now - state.at);
      }
    }
    last.current = {seen: source, at: now, values, change};
  }
  return last.current.change;
}

// A lag change per second as text: `+12/s` (falling behind, in red), `-3/s` (catching up).
export function lagChangeText(rate) {
  return `${rate > 0 ? '+' : ''}${fmtNum(Math.round(rate))}/s`;
}

export function lagChangeClass(rate) {
  return rate > 0.5 ? 'behind' : rate < -0.5 ? 'catching-up' : '';
}

export function LagChange({rate}) {
  if (rate === undefined) return html`<td></td>`;
  return html`<td class=${lagChangeClass(rate)} data-testid="lag-change">${lagChangeText(rate)}
    </td>`;
}
