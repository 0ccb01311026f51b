// End-to-end test of passkeys in the web UI: a real `build/postern start`
// (auth and proxy, SQLite, loopback ports picked at run time) driven by
// Debian's chromium through playwright-core, with Chromium's virtual
// authenticator (CDP WebAuthn domain) as the security key. The page is
// opened as https://localhost:PORT: an IP address cannot be a WebAuthn RP
// id. Screenshots land in e2e/artifacts/passkeys-*.png; the last line is
// `N passed, N failed`; the exit status is non-zero when anything failed.
//
//   node e2e/passkeys.mjs       (make e2e; needs `make build` and `npm ci` in e2e/)
import { chromium } from 'playwright-core';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, createWriteStream, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sleep, waitFor, servingAddr, Steps } from './harness.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const buildDir = resolve(here, '..', process.env.POSTERN_BUILD_DIR || 'build');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const artifacts = join(here, 'artifacts');
const steps = new Steps(artifacts, 'passkeys-');
const step = (page, name, fn) => steps.step(page, name, fn);
const login = userInfo().username;
const users = {
  a: ['pk-alice', 'alice passkey password 1'], b: ['pk-bob', 'bob passkey password 1'],
  // carol has no factor when the cluster starts requiring one.
  c: ['pk-carol', 'carol passkey password 1'],
};


// authenticator gives a page's browser context a virtual platform
// authenticator with resident keys and user verification, touched
// automatically.
async function authenticator(page, transport = 'internal', cdp = null) {
  if (!cdp) {
    cdp = await page.context().newCDPSession(page);
    await cdp.send('WebAuthn.enable', { enableUI: false });
  }
  const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', {
    options: {
      protocol: 'ctap2', transport, hasResidentKey: true, hasUserVerification: true,
      isUserVerified: true, automaticPresenceSimulation: true,
    },
  });
  return { cdp, authenticatorId };
}

async function passwordLogin(page, [name, pw]) {
  await page.fill('#login-user', name);
  await page.fill('#login-password', pw);
  await page.click('#login-submit');
}

async function loggedInAs(page, name) {
  await waitFor(`logged in as ${name}`, async () => (await page.textContent('#whoami')) === name);
}

async function loginError(page, want) {
  return waitFor(`login error "${want}"`, async () => {
    const t = await page.textContent('#login-error');
    return t && t.includes(want) ? t : null;
  });
}

async function logout(page) {
  await page.click('#logout');
  await page.waitForSelector('#view-login:not([hidden])');
}

async function addPasskey(page, name) {
  await page.click('#nav-account');
  await page.waitForSelector('#view-account:not([hidden])');
  await page.fill('#passkey-name', name);
  await page.click('#passkey-add');
  await page.waitForSelector(`#devices tbody tr:has-text(${JSON.stringify(name)})`);
}

async function main() {
  mkdirSync(artifacts, { recursive: true });
  const dataDir = mkdtempSync(join(tmpdir(), 'postern-e2e-passkeys-'));
  const anyPort = '127.0.0.1:0';
  const daemon = spawn(join(buildDir, 'postern'), [
    'start', '--data-dir', dataDir, '--cluster-name', 'e2e-pk', '--roles', 'auth,proxy,node', '--nodename', 'pk-node',
    '--node-addr', anyPort, '--ssh-addr', anyPort, '--web-addr', anyPort, '--auth-addr', anyPort,
    '--diag-addr', anyPort, '--tunnel-addr', anyPort, '--peer-addr', anyPort,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  const webAddrP = servingAddr(daemon, 'Web server is serving.');
  webAddrP.catch(() => {});
  const log = createWriteStream(join(artifacts, 'postern-passkeys.log'));
  daemon.stdout.pipe(log);
  daemon.stderr.pipe(log);
  let daemonExited = false;
  daemon.on('exit', () => { daemonExited = true; });
  const pctl = (args, input) => execFileSync(join(buildDir, 'pctl'), ['--data-dir', dataDir, ...args],
    { input, stdio: ['pipe', 'pipe', 'pipe'] }).toString();
  const setPreference = (secondFactor, origin) => {
    const f = join(dataDir, 'pref.yaml');
    writeFileSync(f, ['kind: auth_preference', 'spec:', `  second_factor: ${secondFactor}`, '  passwordless: true',
      '  webauthn:', '    rp_id: localhost', `    origins: [${JSON.stringify(origin)}]`, ''].join('\n'));
    pctl(['create', '-f', f]);
  };
  let browser;
  try {
    await waitFor('postern to start', () => {
      if (daemonExited) throw new Error('postern exited; see e2e/artifacts/postern-passkeys.log');
      pctl(['users', 'ls']);
      return true;
    });
    const webAddr = await webAddrP;
    const port = webAddr.slice(webAddr.lastIndexOf(':') + 1);
    const base = `https://localhost:${port}`;
    for (const [name, pw] of Object.values(users)) pctl(['users', 'add', name, '--logins', login], `${pw}\n`);
    // Passkeys bound to localhost; no factor required yet, so the users
    // can log in with their passwords to register their first passkey.
    setPreference('off', base);

    browser = await chromium.launch({
      executablePath: chromiumPath, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    const ctxA = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await ctxA.newPage();
    page.on('dialog', (d) => d.accept(d.type() === 'prompt' ? 'renamed key' : undefined));
    const ctxB = await browser.newContext({ ignoreHTTPSErrors: true });
    const pageB = await ctxB.newPage();
    let aliceKey;

    await step(page, 'register a passkey on the Account page', async () => {
      await page.goto(base);
      aliceKey = await authenticator(page);
      await passwordLogin(page, users.a);
      await loggedInAs(page, users.a[0]);
      await addPasskey(page, 'alice key');
      const kind = await page.textContent('#devices tbody tr td:nth-child(2)');
      if (kind !== 'passkey') throw new Error(`kind column says ${kind}`);
    });

    await step(pageB, 'another user registers theirs in another browser', async () => {
      await pageB.goto(base);
      await authenticator(pageB);
      await passwordLogin(pageB, users.b);
      await loggedInAs(pageB, users.b[0]);
      await addPasskey(pageB, 'bob key');
    });

    await step(page, 'the password alone is refused once passkeys are required', async () => {
      setPreference('webauthn', base);
      await logout(page);
      // The login page learns the requirement from /webapi/ping (cached
      // by the proxy for a few seconds).
      await waitFor('the passkey buttons', async () => {
        await page.reload();
        return !(await page.isHidden('#login-passkey'));
      });
      await passwordLogin(page, users.a);
      await loginError(page, 'invalid credentials');
    });

    const ctxC = await browser.newContext({ ignoreHTTPSErrors: true });
    const pageC = await ctxC.newPage();
    await step(pageC, 'a user without a factor gets a register-only session, registers, logs in again', async () => {
      await pageC.goto(base);
      await authenticator(pageC);
      await waitFor('the passkey buttons', async () => {
        await pageC.reload();
        return !(await pageC.isHidden('#login-passkey'));
      });
      await passwordLogin(pageC, users.c);
      await pageC.waitForSelector('#view-account:not([hidden])');
      await pageC.waitForSelector('#account-notice:not([hidden])');
      if (!(await pageC.isHidden('#nav-nodes'))) throw new Error('the Nodes tab is offered to a register-only session');
      // The API itself refuses everything else, whatever the page shows.
      const nodes = await pageC.evaluate(async () => {
        const r = await fetch('/webapi/nodes', { headers: { Authorization: `Bearer ${sessionStorage.getItem('postern.token')}` } });
        return { status: r.status, body: await r.text() };
      });
      if (nodes.status !== 403 || !nodes.body.includes('can only register a second factor')) throw new Error(`GET /webapi/nodes answered ${nodes.status} ${nodes.body}`);
      await pageC.goto(`${base}/`);
      await pageC.waitForSelector('#view-account:not([hidden])');
      await pageC.fill('#passkey-name', 'carol key');
      await pageC.click('#passkey-add');
      await waitFor('the login page after registering', async () => (await pageC.textContent('#login-notice')).includes('Passkey registered'));
      await pageC.fill('#login-user', users.c[0]);
      await pageC.fill('#login-password', users.c[1]);
      await pageC.click('#login-passkey');
      await loggedInAs(pageC, users.c[0]);
      await pageC.waitForSelector('#view-nodes:not([hidden])');
    });

    await step(pageC, 'a web terminal to a require_session_mfa node asks for the passkey first; a resume does not', async () => {
      const roleFile = join(dataDir, 'sensitive.yaml');
      writeFileSync(roleFile, ['kind: role', 'version: v1', 'metadata: {name: sensitive}', 'spec:',
        `  logins: [${JSON.stringify(login)}]`, '  node_labels: {"*": "*"}', '  require_session_mfa: true', ''].join('\n'));
      pctl(['create', '-f', roleFile]);
      pctl(['users', 'update', users.c[0], '--roles', 'sensitive']);
      let begins = 0;
      pageC.on('request', (r) => { if (r.url().endsWith('/webapi/mfa/session/begin')) begins++; });
      // The new role is in the next login's certificate.
      await logout(pageC);
      await pageC.fill('#login-user', users.c[0]);
      await pageC.fill('#login-password', users.c[1]);
      await pageC.click('#login-passkey');
      await loggedInAs(pageC, users.c[0]);
      const row = await pageC.waitForSelector('#nodes tbody tr[data-hostname="pk-node"]');
      const uuid = await row.$eval('.uuid', (td) => td.textContent);
      // The API refuses a terminal without the passkey, whatever a page does.
      const reason = await pageC.evaluate(({ uuid, login }) => new Promise((res) => {
        const params = encodeURIComponent(JSON.stringify({ host: uuid, login, cols: 80, rows: 24, cluster: '' }));
        const ws = new WebSocket(`wss://${location.host}/webapi/terminal?params=${params}`, 'postern.v1');
        ws.binaryType = 'arraybuffer';
        let text = '';
        ws.onopen = () => ws.send(JSON.stringify({ token: sessionStorage.getItem('postern.token'), ack: 0 }));
        ws.onmessage = (ev) => { if (typeof ev.data !== 'string') text += new TextDecoder().decode(new Uint8Array(ev.data).subarray(1)); };
        ws.onclose = (ev) => res(`${ev.reason} ${text}`);
      }), { uuid, login });
      if (!reason.includes('fresh second factor')) throw new Error(`a terminal without the passkey ended with "${reason}"`);
      await row.$eval('a.connect', (a) => a.click());
      await waitFor('the terminal to connect', async () => (await pageC.getAttribute('#term-status', 'data-status')) === 'connected');
      if (begins !== 1) throw new Error(`the passkey was asked ${begins} times`);
      await pageC.click('#terminal');
      await pageC.keyboard.type('echo mfa-$((6*7))\n');
      const text = () => pageC.evaluate(() => {
        const t = window.posternTerminal;
        if (!t) return '';
        const b = t.buffer.active;
        const out = [];
        for (let y = 0; y < b.length; y++) out.push(b.getLine(y).translateToString(true));
        return out.join('\n');
      });
      await waitFor('the command output', async () => (await text()).includes('mfa-42'));
      // A reload resumes the same shell: no new passkey.
      await pageC.reload();
      await waitFor('the terminal to resume', async () => (await pageC.getAttribute('#term-status', 'data-status')) === 'connected');
      await waitFor('the output after the resume', async () => (await text()).includes('mfa-42'));
      if (begins !== 1) throw new Error(`a resume asked for the passkey again (${begins} begins)`);
    });

    await step(page, 'log in with password and passkey', async () => {
      await page.fill('#login-user', users.a[0]);
      await page.fill('#login-password', users.a[1]);
      await page.click('#login-passkey');
      await loggedInAs(page, users.a[0]);
    });

    await step(page, 'passwordless login', async () => {
      await logout(page);
      await page.click('#login-passwordless');
      await loggedInAs(page, users.a[0]);
    });

    await step(page, "a login with another user's passkey is refused", async () => {
      await logout(page);
      // Bob's password, but this browser holds only alice's passkey.
      await page.fill('#login-user', users.b[0]);
      await page.fill('#login-password', users.b[1]);
      await page.click('#login-passkey');
      await loginError(page, '');
      if ((await page.textContent('#whoami')) !== '') throw new Error('logged in');
    });

    await step(page, 'a login from another origin is refused', async () => {
      await page.goto(`https://127.0.0.1:${port}/`);
      await page.waitForSelector('#view-login:not([hidden])');
      // Same tab, same authenticator, which holds alice's passkey for
      // localhost: the browser refuses to use it for this origin.
      await page.click('#login-passwordless');
      await waitFor('an error', async () => (await page.textContent('#login-error')) !== '');
      if ((await page.textContent('#whoami')) !== '') throw new Error('logged in');
    });

    await step(page, 'the last passkey cannot be deleted; rename and delete otherwise', async () => {
      await page.goto(base);
      await page.click('#login-passwordless');
      await loggedInAs(page, users.a[0]);
      await page.click('#nav-account');
      await page.waitForSelector('#devices tbody tr');
      await page.click('#devices tbody tr .device-delete');
      await waitFor('the refusal', async () => (await page.textContent('#account-error')).includes('last second factor'));
      await page.click('#devices tbody tr .device-rename');
      await page.waitForSelector('#devices tbody tr:has-text("renamed key")');
      // A second key: a USB one (the laptop's own, which holds the
      // first passkey, may not register twice: the exclusion list).
      await aliceKey.cdp.send('WebAuthn.removeVirtualAuthenticator', { authenticatorId: aliceKey.authenticatorId });
      await authenticator(page, 'usb', aliceKey.cdp);
      await addPasskey(page, 'spare key');
      await page.click('#devices tbody tr:has-text("renamed key") .device-delete');
      await waitFor('one passkey left', async () => (await page.$$('#devices tbody tr')).length === 1);
    });
  } catch (err) {
    steps.failed++;
    console.log(`FAIL setup: ${err.message}`);
  } finally {
    if (browser) await browser.close();
    daemon.kill('SIGTERM');
    await new Promise((r) => (daemonExited ? r() : daemon.once('exit', r)));
    if (!process.env.E2E_KEEP) rmSync(dataDir, { recursive: true, force: true });
  }
  process.exit(steps.summary());
}

main();
