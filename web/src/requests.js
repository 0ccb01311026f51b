// The Requests page: the access requests this user may see (their own,
// and those their roles' review_requests covers), one request's reviews,
// and approve/deny with a reason. The auth server decides everything
// (who may review, no self-approval, thresholds); this page only shows
// its answers. A requester assumes their own approved request here (as
// `psh login --request-id` does): the session then serves with its roles
// until it is dropped, denied or expires. The page builds its own DOM (a nav button and a section),
// so index.html and main.js stay as they are but for the route.

let deps = null; // {api, show, navigate, showLogin}
let current = null; // the request shown in detail

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props);
  e.append(...children);
  return e;
}

// init adds the nav button and the view; main.js calls it once.
export function init(d) {
  deps = d;
  const nav = el('button', { id: 'nav-requests', className: 'nav', type: 'button', hidden: true, textContent: 'Requests' });
  document.getElementById('nav-account').before(nav);
  nav.addEventListener('click', () => deps.navigate('/web/requests'));
  const section = el('section', { id: 'view-requests', hidden: true },
    el('div', { className: 'toolbar' }, el('h1', { textContent: 'Access requests' })),
    el('p', { id: 'requests-error', className: 'error', role: 'alert' }),
    el('p', { id: 'requests-assumed', className: 'notice', role: 'status', hidden: true },
      el('span', { id: 'requests-assumed-text' }), ' ',
      el('button', { id: 'request-drop', type: 'button', textContent: 'Drop' })),
    el('table', { id: 'requests' },
      el('thead', {}, el('tr', {}, ...['ID', 'User', 'Roles', 'State', 'Approvals', 'Expires', 'Reason', ''].map((h) => el('th', { textContent: h })))),
      el('tbody')),
    el('p', { id: 'requests-empty', hidden: true, textContent: 'No access requests you may see.' }),
    el('div', { id: 'request-detail', hidden: true },
      el('h2', { id: 'request-title' }),
      el('dl', { id: 'request-fields' }),
      el('h3', { textContent: 'Reviews' }),
      el('ul', { id: 'request-reviews' }),
      el('form', { id: 'request-review-form' },
        el('label', {}, 'Reason ', el('input', { id: 'request-reason', maxLength: 512, placeholder: 'why (shown to the requester)' })),
        el('button', { id: 'request-approve', type: 'button', textContent: 'Approve' }),
        el('button', { id: 'request-deny', type: 'button', textContent: 'Deny' })),
      el('p', { id: 'request-status', className: 'notice', role: 'status' })));
  document.querySelector('main').append(section);
  document.getElementById('request-approve').addEventListener('click', () => review('approved'));
  document.getElementById('request-deny').addEventListener('click', () => review('denied'));
  document.getElementById('request-drop').addEventListener('click', () => drop());
}

// setNavHidden follows the other nav buttons (hidden on the login view).
export function setNavHidden(hidden) {
  const nav = document.getElementById('nav-requests');
  if (nav) nav.hidden = hidden;
}

function errorText(msg) { document.getElementById('requests-error').textContent = msg; }

// stateAt is the state as of now: past its expiry a request is expired,
// whatever the last sweep wrote.
function stateAt(r) {
  if ((r.state === 'pending' || r.state === 'approved') && new Date(r.expires) <= new Date()) return 'expired';
  return r.state;
}

function approvals(r) {
  return `${(r.reviews || []).filter((v) => v.state === 'approved').length}/${r.thresholds || 1}`;
}

// showList shows /web/requests, or /web/requests/ID with its detail.
export async function showList(id) {
  const path = id ? `/web/requests/${encodeURIComponent(id)}` : '/web/requests';
  if (location.pathname !== path) history.pushState(null, '', path);
  deps.show('requests');
  errorText('');
  let items = [];
  let assumed = {};
  try {
    [items, assumed] = await Promise.all([deps.api('GET', '/webapi/requests'), deps.api('GET', '/webapi/requests/assumed')]);
  } catch (err) {
    if (err.status === 401) return deps.showLogin('Your session ended; log in again.');
    errorText(err.message);
  }
  const body = document.querySelector('#requests tbody');
  body.replaceChildren();
  for (const r of items) {
    const open = el('button', { type: 'button', className: 'open', textContent: 'Show' });
    open.addEventListener('click', () => deps.navigate(`/web/requests/${encodeURIComponent(r.id)}`));
    const actions = el('td', {}, open);
    // One's own approved request can be assumed (auth refuses any other).
    if (r.user === deps.user() && stateAt(r) === 'approved' && r.id !== assumed.request_id) {
      const take = el('button', { type: 'button', className: 'assume', textContent: 'Assume' });
      take.addEventListener('click', () => assume(r.id));
      actions.append(' ', take);
    }
    const tr = el('tr', {}, ...[r.id, r.user, (r.roles || []).join(', '), stateAt(r), approvals(r),
      new Date(r.expires).toLocaleString(), r.reason || ''].map((t) => el('td', { textContent: t })), actions);
    tr.dataset.id = r.id;
    tr.querySelectorAll('td')[3].className = 'state';
    body.append(tr);
  }
  document.getElementById('requests-empty').hidden = items.length > 0;
  showAssumed(assumed);
  document.getElementById('request-detail').hidden = true;
  if (id) await showDetail(id);
}

async function showDetail(id) {
  document.getElementById('request-status').textContent = '';
  try {
    current = await deps.api('GET', `/webapi/requests/${encodeURIComponent(id)}`);
  } catch (err) {
    if (err.status === 401) return deps.showLogin('Your session ended; log in again.');
    current = null;
    return errorText(err.message);
  }
  const r = current;
  document.getElementById('request-title').textContent = `Request ${r.id}`;
  const fields = document.getElementById('request-fields');
  fields.replaceChildren();
  for (const [k, v] of [['User', r.user], ['Roles', (r.roles || []).join(', ')], ['State', stateAt(r)], ['Approvals', approvals(r)],
    ['Reason', r.reason || ''], ['Created', new Date(r.created).toLocaleString()], ['Expires', new Date(r.expires).toLocaleString()]]) {
    fields.append(el('dt', { textContent: k }), el('dd', { textContent: v, className: `field-${k.toLowerCase()}` }));
  }
  const reviews = document.getElementById('request-reviews');
  reviews.replaceChildren(...(r.reviews || []).map((v) => el('li', {
    textContent: `${v.reviewer} ${v.state} at ${new Date(v.time).toLocaleString()}${v.reason ? `: ${v.reason}` : ''}`,
  })));
  const open = stateAt(r) === 'pending' || stateAt(r) === 'approved';
  document.getElementById('request-review-form').hidden = !open;
  document.getElementById('request-approve').hidden = stateAt(r) !== 'pending';
  document.getElementById('request-detail').hidden = false;
}

async function review(state) {
  if (!current) return;
  errorText('');
  const id = current.id;
  try {
    const r = await deps.api('POST', `/webapi/requests/${encodeURIComponent(id)}/review`,
      { state, reason: document.getElementById('request-reason').value });
    document.getElementById('request-reason').value = '';
    await showList(id);
    document.getElementById('request-status').textContent = `Request ${r.id} is ${r.state}.`;
  } catch (err) {
    if (err.status === 401) return deps.showLogin('Your session ended; log in again.');
    errorText(err.message);
  }
}

// showAssumed says which request the session serves with, if any.
function showAssumed(a) {
  const bar = document.getElementById('requests-assumed');
  bar.hidden = !a || !a.request_id;
  if (bar.hidden) return;
  document.getElementById('requests-assumed-text').textContent =
    `Assumed request ${a.request_id} (roles ${(a.roles || []).join(', ')}) until ${new Date(a.expires).toLocaleString()}.`;
}

// assume makes the session serve with request id's roles.
async function assume(id) {
  errorText('');
  try {
    await deps.api('POST', `/webapi/requests/${encodeURIComponent(id)}/assume`);
    await showList();
  } catch (err) {
    if (err.status === 401) return deps.showLogin('Your session ended; log in again.');
    errorText(err.message);
  }
}

// drop goes back to the session's own roles.
async function drop() {
  errorText('');
  try {
    await deps.api('DELETE', '/webapi/requests/assumed');
    await showList();
  } catch (err) {
    if (err.status === 401) return deps.showLogin('Your session ended; log in again.');
    errorText(err.message);
  }
}
