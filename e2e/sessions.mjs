// End-to-end test of joining a live session from the web UI: a real
// `build/postern start` (auth, proxy and node, SQLite, loopback ports
// picked at run time), the owner's session a real `psh ssh` in a pty
// (`script`), and Debian's chromium through playwright-core. A user whose
// role may observe sees the session on the Sessions page, joins it as an
// observer, sees the screen as it was and the owner's live output, and
// what they type never reaches the shell; a user whose role may moderate
// joins from a second browser and ends the session for everyone; the
// owner's psh exits, and each browser sees the other's join and leave
// lines. A user with no join_sessions sees nothing. Screenshots land in
// e2e/artifacts/sessions-*.png; the last line is `N passed, N failed`;
// the exit status is non-zero when anything failed.
//
//   node e2e/sessions.mjs       (make e2e; needs `make build` and `npm ci` in e2e/)
import { chromium } from 'playwright-core';
import { spawn, execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, createWriteStream, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { waitFor, servingAddr, Steps } from './harness.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const buildDir = resolve(here, '..', process.env.POSTERN_BUILD_DIR || 'build');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const artifacts = join(here, 'artifacts');
const steps = new Steps(artifacts, 'sessions-');
const step = (page, name, fn) => steps.step(page, name, fn);
const login = userInfo().username;
const nodename = 'join-node';
const users = {
  owen: 'owen owner password 1',
  olga: 'olga observer password 1',
  mona: 'mona moderator password 1',
  nick: 'nick nobody password 1',
};

const roles = `kind: role
metadata: {name: e2e-observer}
spec:
  join_sessions: [{roles: [access], modes: [observer]}]
---
kind: role
metadata: {name: e2e-moderator}
spec:
  join_sessions: [{roles: [access], modes: [moderator]}]
`;

async function browserLogin(page, base, name) {
  await page.goto(base);
  await page.fill('#login-user', name);
  await page.fill('#login-password', users[name]);
  await page.click('#login-submit');
  await waitFor(`logged in as ${name}`, async () => (await page.textContent('#whoami')) === name);
}

// joinedText is the joined terminal's text, scrollback included, read
// from xterm's buffer.
async function joinedText(page) {
  return page.evaluate(() => {
    const t = window.posternJoinTerminal;
    if (!t) return '';
    const b = t.buffer.active;
    const out = [];
    for (let y = 0; y < b.length; y++) {
      const l = b.getLine(y);
      out.push(l ? l.translateToString(true) : '');
    }
    return out.join('\n');
  });
}

// showList opens the Sessions page and waits for its joinable list to
// be shown afresh.
async function showList(page) {
  const before = await page.evaluate(() => Number(document.querySelector('#active-sessions')?.dataset.loads || 0));
  await page.click('#nav-sessions');
  await page.waitForFunction((n) => Number(document.querySelector('#active-sessions').dataset.loads || 0) > n, before, { timeout: 30000 });
}

// sessionRow waits for the session on the Sessions page (the list is
// asked for again until the node has it).
async function sessionRow(page, id) {
  return waitFor(`session ${id} on the Sessions page`, async () => {
    await showList(page);
    const row = page.locator(`#active-sessions tbody tr[data-id="${id}"]`);
    return (await row.count()) ? row : null;
  }, 30000, 500);
}

async function main() {
  mkdirSync(artifacts, { recursive: true });
  const dataDir = mkdtempSync(join(tmpdir(), 'postern-e2e-sessions-'));
  const anyPort = '127.0.0.1:0';
  const daemon = spawn(join(buildDir, 'postern'), [
    'start', '--data-dir', dataDir, '--cluster-name', 'e2e-join', '--roles', 'auth,proxy,node',
    '--nodename', nodename, '--labels', 'env=e2e',
    '--node-addr', anyPort, '--ssh-addr', anyPort, '--web-addr', anyPort, '--auth-addr', anyPort,
    '--diag-addr', anyPort, '--tunnel-addr', anyPort, '--peer-addr', anyPort,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  const webAddrP = servingAddr(daemon, 'Web server is serving.');
  webAddrP.catch(() => {});
  const log = createWriteStream(join(artifacts, 'postern-sessions.log'));
  daemon.stdout.pipe(log);
  daemon.stderr.pipe(log);
  let daemonExited = false;
  daemon.on('exit', () => { daemonExited = true; });
  const pctl = (args, input) => execFileSync(join(buildDir, 'pctl'), ['--data-dir', dataDir, ...args],
    { input, stdio: ['pipe', 'pipe', 'pipe'] }).toString();
  const pshHome = join(dataDir, 'psh-owen');
  const pshEnv = { ...process.env, POSTERN_HOME: pshHome };
  delete pshEnv.SSH_AUTH_SOCK;
  let browser;
  let owner;
  let ownerOut = '';
  let ownerExited = false;
  try {
    await waitFor('postern to start', () => {
      if (daemonExited) throw new Error('postern exited; see e2e/artifacts/postern-sessions.log');
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
    pctl(['users', 'add', 'owen', '--logins', login, '--roles', 'access'], `${users.owen}\n`);
    pctl(['users', 'add', 'olga', '--logins', login, '--roles', 'access,e2e-observer'], `${users.olga}\n`);
    pctl(['users', 'add', 'mona', '--logins', login, '--roles', 'access,e2e-moderator'], `${users.mona}\n`);
    pctl(['users', 'add', 'nick', '--logins', login, '--roles', 'access'], `${users.nick}\n`);
    await waitFor('the node to heartbeat', () => pctl(['nodes', 'ls']).includes(nodename));

    browser = await chromium.launch({
      executablePath: chromiumPath, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    const olga = await (await browser.newContext({ ignoreHTTPSErrors: true })).newPage();
    const mona = await (await browser.newContext({ ignoreHTTPSErrors: true })).newPage();
    const nick = await (await browser.newContext({ ignoreHTTPSErrors: true })).newPage();
    let id;

    await step(olga, 'the owner starts a session with psh ssh in a pty', async () => {
      const l = spawnSync(join(buildDir, 'psh'), ['login', '--proxy', webAddr, '--user', 'owen', '--cacert', join(dataDir, 'web', 'web.crt')],
        { input: `${users.owen}\n`, env: pshEnv, timeout: 60000 });
      if (l.status !== 0) throw new Error(`psh login: ${l.stderr}`);
      // script gives psh a pty: a session is joinable only with one.
      owner = spawn('script', ['-qfc', `${join(buildDir, 'psh')} ssh ${nodename}`, '/dev/null'], { env: pshEnv, stdio: ['pipe', 'pipe', 'pipe'] });
      owner.stdout.on('data', (d) => { ownerOut += d.toString(); });
      owner.stderr.on('data', (d) => { ownerOut += d.toString(); });
      owner.on('exit', () => { ownerExited = true; });
      owner.stdin.write('echo before-$((20+1))=$SSH_SESSION_ID.\r');
      const m = await waitFor('the session id', () => ownerOut.match(/before-21=([0-9a-f-]{36})\./), 30000);
      id = m[1];
    });

    await step(nick, 'a user without join_sessions sees no session to join', async () => {
      await browserLogin(nick, base, 'nick');
      await showList(nick);
      await nick.locator('#active-empty').waitFor({ state: 'visible', timeout: 5000 });
      if (await nick.locator('#active-sessions tbody tr').count()) throw new Error('a session is listed to a user who may not join it');
    });

    await step(olga, 'the observer sees it on the Sessions page and joins as an observer', async () => {
      await browserLogin(olga, base, 'olga');
      const row = await sessionRow(olga, id);
      const user = await row.locator('td.user').textContent();
      if (user !== 'owen') throw new Error(`the row names ${JSON.stringify(user)}`);
      await row.locator('select.join-mode').selectOption('observer');
      await row.locator('button.join').click();
      await olga.locator('#join-status[data-status="connected"]').waitFor({ timeout: 30000 });
      if (await olga.locator('#join-end').isVisible()) throw new Error('an observer is offered End');
      await waitFor('the screen as it was', async () => (await joinedText(olga)).includes(`before-21=${id}.`), 30000);
      await waitFor('the join line', async () => (await joinedText(olga)).includes('[postern: olga joined as observer]'), 30000);
      await waitFor('the owner told', () => ownerOut.includes('[postern: olga joined as observer]'), 30000);
    });

    await step(olga, 'the observer sees the owner\'s live output', async () => {
      owner.stdin.write('echo live-$((6*7))\r');
      await waitFor('the live output', async () => (await joinedText(olga)).includes('live-42'), 30000);
    });

    await step(olga, 'what the observer types never reaches the shell', async () => {
      await olga.locator('#join-terminal').click();
      await olga.keyboard.type('echo observer-$((3*3))\n');
      // The owner's next command is the sync point: once its output is
      // in, anything the observer's typing had produced would be too.
      owner.stdin.write('echo sync-$((1+2))\r');
      await waitFor('the sync output', async () => (await joinedText(olga)).includes('sync-3'), 30000);
      if (ownerOut.includes('observer-9') || ownerOut.includes('observer-$((3*3))')) throw new Error(`the observer's typing reached the shell: ${ownerOut.slice(-300)}`);
      if ((await joinedText(olga)).includes('observer-9')) throw new Error('the observer\'s typing ran');
    });

    await step(mona, 'a moderator joins from another browser and ends the session for everyone', async () => {
      await browserLogin(mona, base, 'mona');
      const row = await sessionRow(mona, id);
      await row.locator('select.join-mode').selectOption('moderator');
      await row.locator('button.join').click();
      await mona.locator('#join-status[data-status="connected"]').waitFor({ timeout: 30000 });
      await waitFor('the moderator sees the session', async () => (await joinedText(mona)).includes('sync-3'), 30000);
      await waitFor('the observer sees the moderator join', async () => (await joinedText(olga)).includes('[postern: mona joined as moderator]'), 30000);
      mona.once('dialog', (d) => d.accept());
      await mona.click('#join-end');
      await waitFor('the owner told', () => ownerOut.includes('[postern: mona (moderator) ended the session]'), 30000);
      await waitFor('the owner\'s psh to exit', () => ownerExited, 30000);
      await mona.locator('#join-status[data-status="disconnected"]').waitFor({ timeout: 30000 });
      await olga.locator('#join-status[data-status="disconnected"]').waitFor({ timeout: 30000 });
      if (!(await joinedText(olga)).includes('ended the session')) throw new Error('the observer did not see the end');
    });

    await step(olga, 'the ended session is no longer listed', async () => {
      await olga.click('#join-leave');
      await olga.waitForSelector('#view-sessions:not([hidden])');
      await waitFor('an empty list', async () => {
        await showList(olga);
        return olga.locator('#active-empty').isVisible();
      }, 30000, 500);
    });
  } catch (err) {
    steps.failed++;
    console.log(`FAIL setup: ${err.message}`);
  } finally {
    if (browser) await browser.close();
    if (owner && !ownerExited) owner.kill('SIGTERM');
    daemon.kill('SIGTERM');
    await new Promise((r) => (daemonExited ? r() : daemon.once('exit', r)));
    if (!process.env.E2E_KEEP) rmSync(dataDir, { recursive: true, force: true });
  }
  process.exit(steps.summary());
}

main();
