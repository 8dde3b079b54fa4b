// The management API as the UI calls it: basic credentials from this tab's sessionStorage,
// the X-Requested-With header (the server then answers 401 without the browser's own login
// dialog), JSON bodies, and errors turned into plain sentences. Nothing else talks to /api.

const KEY = 'leveret.credentials';

export const enc = encodeURIComponent;

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function loggedIn() {
  return sessionStorage.getItem(KEY) !== null;
}

export function remember(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  let binary = '';
  for (const b of bytes) binary += String.fromCharCode(b);
  sessionStorage.setItem(KEY, btoa(binary));
}

export function forget() {
  sessionStorage.removeItem(KEY);
}

const WORDS = {
  400: 'The broker refused the request',
  401: 'Not allowed',
  403: 'Refused',
  404: 'Not found',
  405: 'Not possible here',
  415: 'Refused',
  500: 'The broker failed to answer',
  503: 'The cluster cannot take changes now',
};

function explain(status, data, text) {
  const reason = (data && (data.reason || data.error)) || text.trim() || `HTTP ${status}`;
  const lead = WORDS[status] || `The broker answered ${status}`;
  let detail = typeof reason === 'string' ? reason : JSON.stringify(reason);
  // a bare error code (vhost_or_user_not_found) reads as words
  if (/^[a-z]+(_[a-z]+)+$/.test(detail)) detail = detail.replace(/_/g, ' ');
  return `${lead}: ${detail}`;
}

export async function api(method, path, body) {
  const headers = {'X-Requested-With': 'leveret-ui', Accept: 'application/json'};
  const token = sessionStorage.getItem(KEY);
  if (token !== null) headers.Authorization = `Basic ${token}`;
  const init = {method, headers, credentials: 'omit', cache: 'no-store'};
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new ApiError(0, `The broker cannot be reached (${error.message}).`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (_) {
    data = null;
  }
  if (!response.ok) throw new ApiError(response.status, explain(response.status, data, text));
  return data;
}

export const get = (path) => api('GET', path);
export const put = (path, body) => api('PUT', path, body ?? {});
export const post = (path, body) => api('POST', path, body ?? {});
export const del = (path) => api('DELETE', path);
