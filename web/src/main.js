// Postern's browser UI: log in, list the nodes this user may reach, open a
// terminal at its own URL (/web/cluster/C/node/UUID/LOGIN) that survives a
// reload or a network blip by resuming the same shell (lib/api/webterm's
// package doc is the protocol). The session token lives in sessionStorage
// (gone when the tab closes) and travels only in the Authorization header
// and as the first websocket message, never in a URL; a new tab gets it
// from POST /webapi/sessions/token (adoptBrowserSession). The session
// cookies are HttpOnly: this script never sees them.
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { SerializeAddon } from '@xterm/addon-serialize';
import { WebglAddon } from '@xterm/addon-webgl';
import { create as createPlayer } from 'asciinema-player';
import * as passkeys from './passkeys.js';
import * as requests from './requests.js';
import * as sessions from './sessions.js';

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = 'postern.token';
const USER_KEY = 'postern.user';
// Set while the session can only register a second factor (the user has
// none while the cluster requires one): only the Account page works.
const REGISTER_ONLY_KEY = 'postern.registerOnly';
const SUBPROTOCOL = 'postern.v1';
const PING_INTERVAL_MS = 5000;
// A socket whose pongs stopped for this long is given up and resumed: a
// network blip can leave a websocket open but dead.
const PONG_TIMEOUT_MS = 12000;
// Keystrokes kept for a resend after a resume, and queued while offline;
// either is sent as one frame, which must stay under the server's 64 KiB.
const INPUT_KEEP = 32 << 10;
const TERM_KEY = 'postern.term:';
// The cluster picked on the nodes view ('' or absent: the proxy's own).
const CLUSTER_KEY = 'postern.cluster';

let token = sessionStorage.getItem(TOKEN_KEY);
let nodes = [];
// clusters: GET /webapi/clusters, the proxy's own first, then the leaves
// this user may reach. nodesSeq drops a node list that arrives after the
// user already picked another cluster.
let clusters = [];
let nodesSeq = 0;
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

let playerGen = 0; // counts player openings: an older openPlayer's awaits stop

function show(view) {
  if (view !== 'player') { playerGen++; closePlayer(); }
  if (view !== 'join') sessions.close();
  for (const v of ['login', 'nodes', 'terminal', 'sessions', 'join', 'recordings', 'player', 'account', 'requests', 'cli', 'notfound']) $(`view-${v}`).hidden = v !== view;
  const user = sessionStorage.getItem(USER_KEY);
  const limited = view === 'login' || registerOnly();
  $('logout').hidden = view === 'login';
  $('nav-nodes').hidden = limited;
  $('nav-sessions').hidden = limited;
  $('nav-recordings').hidden = limited;
  $('nav-account').hidden = limited;
  requests.setNavHidden(limited);
  $('whoami').textContent = view === 'login' || !user ? '' : user;
  document.body.dataset.view = view;
}

function registerOnly() { return sessionStorage.getItem(REGISTER_ONLY_KEY) === '1'; }

function keepSession(resp) {
  token = resp.token;
  sessionStorage.setItem(TOKEN_KEY, token);
  sessionStorage.setItem(USER_KEY, resp.user);
  if (resp.register_only) sessionStorage.setItem(REGISTER_ONLY_KEY, '1'); else sessionStorage.removeItem(REGISTER_ONLY_KEY);
}

function forgetSession() {
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(USER_KEY);
  sessionStorage.removeItem(REGISTER_ONLY_KEY);
}

// showLogin shows the login form; message is an error (red), notice a
// plain word (logged out, where the login leads).
async function showLogin(message, notice) {
  closeTerminal(true);
  forgetSession();
  show('login');
  $('login-error').textContent = message || '';
  $('login-notice').textContent = notice || '';
  $('login-notice').hidden = !notice;
  try {
    const ping = await api('GET', '/webapi/ping');
    $('otp-row').hidden = ping.second_factor !== 'otp' && ping.second_factor !== 'on';
    const keys = passkeys.supported() && (ping.second_factor === 'webauthn' || ping.second_factor === 'on');
    $('login-passkey').hidden = !keys;
    $('login-passwordless').hidden = !keys;
    showSSOButtons(ping.connectors || []);
  } catch { /* the form still works */ }
  $('login-user').focus();
}

// showSSOButtons puts one "Sign in with ..." link per single sign-on
// connector under the form. A plain link, not a fetch: the browser must
// follow the proxy's redirect to the identity provider itself. It carries
// the page the user was going to (a terminal's deep link), where the
// proxy sends the browser back once logged in; the app then adopts the
// new session from its cookie (adoptBrowserSession), as a new tab does.
function showSSOButtons(connectors) {
  const box = $('sso-buttons');
  box.replaceChildren();
  const here = location.pathname + location.search;
  const returnTo = loginLeadsTo(location.pathname) ? here : '/';
  for (const c of connectors) {
    const a = document.createElement('a');
    a.className = 'button sso-button';
    a.href = `/webapi/oidc/login/web?${new URLSearchParams({ connector: c.name, return_to: returnTo })}`;
    a.textContent = `Sign in with ${c.display || c.name}`;
    a.dataset.connector = c.name;
    box.append(a);
  }
  $('sso').hidden = connectors.length === 0;
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
    await loggedIn(resp);
  } catch (err) {
    $('login-error').textContent = err.message;
  } finally {
    $('login-submit').disabled = false;
  }
});

// loggedIn keeps a new session (from any way of logging in) and routes.
async function loggedIn(resp) {
  keepSession(resp);
  $('login-password').value = '';
  $('login-otp').value = '';
  await route();
}

// passkeyLogin runs a passkey ceremony from the login form.
async function passkeyLogin(begin) {
  $('login-error').textContent = '';
  try {
    await loggedIn(await passkeys.login(api, begin));
  } catch (err) {
    $('login-error').textContent = err.message;
  }
}

$('login-passkey').addEventListener('click', () => {
  if (!$('login-form').reportValidity()) return;
  passkeyLogin({ user: $('login-user').value, password: $('login-password').value });
});
$('login-passwordless').addEventListener('click', () => passkeyLogin({ passwordless: true }));

// ---- account -------------------------------------------------------------

async function showAccount() {
  closeTerminal();
  if (location.pathname !== '/web/account') history.pushState(null, '', '/web/account');
  show('account');
  $('account-error').textContent = '';
  $('account-notice').hidden = !registerOnly();
  await loadDevices();
}

async function loadDevices() {
  try {
    const devices = await api('GET', '/webapi/mfa/devices');
    passkeys.renderDevices(api, document.querySelector('#devices tbody'), devices,
      (msg) => { $('account-error').textContent = msg; }, loadDevices);
    $('devices-empty').hidden = devices.length > 0;
  } catch (err) {
    if (err.status === 401) return showLogin('Your session has ended; log in again.');
    $('account-error').textContent = err.message;
  }
}

$('passkey-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  $('account-error').textContent = '';
  $('passkey-add').disabled = true;
  try {
    const dev = await passkeys.register(api, $('passkey-name').value);
    $('passkey-name').value = '';
    if (dev && dev.relogin) {
      // The register-only session ended with the registration: the next
      // login presents the new passkey.
      history.pushState(null, '', '/');
      await showLogin('', 'Passkey registered: log in with your password and the passkey.');
      return;
    }
    await loadDevices();
  } catch (err) {
    $('account-error').textContent = err.message;
  } finally {
    $('passkey-add').disabled = false;
  }
});

$('nav-account').addEventListener('click', () => navigate('/web/account'));

$('logout').addEventListener('click', async () => {
  try { await api('DELETE', '/webapi/sessions'); } catch { /* already gone */ }
  for (const k of Object.keys(sessionStorage)) if (k.startsWith(TERM_KEY)) sessionStorage.removeItem(k);
  history.pushState(null, '', '/');
  await showLogin('', 'Logged out.');
});

// ---- psh login (psh login --auth web) ------------------------------------

const CLI_LOGIN_PATH = '/web/cli-login';

function showCLILogin() {
  closeTerminal();
  show('cli');
  $('cli-user').textContent = sessionStorage.getItem(USER_KEY) || '';
  // psh ssh's confirmation of one session (require_session_mfa): the
  // page names the node and login psh asked for.
  const q = new URLSearchParams(location.search);
  const session = q.has('node');
  $('cli-login-text').hidden = session;
  $('cli-session-text').hidden = !session;
  $('cli-node').textContent = q.get('node') || '';
  $('cli-login').textContent = q.get('login') || '';
  $('cli-error').textContent = '';
  $('cli-approve').disabled = false;
  $('cli-approve').focus();
}

$('cli-approve').addEventListener('click', async () => {
  $('cli-error').textContent = '';
  $('cli-approve').disabled = true;
  const id = new URLSearchParams(location.search).get('id') || '';
  try {
    const body = { id };
    if (new URLSearchParams(location.search).has('node')) {
      // The passkey is this session's fresh factor.
      const ch = await api('POST', '/webapi/login/console/challenge', {});
      Object.assign(body, await passkeys.answer(ch));
    }
    const r = await api('POST', '/webapi/login/console/finish', body);
    // psh's own page on 127.0.0.1 takes the sealed result.
    location.assign(r.redirect_url);
  } catch (err) {
    $('cli-approve').disabled = false;
    if (err.status === 401 || (err.status === 403 && /log in again/.test(err.message))) {
      await showLogin(err.message, loginLeadsTo(CLI_LOGIN_PATH));
      return;
    }
    $('cli-error').textContent = err.message;
  }
});

// ---- node list -----------------------------------------------------------

// pickedCluster is the leaf picked on the nodes view, '' for the proxy's
// own cluster.
function pickedCluster() { return sessionStorage.getItem(CLUSTER_KEY) || ''; }

function nodesPath(cluster) {
  return cluster ? `/webapi/nodes?cluster=${encodeURIComponent(cluster)}` : '/webapi/nodes';
}

async function showNodes() {
  closeTerminal();
  if (location.pathname !== '/') history.pushState(null, '', '/');
  show('nodes');
  $('nodes-error').textContent = '';
  try {
    clusters = (await api('GET', '/webapi/clusters')).items || [];
  } catch (err) {
    if (err.status === 401) return showLogin('Your session ended; log in again.');
    // A proxy without leaf clusters support: only its own cluster.
    clusters = [];
  }
  renderClusterPicker();
  await loadNodes();
  $('node-search').focus();
}

// renderClusterPicker fills the picker; it stays hidden while the user
// may reach no leaf (the proxy's own cluster is the only choice). A
// picked leaf that is no longer listed falls back to the proxy's own.
function renderClusterPicker() {
  const leaves = clusters.filter((c) => !c.local);
  const select = $('cluster-select');
  select.replaceChildren();
  for (const c of clusters) {
    const label = c.status === 'offline' ? `${c.name} (offline)` : c.name;
    const opt = new Option(label, c.local ? '' : c.name);
    opt.dataset.status = c.status || '';
    select.append(opt);
  }
  let picked = pickedCluster();
  if (picked && !leaves.some((c) => c.name === picked)) {
    picked = '';
    sessionStorage.removeItem(CLUSTER_KEY);
  }
  select.value = picked;
  $('cluster-picker').hidden = leaves.length === 0;
  document.body.dataset.cluster = picked || clusterName;
}

async function loadNodes() {
  const seq = ++nodesSeq;
  const cluster = pickedCluster();
  let items = [];
  let error = '';
  try {
    items = (await api('GET', nodesPath(cluster))).items || [];
  } catch (err) {
    if (err.status === 401) return showLogin('Your session ended; log in again.');
    error = err.message;
  }
  if (seq !== nodesSeq) return;
  nodes = items;
  $('nodes-error').textContent = error;
  renderNodes();
}

$('cluster-select').addEventListener('change', () => {
  const v = $('cluster-select').value;
  if (v) sessionStorage.setItem(CLUSTER_KEY, v); else sessionStorage.removeItem(CLUSTER_KEY);
  document.body.dataset.cluster = v || clusterName;
  nodes = [];
  renderNodes();
  loadNodes();
});

function labelText(labels) {
  return Object.entries(labels || {}).sort().map(([k, v]) => `${k}=${v}`);
}

function matches(node, query) {
  if (!query) return true;
  const hay = [node.hostname, node.uuid, node.addr, node.tunnel ? 'tunnel' : '', node.kind || 'postern', node.status || '', ...labelText(node.labels)].join(' ').toLowerCase();
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
    // A node behind NAT has no address: the proxy reaches it over its
    // reverse tunnel, and the column says so instead of staying blank.
    if (n.tunnel && !n.addr) {
      const td = cell('(tunnel)', 'addr tunnel');
      td.title = 'Behind NAT: reached over its reverse tunnel to the proxy';
    } else {
      cell(n.addr, 'addr');
    }
    const labels = cell('');
    for (const l of labelText(n.labels)) {
      const span = document.createElement('span');
      span.className = 'label';
      span.textContent = l;
      labels.append(span);
    }
    // An OpenSSH node (no Postern process on it) shows its health as
    // this proxy's checks find it: an offline one cannot be reached.
    const kind = cell(n.kind || 'postern', 'kind');
    tr.dataset.kind = n.kind || 'postern';
    if (n.status) {
      tr.dataset.status = n.status;
      const st = document.createElement('span');
      st.className = `status ${n.status}`;
      st.textContent = n.status;
      kind.append(' ', st);
    }
    cell(n.uuid, 'uuid');
    const loginCell = cell('');
    const select = document.createElement('select');
    select.className = 'login';
    for (const l of n.logins) select.append(new Option(l, l));
    loginCell.append(select);
    const btnCell = cell('');
    // A link to the terminal's own URL: the UUID is the unambiguous
    // target (routing rule 1); a middle click opens a second terminal.
    const link = document.createElement('a');
    link.className = 'connect button';
    link.textContent = 'Connect';
    const setHref = () => { link.href = terminalPath(n.cluster || pickedCluster() || clusterName, n.uuid, select.value); };
    setHref();
    select.addEventListener('change', setHref);
    link.addEventListener('click', (ev) => {
      if (ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;
      ev.preventDefault();
      navigate(link.getAttribute('href'));
    });
    btnCell.append(link);
    body.append(tr);
  }
  // An empty list says why: no node at all, or none matching the search.
  $('nodes-empty').textContent = nodes.length && query ? `No node you may reach matches "${query}".` : 'No nodes you may reach.';
  $('nodes-empty').hidden = shown.length > 0;
}

$('node-search').addEventListener('input', renderNodes);

// ---- routes --------------------------------------------------------------

let clusterName = '';

function terminalPath(cluster, uuid, login) {
  return `/web/cluster/${encodeURIComponent(cluster)}/node/${encodeURIComponent(uuid)}/${encodeURIComponent(login)}`;
}

function navigate(path) {
  history.pushState(null, '', path);
  route();
}

// route shows what the URL names; a deep link opened while logged out
// lands on the terminal after the login.
// loginLeadsTo says, on the login form, where a deep link goes once
// logged in, so a shared link does not look like a plain login page.
function loginLeadsTo(p) {
  const m = p.match(/^\/web\/cluster\/([^/]+)\/node\/([^/]+)\/([^/]+)\/?$/);
  if (m) {
    const [cluster, uuid, login] = m.slice(1).map(decodeURIComponent);
    return `Log in to open a terminal as ${login} on node ${uuid}${cluster && cluster !== clusterName ? ` in cluster ${cluster}` : ''}.`;
  }
  if (/^\/web\/recordings\/[0-9a-f-]{36}\/?$/.test(p)) return 'Log in to play the recording.';
  if (p === '/web/sessions') return 'Log in to see your active terminals.';
  if (p === CLI_LOGIN_PATH) return 'Log in to give psh (the command line) a certificate.';
  if (p === '/web/recordings') return 'Log in to see the recordings.';
  return '';
}

async function route() {
  const p = location.pathname;
  if (!token) return showLogin('', loginLeadsTo(p));
  // Nothing but the Account page until a second factor is registered.
  if (registerOnly()) return showAccount();
  if (p === CLI_LOGIN_PATH) return showCLILogin();
  const m = p.match(/^\/web\/cluster\/([^/]+)\/node\/([^/]+)\/([^/]+)\/?$/);
  if (m) {
    const [cluster, uuid, login] = m.slice(1).map(decodeURIComponent);
    return openTerminal({ cluster, uuid, login });
  }
  if (p === '/web/sessions') return showSessions();
  if (p === '/web/recordings') return showRecordings();
  if (p === '/web/account') return showAccount();
  const qm = p.match(/^\/web\/requests(?:\/([0-9a-f-]{36}))?\/?$/);
  if (qm) { closeTerminal(); return requests.showList(qm[1]); }
  const rm = p.match(/^\/web\/recordings\/([0-9a-f-]{36})\/?$/);
  if (rm) {
    const t = Number(new URLSearchParams(location.search).get('t'));
    return openPlayer(rm[1], Number.isFinite(t) && t > 0 ? t : undefined);
  }
  if (p === '/' || p === '/web' || p === '/web/') return showNodes();
  // The server answered 404 for this path too.
  closeTerminal();
  show('notfound');
  $('notfound-path').textContent = p;
}

$('notfound-home').addEventListener('click', (ev) => {
  if (ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;
  ev.preventDefault();
  navigate('/');
});

window.addEventListener('popstate', () => route());

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

function seqFrame(type, seq) {
  const out = new Uint8Array(9);
  out[0] = type.charCodeAt(0);
  new DataView(out.buffer).setBigUint64(1, BigInt(seq));
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

let noticeShown = 0;

// showNotice shows one line beside the terminal (never in it: that would
// corrupt a full-screen program); typing dismisses it after a while.
function showNotice(text) {
  const el = $('term-notice');
  el.textContent = text;
  el.hidden = !text;
  noticeShown = text ? performance.now() : 0;
}

function dismissNoticeOnTyping() {
  if (noticeShown && performance.now() - noticeShown > 5000) showNotice('');
}

// The font stack names monospace fonts with real descenders first; the
// line height leaves room under the baseline, where the default (1.0)
// clipped `_` in Chromium's DOM renderer.
const FONT_FAMILY = '"DejaVu Sans Mono", "Menlo", "Consolas", "Liberation Mono", "Noto Sans Mono", monospace';

function openTerminal(target) {
  closeTerminal();
  show('terminal');
  showTermError('');
  showNotice('');
  $('term-latency').textContent = '';
  const known = nodes.find((n) => n.uuid === target.uuid);
  $('term-title').textContent = `${target.login}@${known ? known.hostname : target.uuid}`;
  if (!known) {
    // A deep link opened directly: name the node once the list is in.
    // A leaf's list is asked for only when the leaf is one this user may
    // reach (the terminal itself reports an unknown cluster).
    const leaf = target.cluster === clusterName ? '' : target.cluster;
    const listed = leaf ? api('GET', '/webapi/clusters').then((r) => (r.items || []).some((c) => !c.local && c.name === leaf)) : Promise.resolve(true);
    listed.then((ok) => (ok ? api('GET', nodesPath(leaf)) : null)).then((r) => {
      const n = r && (r.items || []).find((x) => x.uuid === target.uuid);
      if (n && term && term.target === target) $('term-title').textContent = `${target.login}@${n.hostname}`;
    }).catch(() => {});
  }
  setStatus('connecting', 'connecting…');

  const xterm = new Terminal({
    cursorBlink: true, fontSize: 14, lineHeight: 1.2, scrollback: 5000,
    fontFamily: FONT_FAMILY, customGlyphs: true, rescaleOverlappingGlyphs: true,
  });
  const fit = new FitAddon();
  const serialize = new SerializeAddon();
  xterm.loadAddon(fit);
  xterm.loadAddon(serialize);
  const container = $('terminal');
  container.replaceChildren();
  xterm.open(container);
  // WebGL draws glyphs from a texture atlas sized to the cell, so nothing
  // is clipped by a CSS line box; without WebGL (no GPU, context lost)
  // xterm's DOM renderer stays, with the line height above.
  container.dataset.renderer = 'dom';
  // localStorage postern.renderer=dom keeps the DOM renderer (a GPU whose
  // WebGL output is blurry; the e2e test of both renderers).
  if (localStorage.getItem('postern.renderer') !== 'dom') try {
    const gl = new WebglAddon();
    gl.onContextLoss(() => { gl.dispose(); container.dataset.renderer = 'dom'; });
    xterm.loadAddon(gl);
    container.dataset.renderer = 'webgl';
  } catch { /* DOM fallback */ }
  fit.fit();

  const key = TERM_KEY + location.pathname;
  let stored = null;
  try { stored = JSON.parse(sessionStorage.getItem(key)); } catch { /* none */ }
  const t = {
    xterm, fit, serialize, target, key, ws: null, observer: null, pinger: null, ready: false,
    id: stored && stored.id, resume: stored && stored.resume,
    // received: output offset handed to xterm (it renders what it was
    // given, so this is what a resume acknowledges).
    received: 0,
    // Input: inputSent is the offset of the next byte sent; sent keeps the
    // last INPUT_KEEP bytes sent (from sentBase) for a resend after a
    // resume; queued holds keystrokes typed while no socket was open.
    inputSent: null, sent: [], sentBase: 0, queued: [], refused: 0,
    ended: false, grace: 0, detachedAt: 0, retry: 250, triedFresh: false, lastPong: 0,
    // replayEnd: output below this offset is a replay (Session.replay);
    // muted counts replay writes xterm has not parsed yet; dropped counts
    // the answer bytes not sent (for tests: posternTerminalDropped).
    replayEnd: 0, muted: 0, dropped: 0,
  };
  term = t;
  window.posternTerminal = xterm; // for e2e tests and debugging
  window.posternSerialize = () => serialize.serialize();
  window.posternTerminalDropped = () => t.dropped;
  connect(t);

  // Replayed output must never produce input: the queries in it (device
  // attributes, cursor position, colours) were answered when they were
  // live, and answered again the answers would reach the shell as typed
  // text ("1RR0;276;0c..."). While a replay is being parsed (t.muted > 0:
  // writes whose callback has not run) only the user's own input goes
  // out. xterm tells the two apart internally: coreService fires
  // onUserInput right before onData for keys, pastes and mouse reports,
  // never for a query's answer; without that hook (another xterm build)
  // everything during a replay is dropped, a few ms of typing at most.
  let userInput = false;
  const core = xterm._core && xterm._core.coreService;
  if (core && typeof core.onUserInput === 'function') {
    core.onUserInput(() => { userInput = true; });
    container.dataset.replayFilter = 'answers';
  } else {
    container.dataset.replayFilter = 'all';
  }
  xterm.onData((d) => {
    const user = userInput;
    userInput = false;
    if (t.muted > 0 && !user) { t.dropped += d.length; return; }
    sendInput(t, enc.encode(d));
  });
  xterm.onBinary((d) => sendInput(t, Uint8Array.from(d, (c) => c.charCodeAt(0))));
  xterm.onResize(({ cols, rows }) => send(t, 'w', JSON.stringify({ cols, rows })));
  // Follow the window: refit whenever the container changes size.
  t.observer = new ResizeObserver(() => { try { fit.fit(); } catch { /* hidden */ } });
  t.observer.observe(container);
}

// writeReplay hands xterm replayed output with its answers muted until
// xterm has parsed it (the write callback): writes are parsed in order, so
// live output written after it is answered again.
function writeReplay(t, data) {
  t.muted++;
  t.xterm.write(data, () => { t.muted--; });
}

function send(t, type, payload) {
  if (t.ready && t.ws && t.ws.readyState === WebSocket.OPEN) t.ws.send(frame(type, payload));
}

// rawSend sends keystrokes and logs them: if the socket is already
// closing they are not sent now, and the next resume sends them again.
function rawSend(t, bytes) {
  if (t.ws.readyState === WebSocket.OPEN) t.ws.send(frame('r', bytes));
  for (const b of bytes) t.sent.push(b);
  t.inputSent += bytes.length;
  if (t.sent.length > INPUT_KEEP) {
    const drop = t.sent.length - INPUT_KEEP;
    t.sent.splice(0, drop);
    t.sentBase += drop;
  }
}

// sendInput sends a keystroke now, or queues it while disconnected (it is
// delivered once after the resume), or refuses it visibly when the queue
// is full. Never twice: the server says which bytes it has (Session.input).
function sendInput(t, bytes) {
  if (t.ended) return;
  if (t.ready && t.ws && t.ws.readyState === WebSocket.OPEN && t.inputSent !== null) {
    dismissNoticeOnTyping();
    rawSend(t, bytes);
    return;
  }
  const queued = t.queued.reduce((n, b) => n + b.length, 0);
  if (queued + bytes.length > INPUT_KEEP) {
    t.refused += bytes.length;
    showNotice(`Offline: ${t.refused} bytes of typing were not sent.`);
    return;
  }
  t.queued.push(bytes);
  showNotice(`Offline: ${queued + bytes.length} bytes of typing will be sent on reconnect.`);
}

// onSession reconciles input after a (re)attach: bytes the server did not
// get are sent again, then what was queued.
function onSession(t, info) {
  // We hold the new resume token: the server may retire the one this
  // socket resumed with (until now the fallback if this socket is lost).
  send(t, 's', '');
  t.replayEnd = info.replay || 0;
  t.id = info.id;
  t.resume = info.resume;
  t.grace = info.grace_seconds || 0;
  if (t.resume) sessionStorage.setItem(t.key, JSON.stringify({ id: t.id, resume: t.resume }));
  if (t.inputSent === null) {
    // First attach of this page: the server's count is the start.
    t.inputSent = info.input;
    t.sentBase = info.input;
    t.sent = [];
  } else {
    const have = info.input;
    if (have < t.sentBase) showNotice(`${t.sentBase - have} bytes of typing were lost in the disconnect.`);
    const from = Math.max(have, t.sentBase) - t.sentBase;
    const again = Uint8Array.from(t.sent.slice(from));
    t.sent = t.sent.slice(0, from);
    t.inputSent = t.sentBase + from;
    if (again.length) rawSend(t, again);
  }
  // Queued keystrokes go as one frame, as if pasted.
  const queued = t.queued;
  t.queued = [];
  if (queued.length) {
    const all = new Uint8Array(queued.reduce((n, b) => n + b.length, 0));
    let off = 0;
    for (const b of queued) { all.set(b, off); off += b.length; }
    rawSend(t, all);
  }
  if (queued.length || t.refused) {
    if (!t.refused) showNotice('');
    t.refused = 0;
  }
}

// BARE_TERRITORY: the usual territory of a language the browser names
// without one, where it is not the language's own code upper-cased.
const BARE_TERRITORY = { en: 'US', ja: 'JP', zh: 'CN', ko: 'KR', uk: 'UA', cs: 'CZ', da: 'DK', el: 'GR', he: 'IL', sv: 'SE', nb: 'NO', sl: 'SI', et: 'EE', ar: 'EG', hi: 'IN', vi: 'VN', fa: 'IR' };

// browserLocale maps the browser's language (BCP 47: en-US, zh-Hans-CN,
// de) to a POSIX locale name (en_US.UTF-8), the shell's LANG. The node
// uses its own default when it does not have that locale; '' sends none.
function browserLocale() {
  for (const tag of navigator.languages && navigator.languages.length ? navigator.languages : [navigator.language]) {
    const parts = String(tag || '').split('-');
    const lang = (parts[0] || '').toLowerCase();
    if (!/^[a-z]{2,3}$/.test(lang)) continue;
    const region = parts.slice(1).find((p) => /^[A-Za-z]{2}$/.test(p));
    const terr = region ? region.toUpperCase() : (BARE_TERRITORY[lang] || lang.toUpperCase());
    return `${lang}_${terr}.UTF-8`;
  }
  return '';
}

// sessionMFA proves a passkey for a new terminal when a role that reaches
// the node asks for one per session (require_session_mfa); '' when the
// node needs none. A resume is the same session: never asked.
async function sessionMFA(t) {
  const { target } = t;
  const body = { node: target.uuid, login: target.login, cluster: target.cluster === clusterName ? '' : target.cluster };
  const b = await api('POST', '/webapi/mfa/session/begin', body);
  if (!b.required) return '';
  window.posternSessionMFAAsked = (window.posternSessionMFAAsked || 0) + 1;
  if (b.otp) {
    // No passkey on this account: its one-time code.
    setStatus('mfa', 'one-time code…');
    const otp = window.prompt('This node asks for a fresh second factor for this session. One-time code:');
    if (!otp) throw new Error('this node requires a fresh second factor for each session');
    return (await api('POST', '/webapi/mfa/session/finish', { ...body, otp })).mfa_token;
  }
  setStatus('mfa', 'confirm with your passkey…');
  const r = await passkeys.confirmSession(api, b, body);
  return r.mfa_token;
}

async function connect(t) {
  let mfaToken = '';
  if (!t.resume) {
    try {
      mfaToken = await sessionMFA(t);
    } catch (err) {
      if (term !== t) return;
      t.ended = true;
      showTermError(err.message);
      setStatus('disconnected', `disconnected: ${err.message}`);
      t.xterm.options.disableStdin = true;
      return;
    }
    if (term !== t) return;
  }
  const { target, xterm } = t;
  const cluster = target.cluster === clusterName ? '' : target.cluster;
  const params = { host: target.uuid, login: target.login, cols: xterm.cols, rows: xterm.rows, cluster };
  const lang = browserLocale();
  if (lang) params.lang = lang;
  const url = `wss://${location.host}/webapi/terminal?params=${encodeURIComponent(JSON.stringify(params))}`;
  const ws = new WebSocket(url, SUBPROTOCOL);
  ws.binaryType = 'arraybuffer';
  t.ws = ws;
  t.ready = false;
  let ackTimer = null;
  const ack = () => {
    ackTimer = null;
    if (t.ws === ws && ws.readyState === WebSocket.OPEN) ws.send(seqFrame('a', t.received));
  };

  ws.addEventListener('open', () => {
    const first = { token, ack: t.received };
    if (t.resume) first.resume = t.resume;
    if (mfaToken) first.mfa_token = mfaToken;
    ws.send(JSON.stringify(first));
  });
  ws.addEventListener('message', (ev) => {
    if (t.ws !== ws) return;
    if (typeof ev.data === 'string') {
      const msg = JSON.parse(ev.data);
      if (msg.status === 'ok') {
        t.ready = true;
        t.retry = 250;
        t.lastPong = performance.now();
        setStatus('connected', 'connected');
        // The size may have changed while the socket opened.
        send(t, 'w', JSON.stringify({ cols: xterm.cols, rows: xterm.rows }));
        t.pinger = setInterval(() => {
          if (performance.now() - t.lastPong > PONG_TIMEOUT_MS) { ws.close(4001, 'no pong'); return; }
          send(t, 'p', String(performance.now()));
        }, PING_INTERVAL_MS);
        xterm.focus();
      }
      return;
    }
    const data = new Uint8Array(ev.data);
    if (data.length === 0) return;
    const type = String.fromCharCode(data[0]);
    const payload = data.subarray(1);
    const view = new DataView(data.buffer, data.byteOffset + 1);
    switch (type) {
      case 's': onSession(t, JSON.parse(dec.decode(payload))); break;
      case 'r': {
        if (payload.length < 8) break;
        const seq = Number(view.getBigUint64(0));
        let body = payload.subarray(8);
        // Frames are contiguous; an overlap (never expected) is cut.
        if (seq < t.received) body = body.subarray(Math.min(body.length, t.received - seq));
        t.received = Math.max(t.received, seq + payload.length - 8);
        const start = t.received - body.length;
        if (start < t.replayEnd) {
          const cut = Math.min(body.length, t.replayEnd - start);
          writeReplay(t, body.subarray(0, cut));
          body = body.subarray(cut);
        }
        if (body.length) xterm.write(body);
        if (!ackTimer) ackTimer = setTimeout(ack, 100);
        break;
      }
      case 'R': {
        if (payload.length < 8) break;
        xterm.reset();
        writeReplay(t, payload.subarray(8));
        t.received = Number(view.getBigUint64(0));
        break;
      }
      case 'n': showNotice(dec.decode(payload)); break;
      case 'e': showTermError(dec.decode(payload)); break;
      case 'c': {
        t.ended = true;
        sessionStorage.removeItem(t.key);
        try {
          const c = JSON.parse(dec.decode(payload));
          t.closeReason = c.code >= 0 ? `${c.reason} (exit status ${c.code})` : c.reason;
        } catch { /* keep the websocket reason */ }
        break;
      }
      case 'p': if (ws.readyState === WebSocket.OPEN) ws.send(frame('P', payload)); break;
      case 'P': {
        t.lastPong = performance.now();
        const rtt = performance.now() - Number(dec.decode(payload));
        if (Number.isFinite(rtt)) $('term-latency').textContent = `${rtt.toFixed(1)} ms`;
        break;
      }
      default: break; // unknown types are ignored
    }
  });
  ws.addEventListener('close', (ev) => {
    clearInterval(t.pinger);
    if (term !== t || t.ws !== ws) return;
    t.ready = false;
    const refused = ev.code === 1008 && /resume refused/.test(ev.reason);
    if (refused && !t.triedFresh && t.received === 0) {
      // A stored token of a terminal that ended: open a new one.
      t.triedFresh = true;
      t.resume = null;
      sessionStorage.removeItem(t.key);
      connect(t);
      return;
    }
    if (!t.ended && t.resume && ev.code !== 1008) {
      if (!t.detachedAt) t.detachedAt = Date.now();
      if (Date.now() - t.detachedAt < t.grace * 1000) {
        setStatus('reconnecting', 'reconnecting…');
        setTimeout(() => { if (term === t) connect(t); }, t.retry);
        t.retry = Math.min(t.retry * 2, 2000);
        return;
      }
    }
    t.ended = true;
    const reason = t.closeReason || ev.reason || `connection closed (code ${ev.code})`;
    setStatus('disconnected', `disconnected: ${reason}`);
    xterm.options.disableStdin = true;
  });
  ws.addEventListener('open', () => { t.detachedAt = 0; }, { once: true });
}

// closeTerminal leaves the terminal view. Leaving for another view
// detaches (the shell waits for a resume from its link or the sessions
// list); end (logout, Disconnect) ends the shell.
function closeTerminal(end = false) {
  const t = term;
  if (!t) return;
  term = null;
  clearInterval(t.pinger);
  if (t.observer) t.observer.disconnect();
  if (t.ws && t.ws.readyState <= WebSocket.OPEN) {
    if ((end || !t.resume) && t.ws.readyState === WebSocket.OPEN) {
      try { t.ws.send(frame('c', JSON.stringify({ code: 0, reason: 'closed by the user' }))); } catch { /* closing */ }
    }
    t.ws.close(1000, end ? 'closed by the user' : 'detached');
  }
  if (end || !t.resume) sessionStorage.removeItem(t.key);
  t.xterm.dispose();
  window.posternTerminal = null;
  window.posternTerminalDropped = null;
  window.posternSerialize = null;
}

$('term-back').addEventListener('click', () => showNodes());
$('term-disconnect').addEventListener('click', () => {
  if (term && term.ws && term.ws.readyState === WebSocket.OPEN) {
    term.ws.send(frame('c', JSON.stringify({ code: 0, reason: 'closed by the user' })));
  }
});

// ---- active sessions -----------------------------------------------------

function fmtBytes(n) {
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KiB`;
  return `${n} B`;
}

async function showSessions() {
  closeTerminal();
  if (location.pathname !== '/web/sessions') history.pushState(null, '', '/web/sessions');
  show('sessions');
  $('sessions-error').textContent = '';
  let items = [];
  try {
    items = (await api('GET', '/webapi/terminals')).items || [];
  } catch (err) {
    if (err.status === 401) return showLogin('Your session ended; log in again.');
    $('sessions-error').textContent = err.message;
  }
  const body = document.querySelector('#sessions tbody');
  body.replaceChildren();
  for (const s of items) {
    const tr = document.createElement('tr');
    tr.dataset.id = s.id;
    const cell = (text, cls) => {
      const td = document.createElement('td');
      td.textContent = text;
      if (cls) td.className = cls;
      tr.append(td);
      return td;
    };
    cell(s.node_hostname || s.node, 'hostname');
    cell(s.login);
    cell(new Date(s.started).toLocaleString());
    cell(`${fmtBytes(s.bytes_out)} out, ${fmtBytes(s.bytes_in)} in`);
    cell(s.state, 'state');
    const actions = cell('');
    const resume = document.createElement('button');
    resume.type = 'button';
    resume.className = 'resume';
    resume.textContent = s.state === 'detached' ? 'Resume' : 'Take over';
    resume.addEventListener('click', async () => {
      try {
        const r = await api('POST', `/webapi/terminals/${encodeURIComponent(s.id)}/resume`);
        const path = terminalPath(s.cluster || clusterName, s.node, s.login);
        sessionStorage.setItem(TERM_KEY + path, JSON.stringify({ id: s.id, resume: r.resume }));
        navigate(path);
      } catch (err) { $('sessions-error').textContent = err.message; }
    });
    const end = document.createElement('button');
    end.type = 'button';
    end.className = 'end';
    end.textContent = 'End';
    end.addEventListener('click', async () => {
      try { await api('DELETE', `/webapi/terminals/${encodeURIComponent(s.id)}`); } catch (err) { $('sessions-error').textContent = err.message; }
      await showSessions();
    });
    actions.append(resume, end);
    body.append(tr);
  }
  $('sessions-empty').hidden = items.length > 0;
  await sessions.showActive();
}

$('nav-sessions').addEventListener('click', () => navigate('/web/sessions'));
$('nav-nodes').addEventListener('click', () => navigate('/'));

// ---- recordings ----------------------------------------------------------

let recordings = [];
let player = null; // the open asciinema-player
let playerWatch = null; // the interval that follows playback past a broken chain

function recordingMatches(r, query) {
  if (!query) return true;
  const hay = [r.user, r.login, r.node_hostname, r.node, r.command, r.session_id].join(' ').toLowerCase();
  return query.toLowerCase().split(/\s+/).filter(Boolean).every((w) => hay.includes(w));
}

async function showRecordings() {
  closeTerminal();
  if (location.pathname !== '/web/recordings') history.pushState(null, '', '/web/recordings');
  show('recordings');
  $('recordings-error').textContent = '';
  try {
    recordings = (await api('GET', '/webapi/recordings')).items || [];
  } catch (err) {
    if (err.status === 401) return showLogin('Your session ended; log in again.');
    $('recordings-error').textContent = err.message;
    recordings = [];
  }
  renderRecordings();
}

function renderRecordings() {
  const query = $('recording-search').value.trim();
  const body = document.querySelector('#recordings tbody');
  body.replaceChildren();
  const shown = recordings.filter((r) => recordingMatches(r, query));
  for (const r of shown) {
    const tr = document.createElement('tr');
    tr.dataset.id = r.session_id;
    const cell = (text, cls) => {
      const td = document.createElement('td');
      td.textContent = text;
      if (cls) td.className = cls;
      tr.append(td);
      return td;
    };
    cell(new Date(r.started).toLocaleString());
    cell(r.user, 'user');
    cell(r.login);
    cell(r.node_hostname || r.node, 'hostname');
    cell(r.command || '(shell)', 'command');
    // Incomplete: the session runs, or its node died before the final
    // chunk (what was uploaded until then plays).
    cell(r.complete ? 'complete' : 'incomplete', 'state');
    const link = document.createElement('a');
    link.className = 'play button';
    link.textContent = 'Play';
    link.href = `/web/recordings/${encodeURIComponent(r.session_id)}`;
    link.addEventListener('click', (ev) => {
      if (ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;
      ev.preventDefault();
      navigate(link.getAttribute('href'));
    });
    cell('').append(link);
    body.append(tr);
  }
  $('recordings-empty').hidden = shown.length > 0;
}

$('recording-search').addEventListener('input', renderRecordings);

function closePlayer() {
  clearInterval(playerWatch);
  playerWatch = null;
  if (!player) return;
  try { player.dispose(); } catch { /* already gone */ }
  player = null;
  window.posternPlayer = null;
}

function fmtTime(s) {
  const m = Math.floor(s / 60);
  return `${m}:${String(Math.floor(s % 60)).padStart(2, '0')}`;
}

// openPlayer plays a recording with asciinema-player's segmented source:
// it reads the index (duration, markers, segment start times) and then
// only the segment it shows, so a seek into a long recording fetches a
// few MB, never the whole file. The bearer token goes in a header.
async function openPlayer(id, startAt) {
  const gen = ++playerGen;
  closeTerminal();
  closePlayer();
  show('player');
  $('player-error').textContent = '';
  $('player-markers').replaceChildren();
  $('player-state').textContent = '';
  $('player-title').textContent = id;
  const auth = { headers: { Authorization: `Bearer ${token}` }, credentials: 'same-origin' };
  const base = `/webapi/recordings/${encodeURIComponent(id)}`;
  // The download link cannot carry the header: it fetches and saves.
  $('player-download').onclick = async (ev) => {
    ev.preventDefault();
    try {
      const resp = await fetch(`${base}/cast`, auth);
      if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
      const url = URL.createObjectURL(await resp.blob());
      const a = document.createElement('a');
      a.href = url; a.download = `${id}.cast`; a.click();
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    } catch (err) { $('player-error').textContent = `download: ${err.message}`; }
  };
  // The verdict on the hash chain comes first, in a banner that stays
  // above the player: verified, incomplete (no final chunk: not
  // tampering) or tampered, with where the chain breaks. It is read with
  // the markers (metadata, not an audited play) before the player opens.
  const banner = $('player-verification');
  banner.hidden = true;
  banner.textContent = '';
  delete banner.dataset.state;
  delete banner.dataset.past;
  let markers = [];
  let verification = null;
  try {
    const resp = await fetch(`${base}/markers`, auth);
    if (resp.status === 401) return showLogin('Your session ended; log in again.');
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || body.message || `${resp.status} ${resp.statusText}`);
    markers = body.markers || [];
    verification = body.verification || null;
  } catch (err) {
    $('player-error').textContent = err.message;
  }
  if (gen !== playerGen) return; // another recording (or view) was opened meanwhile
  if (verification) showVerification(banner, verification);
  const el = $('player');
  el.replaceChildren();
  const p = createPlayer({ url: `${base}/index`, format: 'segmented', fetchOpts: auth }, el, {
    fit: 'both', controls: true, preload: true, autoPlay: false, startAt,
    terminalFontFamily: FONT_FAMILY, logger: console,
  });
  player = p;
  window.posternPlayer = p;
  // A recording the player cannot load (a header it refuses, a broken
  // stream) would otherwise leave a blank box.
  p.addEventListener('error', (ev) => {
    if (player !== p) return;
    const why = ev && (ev.message || (ev.detail && ev.detail.message));
    $('player-error').textContent = `This recording cannot be played${why ? `: ${why}` : ''}. The download link still gives the file.`;
  });
  // The index again, for the title and the marker list (the player keeps
  // its own copy); metadata only: the listing's entry.
  try {
    const r = await api('GET', `/webapi/recordings?id=${encodeURIComponent(id)}`);
    const it = (r.items || [])[0];
    if (!it) throw new APIError(404, `recording "${id}" not found`);
    if (player !== p) return;
    $('player-title').textContent = `${it.user} as ${it.login}@${it.node_hostname || it.node}${it.command ? `: ${it.command}` : ''} — ${new Date(it.started).toLocaleString()}`;
    $('player-state').textContent = it.complete ? '' : 'incomplete recording';
  } catch (err) {
    if (err.status === 401) return showLogin('Your session ended; log in again.');
    $('player-error').textContent = err.message;
  }
  if (player !== p) return;
  for (const [t, label] of markers) {
    const li = document.createElement('li');
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'marker';
    if (label.startsWith(BROKEN_MARKER)) b.classList.add('broken');
    b.textContent = `${fmtTime(t)} ${label}`;
    b.addEventListener('click', () => { if (player === p) p.seek(t); });
    li.append(b);
    $('player-markers').append(li);
  }
  if (verification && verification.state === 'tampered') {
    // Once playback is past the break the banner says so: what is on
    // screen then is not vouched for.
    playerWatch = setInterval(async () => {
      if (player !== p) return;
      let now;
      try { now = await p.getCurrentTime(); } catch { return; }
      const past = typeof now === 'number' && now > verification.until;
      if (String(past) !== (banner.dataset.past || 'false')) {
        banner.dataset.past = String(past);
        showVerification(banner, verification, past);
      }
    }, 250);
  }
}

// BROKEN_MARKER starts the marker the proxy puts where the chain breaks.
const BROKEN_MARKER = 'NOT VERIFIED from here on: ';

// showVerification fills the banner above the player from the index's
// verdict (webapi.RecordingVerification).
function showVerification(banner, v, past) {
  banner.dataset.state = v.state;
  let text;
  switch (v.state) {
    case 'verified':
      text = `Verified: hash chain intact over ${v.chunks} chunks (${v.bytes} bytes, complete). Not checked against the audit log's final hash (pctl recordings verify does).`;
      break;
    case 'incomplete':
      text = `Incomplete, not tampered: hash chain intact over ${v.chunks} chunks (up to ${fmtTime(v.until)}), but there is no final chunk: the session is still running, or its node stopped before it ended.`;
      break;
    default:
      text = `NOT VERIFIED — tampered: the hash chain breaks at chunk ${v.broken_chunk} (${v.problem}) at ${fmtTime(v.until)}. Everything after ${fmtTime(v.until)} is not vouched for.`;
      if (past) text += ' Playback is past that point: what you see now is NOT VERIFIED.';
  }
  banner.textContent = text;
  if (v.state === 'tampered' && v.reason) {
    const why = document.createElement('small');
    why.className = 'reason';
    why.textContent = v.reason;
    banner.append(document.createElement('br'), why);
  }
  banner.title = v.summary || '';
  banner.hidden = false;
}

// For e2e tests: play an exported .cast given as text in an element.
window.posternPlayCast = (text, el, opts) => createPlayer({ data: text }, el, opts || {});

$('player-back').addEventListener('click', () => navigate('/web/recordings'));
$('nav-recordings').addEventListener('click', () => navigate('/web/recordings'));

// ---- start ---------------------------------------------------------------

requests.init({ api, show, navigate, showLogin, user: () => sessionStorage.getItem(USER_KEY) || '' });
sessions.init({ api, show, navigate, token: () => token });

// adoptBrowserSession gives a tab without a token (a new tab, a deep
// link opened in one) the browser's web session: the server derives its
// token from the HttpOnly cookie, for same-origin calls only. A second
// login would be a second session (it no longer ends the first tab's, but
// it is one login too many).
async function adoptBrowserSession() {
  try {
    keepSession(await api('POST', '/webapi/sessions/token'));
  } catch { /* no live session in this browser: the login form */ }
}

// A psh login is given only by a login made for it: the page starts
// without this tab's session (a session this browser logged in with
// since, through single sign-on say, is adopted from its cookie, and
// the proxy refuses one older than psh's request).
if (location.pathname === CLI_LOGIN_PATH) forgetSession();

api('GET', '/webapi/ping').then((p) => { clusterName = p.cluster_name || ''; }).catch(() => {})
  .then(() => (token ? null : adoptBrowserSession()))
  .finally(() => route());
