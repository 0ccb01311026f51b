// Passkeys in the browser: the WebAuthn ceremonies of the login page and
// of the Account page. The proxy answers with the options go-webauthn
// makes (binary fields in base64url) and takes the PublicKeyCredential
// back as JSON with the same encoding; this module converts between those
// and what navigator.credentials wants. Auth checks everything; nothing
// here is trusted.

const b64url = {
  decode(s) {
    const b64 = s.replace(/-/g, '+').replace(/_/g, '/') + '==='.slice((s.length + 3) % 4);
    return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)).buffer;
  },
  encode(buf) {
    let s = '';
    for (const b of new Uint8Array(buf)) s += String.fromCharCode(b);
    return btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  },
};

// creationOptions turns the proxy's options into navigator.credentials.create's.
function creationOptions(opts) {
  const pk = { ...opts.publicKey };
  pk.challenge = b64url.decode(pk.challenge);
  pk.user = { ...pk.user, id: b64url.decode(pk.user.id) };
  pk.excludeCredentials = (pk.excludeCredentials || []).map((c) => ({ ...c, id: b64url.decode(c.id) }));
  return { publicKey: pk };
}

// requestOptions turns the proxy's options into navigator.credentials.get's.
function requestOptions(opts) {
  const pk = { ...opts.publicKey };
  pk.challenge = b64url.decode(pk.challenge);
  pk.allowCredentials = (pk.allowCredentials || []).map((c) => ({ ...c, id: b64url.decode(c.id) }));
  return { publicKey: pk };
}

function credentialJSON(cred) {
  const r = cred.response;
  const response = { clientDataJSON: b64url.encode(r.clientDataJSON) };
  if (r.attestationObject) {
    response.attestationObject = b64url.encode(r.attestationObject);
    if (r.getTransports) response.transports = r.getTransports();
  } else {
    response.authenticatorData = b64url.encode(r.authenticatorData);
    response.signature = b64url.encode(r.signature);
    if (r.userHandle) response.userHandle = b64url.encode(r.userHandle);
  }
  return {
    id: cred.id, rawId: b64url.encode(cred.rawId), type: cred.type, response,
    clientExtensionResults: cred.getClientExtensionResults ? cred.getClientExtensionResults() : {},
    authenticatorAttachment: cred.authenticatorAttachment || undefined,
  };
}

// supported says whether this browser can run a ceremony at all.
export function supported() {
  return typeof window.PublicKeyCredential === 'function' && !!navigator.credentials;
}

// login runs a passkey login: after the password ({user, password}) or
// passwordless ({passwordless: true}). It returns what POST
// /webapi/sessions returns.
export async function login(api, begin) {
  const ch = await api('POST', '/webapi/mfa/login/begin', begin);
  const cred = await navigator.credentials.get(requestOptions(ch.webauthn));
  if (!cred) throw new Error('no passkey was chosen');
  return api('POST', '/webapi/mfa/login/finish', { challenge_id: ch.challenge_id, webauthn: credentialJSON(cred) });
}

// answer runs a challenge ({challenge_id, webauthn}) on the
// authenticator and returns {challenge_id, webauthn} to send back.
export async function answer(ch) {
  const cred = await navigator.credentials.get(requestOptions(ch.webauthn));
  if (!cred) throw new Error('no passkey was chosen');
  return { challenge_id: ch.challenge_id, webauthn: credentialJSON(cred) };
}

// confirmSession answers a per-session challenge (require_session_mfa)
// for the terminal body names ({node, login, cluster}); it returns
// {mfa_token} for the terminal's first message.
export async function confirmSession(api, ch, body) {
  const cred = await navigator.credentials.get(requestOptions(ch.webauthn));
  if (!cred) throw new Error('no passkey was chosen');
  return api('POST', '/webapi/mfa/session/finish', { ...body, challenge_id: ch.challenge_id, webauthn: credentialJSON(cred) });
}

// register adds a passkey named name to the logged-in user.
export async function register(api, name) {
  const ch = await api('POST', '/webapi/mfa/register/begin', { name });
  const cred = await navigator.credentials.create(creationOptions(ch.webauthn));
  if (!cred) throw new Error('no passkey was created');
  return api('POST', '/webapi/mfa/register/finish', { challenge_id: ch.challenge_id, webauthn: credentialJSON(cred) });
}

function fmtTime(s) {
  if (!s) return 'never';
  const d = new Date(s);
  return Number.isNaN(d.getTime()) || d.getFullYear() < 2000 ? 'never' : d.toLocaleString();
}

// renderDevices fills the Account page's table; onChange reloads it.
export function renderDevices(api, tbody, devices, onError, onChange) {
  tbody.replaceChildren();
  for (const d of devices) {
    const tr = document.createElement('tr');
    tr.dataset.device = d.id;
    const cell = (text) => { const td = document.createElement('td'); td.textContent = text; tr.append(td); return td; };
    cell(d.name).className = 'device-name';
    cell(d.kind === 'totp' ? 'one-time code' : 'passkey');
    cell(fmtTime(d.created));
    cell(fmtTime(d.last_used));
    const actions = cell('');
    const rename = document.createElement('button');
    rename.type = 'button';
    rename.textContent = 'Rename';
    rename.className = 'device-rename';
    rename.addEventListener('click', async () => {
      const name = prompt('New name', d.name);
      if (!name || name === d.name) return;
      try { await api('PUT', `/webapi/mfa/devices/${encodeURIComponent(d.id)}`, { name }); await onChange(); } catch (err) { onError(err.message); }
    });
    const del = document.createElement('button');
    del.type = 'button';
    del.textContent = 'Delete';
    del.className = 'device-delete';
    del.addEventListener('click', async () => {
      if (!confirm(`Delete ${d.name}?`)) return;
      try { await api('DELETE', `/webapi/mfa/devices/${encodeURIComponent(d.id)}`); await onChange(); } catch (err) { onError(err.message); }
    });
    actions.append(rename, ' ', del);
    tbody.append(tr);
  }
}
