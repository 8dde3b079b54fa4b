// Users, virtual hosts, permissions, policies and definitions (export and import).

import {del, enc, get, post, put} from './api.js';
import {Confirm, Err, html, jsonText, PagedList, useState, useSubmit,
  VhostSelect} from './lib.js';

function Field({label, name, value, set, type = 'text', placeholder = ''}) {
  return html`<label>${label} <input name=${name} type=${type} value=${value}
    placeholder=${placeholder} onInput=${(e) => set(e.target.value)} /></label>`;
}

export function Users() {
  const [name, setName] = useState('');
  const [password, setPassword] = useState('');
  const [tags, setTags] = useState('management');
  const [submit, status] = useSubmit(
    () => put(`/api/users/${enc(name)}`, {password, tags}), () => `User ${name} saved.`);
  return html`<div class="page"><h1>Users</h1>
    <${PagedList} path="/api/users" testid="users" columns=${['Name', 'Tags', '']}
      row=${(u) => html`<tr><td>${u.name}</td><td>${[].concat(u.tags).join(', ')}</td>
        <td><${Confirm} label="Delete" question=${`Delete user ${u.name}?`}
          action=${() => del(`/api/users/${enc(u.name)}`)} /></td></tr>`} />
    <form class="inline" onSubmit=${submit} aria-label="add user"><h2>Add or update a user</h2>
      <${Field} label="Name" name="name" value=${name} set=${setName} />
      <${Field} label="Password" name="password" type="password" value=${password}
        set=${setPassword} />
      <${Field} label="Tags" name="tags" value=${tags} set=${setTags}
        placeholder="administrator,management" />
      <button type="submit">Save</button>${status}</form></div>`;
}

export function Vhosts() {
  const [name, setName] = useState('');
  const [queueType, setQueueType] = useState('');  // '': the server's default_queue_type
  const [submit, status] = useSubmit(() => put(`/api/vhosts/${enc(name)}`,
    queueType ? {default_queue_type: queueType} : {}), () => `Virtual host ${name} saved.`);
  return html`<div class="page"><h1>Virtual hosts</h1>
    <${PagedList} path="/api/vhosts" testid="vhosts"
      columns=${['Name', 'Messages', 'Description', 'Default queue type', '']}
      row=${(v) => html`<tr><td>${v.name}</td><td>${v.messages ?? ''}</td>
        <td>${v.description || ''}</td><td>${v.default_queue_type || ''}</td>
        <td><${Confirm} label="Delete" question=${`Delete virtual host ${v.name} and
          everything in it?`} action=${() => del(`/api/vhosts/${enc(v.name)}`)} /></td>
      </tr>`} />
    <form class="inline" onSubmit=${submit} aria-label="add vhost"><h2>Add or update a
      virtual host</h2>
      <${Field} label="Name" name="name" value=${name} set=${setName} />
      <label>Default queue type <select name="default_queue_type" value=${queueType}
        onChange=${(e) => setQueueType(e.target.value)}>
        <option value="">the server's</option>${['classic', 'quorum', 'stream'].map(
          (t) => html`<option value=${t}>${t}</option>`)}</select></label>
      <button type="submit">Save</button>${status}</form></div>`;
}

export function Permissions() {
  const [vhost, setVhost] = useState('/');
  const [user, setUser] = useState('');
  const [configure, setConfigure] = useState('.*');
  const [write, setWrite] = useState('.*');
  const [read, setRead] = useState('.*');
  const [submit, status] = useSubmit(
    () => put(`/api/permissions/${enc(vhost)}/${enc(user)}`, {configure, write, read}),
    () => `Permissions of ${user} on ${vhost} set.`);
  return html`<div class="page"><h1>Permissions</h1>
    <${PagedList} path="/api/permissions" testid="permissions" filter=${false}
      columns=${['User', 'Virtual host', 'Configure', 'Write', 'Read', '']}
      row=${(p) => html`<tr><td>${p.user}</td><td>${p.vhost}</td><td>${p.configure}</td>
        <td>${p.write}</td><td>${p.read}</td>
        <td><${Confirm} label="Clear" question=${`Clear ${p.user}'s permissions?`}
          action=${() => del(`/api/permissions/${enc(p.vhost)}/${enc(p.user)}`)} /></td>
      </tr>`} />
    <form class="inline" onSubmit=${submit} aria-label="set permission">
      <h2>Set permissions</h2>
      <label>Virtual host <${VhostSelect} value=${vhost} onChange=${setVhost} /></label>
      <${Field} label="User" name="user" value=${user} set=${setUser} />
      <${Field} label="Configure" name="configure" value=${configure} set=${setConfigure} />
      <${Field} label="Write" name="write" value=${write} set=${setWrite} />
      <${Field} label="Read" name="read" value=${read} set=${setRead} />
      <button type="submit">Set</button>${status}</form></div>`;
}

export function Policies() {
  const [vhost, setVhost] = useState('/');
  const [name, setName] = useState('');
  const [pattern, setPattern] = useState('');
  const [applyTo, setApplyTo] = useState('queues');
  const [definition, setDefinition] = useState('{"max-length-bytes": 1000000000}');
  const [priority, setPriority] = useState('0');
  const [submit, status] = useSubmit(async () => {
    let parsed;
    try {
      parsed = JSON.parse(definition);
    } catch (e) {
      throw new Error(`The definition is not valid JSON: ${e.message}`);
    }
    return put(`/api/policies/${enc(vhost)}/${enc(name)}`, {pattern, 'apply-to': applyTo,
      definition: parsed, priority: Number(priority)});
  }, () => `Policy ${name} saved.`);
  return html`<div class="page"><h1>Policies</h1>
    <${PagedList} path="/api/policies" testid="policies"
      columns=${['Name', 'Virtual host', 'Pattern', 'Apply to', 'Definition', 'Priority', '']}
      row=${(p) => html`<tr><td>${p.name}</td><td>${p.vhost}</td><td>${p.pattern}</td>
        <td>${p['apply-to']}</td><td class="args">${jsonText(p.definition)}</td>
        <td>${p.priority}</td>
        <td><${Confirm} label="Delete" question=${`Delete policy ${p.name}?`}
          action=${() => del(`/api/policies/${enc(p.vhost)}/${enc(p.name)}`)} /></td></tr>`} />
    <form class="inline" onSubmit=${submit} aria-label="add policy"><h2>Add or update
      a policy</h2>
      <label>Virtual host <${VhostSelect} value=${vhost} onChange=${setVhost} /></label>
      <${Field} label="Name" name="name" value=${name} set=${setName} />
      <${Field} label="Pattern" name="pattern" value=${pattern} set=${setPattern}
        placeholder="^events\\." />
      <label>Apply to <select name="apply-to" value=${applyTo}
        onChange=${(e) => setApplyTo(e.target.value)}>${['queues', 'exchanges', 'all'].map(
          (a) => html`<option value=${a}>${a}</option>`)}</select></label>
      <${Field} label="Definition (JSON)" name="definition" value=${definition}
        set=${setDefinition} />
      <${Field} label="Priority" name="priority" type="number" value=${priority}
        set=${setPriority} />
      <button type="submit">Save</button>${status}</form></div>`;
}

export function Definitions() {
  const [exported, setExported] = useState(null);
  const [error, setError] = useState(null);
  const [text, setText] = useState('');
  const doExport = async () => {
    setError(null);
    try {
      const defs = await get('/api/definitions');
      const json = JSON.stringify(defs, null, 2);
      const url = URL.createObjectURL(new Blob([json], {type: 'application/json'}));
      setExported({json, url});
    } catch (e) {
      setError(e);
    }
  };
  const readFile = (event) => {
    const file = event.target.files[0];
    if (file) file.text().then(setText);
  };
  const [submit, status] = useSubmit(async () => {
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch (e) {
      throw new Error(`The definitions are not valid JSON: ${e.message}`);
    }
    return post('/api/definitions', parsed);
  }, 'Definitions imported.');
  return html`<div class="page"><h1>Definitions</h1>
    <section><h2>Export</h2><button onClick=${doExport}>Export definitions</button>
      <${Err} error=${error} />
      ${exported && html`<p><a href=${exported.url} download="leveret-definitions.json"
        data-testid="download">Download leveret-definitions.json</a></p>
        <pre class="payload" data-testid="exported">${exported.json}</pre>`}</section>
    <form onSubmit=${submit} aria-label="import definitions"><h2>Import</h2>
      <p>RabbitMQ's JSON format; objects that exist are updated.</p>
      <input type="file" accept="application/json,.json" onChange=${readFile} />
      <textarea name="definitions" rows="10" value=${text}
        onInput=${(e) => setText(e.target.value)}></textarea>
      <button type="submit">Import</button>${status}</form></div>`;
}
