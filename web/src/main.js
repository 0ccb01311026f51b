// Postern's browser UI: log in, list the nodes this user may reach, open a
// terminal. The session token lives in sessionStorage (gone when the tab
// closes) and travels only in the Authorization header and as the first
// websocket message, never in a URL. The session cookie is HttpOnly: this
// script never sees it.
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = 'postern.token';
const USER_KEY = 'postern.user';
const SUBPROTOCOL = 'postern.v1';
const PING_INTERVAL_MS = 5000;

let token = sessionStorage.getItem(TOKEN_KEY);
let nodes = [];
let term = null; // the open terminal: {xterm, fit, ws, observer, pinger}

// ---- API -----------------------------------------------------------------

class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = { 'Accept': 'application/json' };
  if (token) headers['Authorization'] = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const resp = await fetch(path, {
    method, headers, credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (resp.status === 204) return null;
  let data = null;
  try { data = await resp.json(); } catch { /* empty body */ }
  if (!resp.ok) {
    let msg = (data && data.error) || `${resp.status} ${resp.statusText}`;
    const retry = resp.headers.get('Retry-After');
    if (resp.status === 429 && retry) msg += ` (retry in ${retry}s)`;
    throw new APIError(resp.status, msg);
  }
  return data;
}

// ---- views ---------------------------------------------------------------

function show(view) {
  for (const v of ['login', 'nodes', 'terminal']) $(`view-${v}`).hidden = v !== view;
  const user = sessionStorage.getItem(USER_KEY);
  $('logout').hidden = view === 'login';
  $('whoami').textContent = view === 'login' || !user ? '' : user;
  document.body.dataset.view = view;
}

function forgetSession() {
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(USER_KEY);
}

async function showLogin(message) {
  closeTerminal();
  forgetSession();
  show('login');
  $('login-error').textContent = message || '';
  try {
    const ping = await api('GET', '/webapi/ping');
    $('otp-row').hidden = ping.second_factor !== 'otp';
  } catch { /* the form still works */ }
  $('login-user').focus();
}

$('login-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  $('login-error').textContent = '';
  $('login-submit').disabled = true;
  try {
    const resp = await api('POST', '/webapi/sessions', {
      user: $('login-user').value,
      password: $('login-password').value,
      otp_token: $('login-otp').value,
    });
    token = resp.token;
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(USER_KEY, resp.user);
    $('login-password').value = '';
    $('login-otp').value = '';
    await showNodes();
  } catch (err) {
    $('login-error').textContent = err.message;
  } finally {
    $('login-submit').disabled = false;
  }
});

$('logout').addEventListener('click', async () => {
  try { await api('DELETE', '/webapi/sessions'); } catch { /* already gone */ }
  await showLogin('Logged out.');
});

// ---- node list -----------------------------------------------------------

async function showNodes() {
  closeTerminal();
  show('nodes');
  $('nodes-error').textContent = '';
  try {
    nodes = (await api('GET', '/webapi/nodes')).items || [];
  } catch (err) {
    if (err.status === 401) return showLogin('Your session ended; log in again.');
    $('nodes-error').textContent = err.message;
    nodes = [];
  }
  renderNodes();
  $('node-search').focus();
}

function labelText(labels) {
  return Object.entries(labels || {}).sort().map(([k, v]) => `${k}=${v}`);
}

function matches(node, query) {
  if (!query) return true;
  const hay = [node.hostname, node.uuid, node.addr, ...labelText(node.labels)].join(' ').toLowerCase();
  return query.toLowerCase().split(/\s+/).filter(Boolean).every((w) => hay.includes(w));
}

function renderNodes() {
  const query = $('node-search').value.trim();
  const body = document.querySelector('#nodes tbody');
  body.replaceChildren();
  const shown = nodes.filter((n) => matches(n, query));
  for (const n of shown) {
    const tr = document.createElement('tr');
    tr.dataset.hostname = n.hostname;
    const cell = (text, cls) => {
      const td = document.createElement('td');
      td.textContent = text;
      if (cls) td.className = cls;
      tr.append(td);
      return td;
    };
    cell(n.hostname, 'hostname');
    cell(n.addr);
    const labels = cell('');
    for (const l of labelText(n.labels)) {
      const span = document.createElement('span');
      span.className = 'label';
      span.textContent = l;
      labels.append(span);
    }
    cell(n.uuid, 'uuid');
    const loginCell = cell('');
    const select = document.createElement('select');
    select.className = 'login';
    for (const l of n.logins) select.append(new Option(l, l));
    loginCell.append(select);
    const btnCell = cell('');
    const btn = document.createElement('button');
    btn.type = 'button';
    btn.className = 'connect';
    btn.textContent = 'Connect';
    // The UUID is the unambiguous target (routing rule 1).
    btn.addEventListener('click', () => openTerminal(n, select.value));
    btnCell.append(btn);
    body.append(tr);
  }
  $('nodes-empty').hidden = shown.length > 0;
}

$('node-search').addEventListener('input', renderNodes);

// ---- terminal ------------------------------------------------------------

const enc = new TextEncoder();
const dec = new TextDecoder();

function frame(type, payload) {
  const body = typeof payload === 'string' ? enc.encode(payload) : payload;
  const out = new Uint8Array(1 + body.length);
  out[0] = type.charCodeAt(0);
  out.set(body, 1);
  return out;
}

function setStatus(status, text) {
  const el = $('term-status');
  el.dataset.status = status;
  el.textContent = text || status;
}

function showTermError(text) {
  const el = $('term-error');
  el.textContent = text;
  el.hidden = !text;
}

function openTerminal(node, login) {
  closeTerminal();
  show('terminal');
  showTermError('');
  $('term-latency').textContent = '';
  $('term-title').textContent = `${login}@${node.hostname}`;
  setStatus('connecting', 'connecting…');

  const xterm = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, fontFamily: 'monospace' });
  const fit = new FitAddon();
  xterm.loadAddon(fit);
  const container = $('terminal');
  container.replaceChildren();
  xterm.open(container);
  fit.fit();

  const params = { host: node.uuid, login, cols: xterm.cols, rows: xterm.rows, cluster: node.cluster || '' };
  const url = `wss://${location.host}/webapi/terminal?params=${encodeURIComponent(JSON.stringify(params))}`;
  const ws = new WebSocket(url, SUBPROTOCOL);
  ws.binaryType = 'arraybuffer';
  const t = { xterm, fit, ws, observer: null, pinger: null, ready: false };
  term = t;
  window.posternTerminal = xterm; // for e2e tests and debugging

  const send = (type, payload) => { if (t.ready && ws.readyState === WebSocket.OPEN) ws.send(frame(type, payload)); };

  ws.addEventListener('open', () => ws.send(JSON.stringify({ token })));
  ws.addEventListener('message', (ev) => {
    if (typeof ev.data === 'string') {
      const msg = JSON.parse(ev.data);
      if (msg.status === 'ok') {
        t.ready = true;
        setStatus('connected', 'connected');
        // The size may have changed while the socket opened.
        send('w', JSON.stringify({ cols: xterm.cols, rows: xterm.rows }));
        t.pinger = setInterval(() => send('p', String(performance.now())), PING_INTERVAL_MS);
        xterm.focus();
      }
      return;
    }
    const data = new Uint8Array(ev.data);
    if (data.length === 0) return;
    const type = String.fromCharCode(data[0]);
    const payload = data.subarray(1);
    switch (type) {
      case 'r': xterm.write(payload); break;
      case 'e': showTermError(dec.decode(payload)); break;
      case 'c': {
        try {
          const c = JSON.parse(dec.decode(payload));
          t.closeReason = c.code >= 0 ? `${c.reason} (exit status ${c.code})` : c.reason;
        } catch { /* keep the websocket reason */ }
        break;
      }
      case 'p': ws.send(frame('P', payload)); break;
      case 'P': {
        const rtt = performance.now() - Number(dec.decode(payload));
        if (Number.isFinite(rtt)) $('term-latency').textContent = `${rtt.toFixed(1)} ms`;
        break;
      }
      default: break; // unknown types are ignored
    }
  });
  ws.addEventListener('close', (ev) => {
    clearInterval(t.pinger);
    if (term !== t) return;
    const reason = t.closeReason || ev.reason || `connection closed (code ${ev.code})`;
    setStatus('disconnected', `disconnected: ${reason}`);
    xterm.options.disableStdin = true;
  });

  xterm.onData((d) => send('r', d));
  xterm.onBinary((d) => send('r', Uint8Array.from(d, (c) => c.charCodeAt(0))));
  xterm.onResize(({ cols, rows }) => send('w', JSON.stringify({ cols, rows })));
  // Follow the window: refit whenever the container changes size.
  t.observer = new ResizeObserver(() => { try { fit.fit(); } catch { /* hidden */ } });
  t.observer.observe(container);
}

function closeTerminal() {
  const t = term;
  if (!t) return;
  term = null;
  clearInterval(t.pinger);
  if (t.observer) t.observer.disconnect();
  if (t.ws.readyState <= WebSocket.OPEN) {
    try { t.ws.send(frame('c', JSON.stringify({ code: 0, reason: 'closed by the user' }))); } catch { /* closing */ }
    t.ws.close(1000, 'closed by the user');
  }
  t.xterm.dispose();
  window.posternTerminal = null;
}

$('term-back').addEventListener('click', () => showNodes());
$('term-disconnect').addEventListener('click', () => {
  if (term && term.ws.readyState <= WebSocket.OPEN) {
    term.ws.send(frame('c', JSON.stringify({ code: 0, reason: 'closed by the user' })));
  }
});

// ---- start ---------------------------------------------------------------

if (token) showNodes(); else showLogin();
