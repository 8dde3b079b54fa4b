// The UI's shell: the login page, the navigation and the hash router (#/queues, ...).

import {render} from 'preact';
import {ApiError, forget, get, loggedIn, remember} from './api.js';
import {Err, html, useEffect, useState} from './lib.js';
import {Overview} from './overview.js';
import {Channels, Connections, Exchanges, Queues} from './lists.js';
import {QueuePage} from './queue.js';
import {DelayedPage} from './delayed.js';
import {SuperStreams} from './superstreams.js';
import {Definitions, Permissions, Policies, Users, Vhosts} from './admin.js';

const PAGES = [
  ['', 'Overview', Overview],
  ['connections', 'Connections', Connections],
  ['channels', 'Channels', Channels],
  ['exchanges', 'Exchanges', Exchanges],
  ['queues', 'Queues and streams', Queues],
  ['super-streams', 'Super streams', SuperStreams],
  ['users', 'Users', Users],
  ['vhosts', 'Virtual hosts', Vhosts],
  ['permissions', 'Permissions', Permissions],
  ['policies', 'Policies', Policies],
  ['definitions', 'Definitions', Definitions],
];

function route() {
  const parts = location.hash.replace(/^#\/?/, '').split('/').map((p) => {
    try { return decodeURIComponent(p); } catch (_) { return p; }
  });
  return parts;
}

function Login({onLogin, reason}) {
  const [user, setUser] = useState('');
  const [password, setPassword] = useState('');
  const [error, setError] = useState(reason ? new Error(reason) : null);
  const submit = async (event) => {
    event.preventDefault();
    remember(user, password);
    try {
      onLogin(await get('/api/whoami'));
    } catch (e) {
      forget();
      setError(e);
    }
  };
  return html`<main class="login"><h1>Leveret</h1>
    <form onSubmit=${submit} aria-label="login">
      <label>Username <input name="username" autocomplete="username" value=${user}
        onInput=${(e) => setUser(e.target.value)} /></label>
      <label>Password <input name="password" type="password" autocomplete="current-password"
        value=${password} onInput=${(e) => setPassword(e.target.value)} /></label>
      <button type="submit">Log in</button>
      <${Err} error=${error} />
    </form></main>`;
}

function App() {
  const [me, setMe] = useState(null);
  const [reason, setReason] = useState('');
  const [parts, setParts] = useState(route());
  useEffect(() => {
    const changed = () => setParts(route());
    window.addEventListener('hashchange', changed);
    if (loggedIn()) {
      get('/api/whoami').then(setMe, (e) => {
        forget();
        setReason(e instanceof ApiError ? e.message : String(e));
      });
    }
    return () => window.removeEventListener('hashchange', changed);
  }, []);
  if (!me) {
    return loggedIn() ? html`<p class="loading">Loading...</p>` :
      html`<${Login} onLogin=${setMe} reason=${reason} />`;
  }
  const logout = () => { forget(); setReason(''); setMe(null); };
  const [first, ...rest] = parts;
  let content;
  if (first === 'queues' && rest.length >= 2) {
    content = html`<${QueuePage} vhost=${rest[0]} name=${rest.slice(1).join('/')} />`;
  } else if (first === 'delayed' && rest.length >= 2) {
    content = html`<${DelayedPage} vhost=${rest[0]} name=${rest.slice(1).join('/')} />`;
  } else {
    const page = PAGES.find(([path]) => path === (first || '')) || PAGES[0];
    const Page = page[2];
    content = html`<${Page} me=${me} />`;
  }
  return html`<div class="shell">
    <header><span class="brand">Leveret</span>
      <nav>${PAGES.map(([path, label]) => html`<a href=${`#/${path}`}
        class=${(first || '') === path ? 'current' : ''}>${label}</a>`)}</nav>
      <span class="me">${me.name} (${[].concat(me.tags).join(', ')})
        <button onClick=${logout}>Log out</button></span></header>
    <main>${content}</main></div>`;
}

render(html`<${App} />`, document.getElementById('app'));
