// End-to-end test of access requests in the web UI: a real `build/postern
// start` (auth, proxy and node, SQLite, loopback ports picked at run time),
// the built psh as the requester and Debian's chromium through
// playwright-core as the reviewer. A user who cannot reach the node
// requests a role with psh; a reviewer approves it on the Requests page;
// the requester then reaches the node. The requester's own browser cannot
// approve the request (no self-approval), and a deny in the UI ends the
// grant. Then the requester assumes a second approved request in the
// browser, opens a terminal to the node it could not reach, and a deny
// ends that terminal while the session goes on. Screenshots land in e2e/artifacts/requests-*.png; the last line
// is `N passed, N failed`; the exit status is non-zero when anything
// failed.
//
//   node e2e/requests.mjs       (make e2e; needs `make build` and `npm ci` in e2e/)
import { chromium } from 'playwright-core';
import { spawn, execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, createWriteStream, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sleep, waitFor, servingAddr, Steps } from './harness.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const buildDir = resolve(here, '..', process.env.POSTERN_BUILD_DIR || 'build');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const artifacts = join(here, 'artifacts');
const steps = new Steps(artifacts, 'requests-');
const step = (page, name, fn) => steps.step(page, name, fn);
const login = userInfo().username;
const nodename = 'req-node';
const users = { rita: 'rita request password 1', rev: 'rev review password 1' };

const roles = `kind: role
metadata: {name: e2e-access}
spec:
  logins: ['{{internal.logins}}']
  node_labels: {env: e2e}
---
kind: role
metadata: {name: e2e-requester}
spec:
  logins: ['{{internal.logins}}']
  node_labels: {env: nowhere}
  request: {roles: [e2e-access], max_ttl: 1h}
---
kind: role
metadata: {name: e2e-reviewer}
spec:
  logins: ['{{internal.logins}}']
  node_labels: {env: nowhere}
  review_requests: {roles: [e2e-access]}
`;


async function browserLogin(page, base, name) {
  await page.goto(base);
  await page.fill('#login-user', name);
  await page.fill('#login-password', users[name]);
  await page.click('#login-submit');
  await waitFor(`logged in as ${name}`, async () => (await page.textContent('#whoami')) === name);
}

// rowsText is the terminal's visible text, read from xterm's buffer.
async function rowsText(page) {
  return page.evaluate(() => {
    const t = window.posternTerminal;
    if (!t) return '';
    const b = t.buffer.active;
    const out = [];
    for (let y = b.viewportY; y < b.viewportY + t.rows; y++) {
      const l = b.getLine(y);
      out.push(l ? l.translateToString(true) : '');
    }
    return out.join('\n');
  });
}

async function openRequest(page, id) {
  await page.click('#nav-requests');
  await page.waitForSelector('#view-requests:not([hidden])');
  await page.click(`#requests tbody tr[data-id="${id}"] button.open`);
  await page.waitForSelector('#request-detail:not([hidden])');
}

async function main() {
  mkdirSync(artifacts, { recursive: true });
  const dataDir = mkdtempSync(join(tmpdir(), 'postern-e2e-requests-'));
  const pshHome = join(dataDir, 'psh-rita');
  const anyPort = '127.0.0.1:0';
  const daemon = spawn(join(buildDir, 'postern'), [
    'start', '--data-dir', dataDir, '--cluster-name', 'e2e-req', '--roles', 'auth,proxy,node',
    '--nodename', nodename, '--labels', 'env=e2e',
    '--node-addr', anyPort, '--ssh-addr', anyPort, '--web-addr', anyPort, '--auth-addr', anyPort,
    '--diag-addr', anyPort, '--tunnel-addr', anyPort, '--peer-addr', anyPort,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  const webAddrP = servingAddr(daemon, 'Web server is serving.');
  webAddrP.catch(() => {});
  const log = createWriteStream(join(artifacts, 'postern-requests.log'));
  daemon.stdout.pipe(log);
  daemon.stderr.pipe(log);
  let daemonExited = false;
  daemon.on('exit', () => { daemonExited = true; });
  const pctl = (args, input) => execFileSync(join(buildDir, 'pctl'), ['--data-dir', dataDir, ...args],
    { input, stdio: ['pipe', 'pipe', 'pipe'] }).toString();
  // psh as rita: {out, err, code}.
  const psh = (args, input = '') => {
    const env = { ...process.env, POSTERN_HOME: pshHome };
    delete env.SSH_AUTH_SOCK;
    const r = spawnSync(join(buildDir, 'psh'), args, { input, env, timeout: 60000 });
    return { out: r.stdout.toString(), err: r.stderr.toString(), code: r.status };
  };
  let browser;
  try {
    await waitFor('postern to start', () => {
      if (daemonExited) throw new Error('postern exited; see e2e/artifacts/postern-requests.log');
      pctl(['users', 'ls']);
      return true;
    });
    const webAddr = await webAddrP;
    const port = webAddr.slice(webAddr.lastIndexOf(':') + 1);
    const base = `https://127.0.0.1:${port}`;
    roles.split('---\n').forEach((doc, i) => {
      const f = join(dataDir, `role-${i}.yaml`);
      writeFileSync(f, doc);
      pctl(['create', '-f', f]);
    });
    pctl(['users', 'add', 'rita', '--logins', login, '--roles', 'e2e-requester'], `${users.rita}\n`);
    pctl(['users', 'add', 'rev', '--logins', login, '--roles', 'e2e-reviewer'], `${users.rev}\n`);
    await waitFor('the node to heartbeat', () => pctl(['nodes', 'ls']).includes(nodename));

    browser = await chromium.launch({
      executablePath: chromiumPath, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    const rev = await (await browser.newContext({ ignoreHTTPSErrors: true })).newPage();
    const rita = await (await browser.newContext({ ignoreHTTPSErrors: true })).newPage();
    let id;

    await step(rev, 'the requester cannot reach the node, and asks for a role with psh', async () => {
      const l = psh(['login', '--proxy', webAddr, '--user', 'rita', '--cacert', join(dataDir, 'web', 'web.crt')], `${users.rita}\n`);
      if (l.code !== 0) throw new Error(`psh login: ${l.err}`);
      const before = psh(['ssh', nodename, 'echo reached']);
      if (before.code === 0) throw new Error('reached the node before any request');
      const c = psh(['request', 'create', '--roles', 'e2e-access', '--reason', 'e2e incident']);
      if (c.code !== 0) throw new Error(`psh request create: ${c.err}`);
      id = c.out.trim();
      if (!/^[0-9a-f-]{36}$/.test(id)) throw new Error(`request id ${JSON.stringify(id)}`);
    });

    await step(rita, 'the requester may not approve their own request in the web UI', async () => {
      await browserLogin(rita, base, 'rita');
      await openRequest(rita, id);
      await rita.click('#request-approve');
      await waitFor('the refusal', async () => (await rita.textContent('#requests-error')).includes('your own'));
    });

    await step(rev, 'the reviewer sees the request on the Requests page and approves it', async () => {
      await browserLogin(rev, base, 'rev');
      await openRequest(rev, id);
      const reason = await rev.textContent('#request-fields .field-reason');
      if (reason !== 'e2e incident') throw new Error(`reason shows ${JSON.stringify(reason)}`);
      await rev.fill('#request-reason', 'approved in e2e');
      await rev.click('#request-approve');
      await waitFor('approved', async () => (await rev.textContent('#request-status')).includes('approved'));
      await waitFor('the row says approved', async () => (await rev.textContent(`#requests tbody tr[data-id="${id}"] td.state`)) === 'approved');
      const reviews = await rev.textContent('#request-reviews');
      if (!reviews.includes('rev approved') || !reviews.includes('approved in e2e')) throw new Error(`reviews: ${reviews}`);
    });

    await step(rev, 'the requester then reaches the node', async () => {
      const l = psh(['login', '--request-id', id]);
      if (l.code !== 0) throw new Error(`psh login --request-id: ${l.err}`);
      const r = psh(['ssh', nodename, 'echo reached']);
      if (r.code !== 0 || r.out !== 'reached\n') throw new Error(`psh ssh: ${r.code} ${r.out} ${r.err}`);
    });

    await step(rev, 'a deny in the web UI ends the grant', async () => {
      await openRequest(rev, id);
      await rev.fill('#request-reason', 'done');
      await rev.click('#request-deny');
      await waitFor('denied', async () => (await rev.textContent('#request-status')).includes('denied'));
      await waitFor('the node refuses the certificate', async () => psh(['ssh', nodename, 'echo reached']).code !== 0, 15000);
    });

    let id2;
    await step(rita, 'the requester asks again, and the browser lists no node yet', async () => {
      // The denied request's certificate speaks for nobody: log in again.
      const l = psh(['login', '--proxy', webAddr, '--user', 'rita', '--cacert', join(dataDir, 'web', 'web.crt')], `${users.rita}\n`);
      if (l.code !== 0) throw new Error(`psh login: ${l.err}`);
      const c = psh(['request', 'create', '--roles', 'e2e-access', '--reason', 'e2e web']);
      if (c.code !== 0) throw new Error(`psh request create: ${c.err}`);
      id2 = c.out.trim();
      await rita.click('#nav-nodes');
      await rita.locator('#view-nodes').waitFor({ state: 'visible' });
      await rita.reload();
      await rita.locator('#view-nodes').waitFor({ state: 'visible' });
      await rita.locator('#nodes-empty').waitFor({ state: 'visible' });
      if (await rita.locator(`tr[data-hostname="${nodename}"]`).count()) throw new Error('the node is listed before any grant');
    });

    await step(rev, 'the reviewer approves the second request', async () => {
      await rev.reload();
      await openRequest(rev, id2);
      await rev.click('#request-approve');
      await waitFor('approved', async () => (await rev.textContent('#request-status')).includes('approved'));
    });

    await step(rita, 'the requester assumes it on the Requests page', async () => {
      await rita.click('#nav-requests');
      await rita.waitForSelector('#view-requests:not([hidden])');
      if (await rita.locator(`#requests tbody tr[data-id="${id}"] button.assume`).count()) throw new Error('a denied request offers Assume');
      await rita.click(`#requests tbody tr[data-id="${id2}"] button.assume`);
      await waitFor('the assumed notice', async () => (await rita.textContent('#requests-assumed-text')).includes(id2));
      if (await rita.locator(`#requests tbody tr[data-id="${id2}"] button.assume`).count()) throw new Error('the assumed request still offers Assume');
    });

    await step(rita, 'the node is listed now, and a terminal reaches it', async () => {
      await rita.click('#nav-nodes');
      const row = rita.locator(`tr[data-hostname="${nodename}"]`);
      await row.waitFor({ timeout: 15000 });
      await row.locator('a.connect').click();
      await rita.locator('#term-status[data-status="connected"]').waitFor({ timeout: 30000 });
      await waitFor('a shell prompt', async () => (await rowsText(rita)).trim().length > 0, 30000);
      await rita.locator('.xterm-helper-textarea').focus();
      await rita.keyboard.type('echo "assumed-$((6*7))"\n');
      await waitFor('the output', async () => (await rowsText(rita)).includes('assumed-42'), 30000);
    });

    await step(rev, 'a deny ends the terminal opened with the assumed request', async () => {
      await openRequest(rev, id2);
      await rev.click('#request-deny');
      await waitFor('denied', async () => (await rev.textContent('#request-status')).includes('denied'));
      await rita.locator('#term-status[data-status="disconnected"]').waitFor({ timeout: 15000 });
    });

    await step(rita, 'the session goes on with the requester\'s own roles', async () => {
      await rita.click('#nav-requests');
      await rita.waitForSelector('#view-requests:not([hidden])');
      await waitFor('no assumed request', async () => rita.locator('#requests-assumed').isHidden());
      await rita.click('#nav-nodes');
      await rita.locator('#nodes-empty').waitFor({ state: 'visible' });
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
