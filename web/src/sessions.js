// Joining other users' live sessions from the web: the Sessions page's
// "Sessions you may join" list (GET /webapi/sessions/active) with a Join
// button and a mode picker, and the joined session's view: a terminal fed
// by GET /webapi/sessions/{id}/join, which speaks the web terminal's
// protocol (first message {token}, then frames). The nodes decide who may
// join what and in which mode; this page only shows their answers. An
// observer's terminal takes no typing (the proxy and the node drop it
// anyway); a moderator gets an End button that ends the session for
// everyone; Leave closes this party's channel only. The module builds its
// own DOM, so index.html stays as it is.
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';

const SUBPROTOCOL = 'postern.v1';
const FONT_FAMILY = '"DejaVu Sans Mono", "Menlo", "Consolas", "Liberation Mono", "Noto Sans Mono", monospace';
// MODES are the join modes in the order of what they allow; the picker
// offers them all (a node refuses a mode the user's roles do not allow,
// as "not found"), observer first: watching is the safe default.
const MODES = [
  ['observer', 'Observe'],
  ['peer', 'Join as peer'],
  ['moderator', 'Moderate'],
];

let deps = null; // {api, show, showLogin, token, user}
let joined = null; // the joined session shown, or null
let loads = 0; // lists shown so far (the table's data-loads, for tests)

const enc = new TextEncoder();
const dec = new TextDecoder();

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props);
  e.append(...children);
  return e;
}

function frame(type, payload = '') {
  const body = typeof payload === 'string' ? enc.encode(payload) : payload;
  const out = new Uint8Array(1 + body.length);
  out[0] = type.charCodeAt(0);
  out.set(body, 1);
  return out;
}

// init adds the list under the Sessions page and the joined view; main.js
// calls it once.
export function init(d) {
  deps = d;
  document.getElementById('view-sessions').append(
    el('h2', { textContent: 'Sessions you may join' }),
    el('p', { id: 'active-error', className: 'error', role: 'alert' }),
    el('table', { id: 'active-sessions' },
      el('thead', {}, el('tr', {}, ...['User', 'Login', 'Node', 'Started', 'Participants', ''].map((h) => el('th', { textContent: h })))),
      el('tbody')),
    el('p', { id: 'active-empty', hidden: true, textContent: 'No live sessions you may join.' }),
  );
  document.querySelector('main').append(el('section', { id: 'view-join', hidden: true },
    el('div', { className: 'toolbar' },
      el('span', { id: 'join-title' }),
      el('span', { id: 'join-status', textContent: 'idle' }),
      el('button', { id: 'join-leave', type: 'button', textContent: 'Leave' }),
      el('button', { id: 'join-end', type: 'button', hidden: true, textContent: 'End session' })),
    el('pre', { id: 'join-error', className: 'error', role: 'alert', hidden: true }),
    el('p', { id: 'join-notice', className: 'notice', role: 'status', hidden: true }),
    el('div', { id: 'join-terminal' })));
  document.getElementById('join-leave').addEventListener('click', () => {
    close();
    deps.navigate('/web/sessions');
  });
  document.getElementById('join-end').addEventListener('click', () => {
    if (!joined || !joined.ws || joined.ws.readyState !== WebSocket.OPEN) return;
    if (!window.confirm('End this session for everyone in it?')) return;
    joined.ws.send(frame('t'));
  });
}

// showActive fills the list of sessions this user may join.
export async function showActive() {
  const err = document.getElementById('active-error');
  err.textContent = '';
  const body = document.querySelector('#active-sessions tbody');
  let items = [];
  try {
    items = (await deps.api('GET', '/webapi/sessions/active')).items || [];
  } catch (e) {
    if (e.status === 401) return;
    err.textContent = e.message;
  }
  body.replaceChildren();
  for (const s of items) {
    const picker = el('select', { className: 'join-mode', title: 'How to take part' },
      ...MODES.map(([value, label]) => el('option', { value, textContent: label })));
    const join = el('button', { type: 'button', className: 'join', textContent: 'Join' });
    join.addEventListener('click', () => open(s, picker.value));
    const tr = el('tr', {},
      el('td', { className: 'user', textContent: s.user }),
      el('td', { textContent: s.login }),
      el('td', { className: 'hostname', textContent: s.node }),
      el('td', { textContent: new Date(s.started).toLocaleString() }),
      el('td', { className: 'participants', textContent: (s.participants || []).join(', ') }),
      el('td', {}, picker, ' ', join));
    tr.dataset.id = s.id;
    body.append(tr);
  }
  document.getElementById('active-empty').hidden = items.length > 0;
  document.getElementById('active-sessions').dataset.loads = String(++loads);
}

function setStatus(status, text) {
  const s = document.getElementById('join-status');
  s.dataset.status = status;
  s.textContent = text || status;
}

function showError(text) {
  const e = document.getElementById('join-error');
  e.textContent = text;
  e.hidden = !text;
}

function showNotice(text) {
  const n = document.getElementById('join-notice');
  n.textContent = text;
  n.hidden = !text;
}

// open joins session s in mode and shows it.
function open(s, mode) {
  close();
  deps.show('join');
  showError('');
  showNotice('');
  const observer = mode === 'observer';
  document.getElementById('join-title').textContent = `${s.user}'s session (${s.login}@${s.node}) as ${mode}`;
  document.getElementById('join-end').hidden = mode !== 'moderator';
  setStatus('connecting', 'connecting…');
  const xterm = new Terminal({
    cursorBlink: !observer, fontSize: 14, lineHeight: 1.2, scrollback: 5000,
    fontFamily: FONT_FAMILY, disableStdin: observer,
  });
  const fit = new FitAddon();
  xterm.loadAddon(fit);
  const container = document.getElementById('join-terminal');
  container.replaceChildren();
  container.dataset.mode = mode;
  xterm.open(container);
  try { fit.fit(); } catch { /* hidden */ }
  const url = `wss://${location.host}/webapi/sessions/${encodeURIComponent(s.id)}/join?mode=${mode}&cols=${xterm.cols}&rows=${xterm.rows}`;
  const ws = new WebSocket(url, SUBPROTOCOL);
  ws.binaryType = 'arraybuffer';
  const j = { s, mode, xterm, ws, observer: null, ready: false, ended: false, closeReason: '' };
  joined = j;
  window.posternJoinTerminal = xterm; // for e2e tests and debugging
  const send = (type, payload) => { if (j.ready && ws.readyState === WebSocket.OPEN) ws.send(frame(type, payload)); };
  ws.addEventListener('open', () => ws.send(JSON.stringify({ token: deps.token() })));
  ws.addEventListener('message', (ev) => {
    if (joined !== j) return;
    if (typeof ev.data === 'string') {
      if (JSON.parse(ev.data).status === 'ok') {
        j.ready = true;
        setStatus('connected', observer ? 'watching (read-only)' : 'connected');
        if (!observer) xterm.focus();
      }
      return;
    }
    const data = new Uint8Array(ev.data);
    if (data.length === 0) return;
    const payload = data.subarray(1);
    switch (String.fromCharCode(data[0])) {
      case 'r': xterm.write(payload); break;
      case 'n': showNotice(dec.decode(payload)); break;
      case 'e': showError(dec.decode(payload)); break;
      case 'c': {
        j.ended = true;
        try { j.closeReason = JSON.parse(dec.decode(payload)).reason; } catch { /* the websocket's reason */ }
        break;
      }
      case 'p': ws.send(frame('P', payload)); break;
      default: break; // pongs and unknown types
    }
  });
  ws.addEventListener('close', (ev) => {
    if (joined !== j) return;
    j.ended = true;
    setStatus('disconnected', `disconnected: ${j.closeReason || ev.reason || `connection closed (code ${ev.code})`}`);
    xterm.options.disableStdin = true;
    document.getElementById('join-end').hidden = true;
  });
  if (!observer) xterm.onData((d) => send('r', d));
  j.observer = new ResizeObserver(() => { try { fit.fit(); } catch { /* hidden */ } });
  j.observer.observe(container);
}

// close leaves the joined session shown, if any (the session goes on).
export function close() {
  const j = joined;
  if (!j) return;
  joined = null;
  if (j.observer) j.observer.disconnect();
  if (j.ws.readyState === WebSocket.OPEN) {
    try { j.ws.send(frame('c', JSON.stringify({ code: 0, reason: 'left' }))); } catch { /* closing */ }
  }
  if (j.ws.readyState <= WebSocket.OPEN) j.ws.close(1000, 'left');
  j.xterm.dispose();
  window.posternJoinTerminal = null;
}
