// End-to-end test of an OpenSSH node in the web UI: a real `build/postern
// start` (auth and proxy, SQLite, loopback ports picked at run time) and
// Debian's own sshd (/usr/sbin/sshd on a loopback port, with its own
// config and host key in a temp dir), registered the way an admin does
// it: `pctl nodes add-openssh` fetches the host key and asks to confirm
// it, and sshd is restarted with the snippet it wrote. Debian's chromium,
// through playwright-core, then logs in, sees the node as openssh and
// online, opens a terminal, runs a command, closes it and plays the
// proxy's recording of it back in the web player; then sshd stops (the
// node turns offline in the UI and in `pctl nodes ls`) and starts again
// (online again). sshd needs root (privilege separation, the login's
// user), as in CI. Screenshots land in e2e/artifacts/openssh-*.png; the
// last line is `N passed, N failed`; the exit status is non-zero when
// anything failed.
//
//   node e2e/openssh.mjs       (make e2e; needs `make build` and `npm ci` in e2e/)
import { chromium } from 'playwright-core';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, createWriteStream, writeFileSync, readFileSync, existsSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir, userInfo } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sleep, waitFor, servingAddr, Steps } from './harness.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const buildDir = resolve(here, '..', process.env.POSTERN_BUILD_DIR || 'build');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const sshdPath = '/usr/sbin/sshd';
const artifacts = join(here, 'artifacts');
const steps = new Steps(artifacts, 'openssh-');
const step = (page, name, fn) => steps.step(page, name, fn);
// The login is the user running the test (root in CI): sshd lets a
// certificate log in as root (PermitRootLogin prohibit-password), and
// without PAM it refuses a locked account, which root's is not for keys.
const login = userInfo().username;
const user = 'ossh-alice';
const password = 'openssh e2e password 1';
const nodeName = 'legacy';


// freePort asks the kernel for a free loopback port.
function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => res(port)); });
  });
}

// accepts resolves to whether a TCP connection to port is accepted.
function accepts(port) {
  return new Promise((res) => {
    const c = connect(port, '127.0.0.1');
    c.once('connect', () => { c.destroy(); res(true); });
    c.once('error', () => res(false));
  });
}

// Sshd is Debian's sshd on a loopback port with its own config and host
// key, the way srvtest.StartSSHD runs it for the Go tests.
class Sshd {
  constructor(dir, port) {
    this.dir = dir;
    this.port = port;
    this.conf = join(dir, 'sshd_config');
    this.log = join(dir, 'sshd.log');
    this.child = null;
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'e2e-openssh', '-f', join(dir, 'ssh_host_ed25519_key')]);
    this.base = [
      `Port ${port}`, 'ListenAddress 127.0.0.1', `HostKey ${join(dir, 'ssh_host_ed25519_key')}`,
      `PidFile ${join(dir, 'sshd.pid')}`, 'UsePAM no', 'PermitRootLogin prohibit-password',
      'AuthorizedKeysFile none', 'PasswordAuthentication no', 'KbdInteractiveAuthentication no',
      'StrictModes no', 'UseDNS no', 'LogLevel VERBOSE',
    ];
    this.configure([]);
    // Its privilege separation directory, which Debian creates at boot.
    mkdirSync('/run/sshd', { recursive: true, mode: 0o755 });
  }

  configure(extra) {
    writeFileSync(this.conf, [...this.base, ...extra, ''].join('\n'), { mode: 0o600 });
  }

  async start() {
    if (this.child) throw new Error('sshd already running');
    // sshd wants its own absolute path (it re-executes itself).
    const child = spawn(sshdPath, ['-D', '-f', this.conf, '-E', this.log], { stdio: 'ignore' });
    this.child = child;
    let exited = false;
    child.once('exit', () => { exited = true; });
    await waitFor(`sshd listening on 127.0.0.1:${this.port}`, async () => {
      if (exited) throw new Error(`sshd exited; its log: ${existsSync(this.log) ? readFileSync(this.log, 'utf8').slice(-500) : '(none)'}`);
      return accepts(this.port);
    }, 10000, 50);
  }

  async stop() {
    const child = this.child;
    if (!child) return;
    this.child = null;
    if (child.exitCode === null && child.signalCode === null) {
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await gone;
    }
  }
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

async function typeInTerminal(page, text) {
  await page.locator('.xterm-helper-textarea').focus();
  await page.keyboard.type(text);
}

// nodeRow waits until the node list, reloaded until it does, shows the
// OpenSSH node with status.
async function nodeRow(page, status, timeoutMs) {
  const sel = `tr[data-hostname="${nodeName}"][data-kind="openssh"][data-status="${status}"]`;
  await waitFor(`${nodeName} listed as openssh, ${status}`, async () => {
    if (await page.locator(sel).count()) return true;
    await page.click('#nav-nodes');
    await page.reload();
    await page.locator('#view-nodes').waitFor({ state: 'visible' });
    return (await page.locator(sel).count()) > 0;
  }, timeoutMs, 500);
  return page.locator(sel);
}

async function main() {
  mkdirSync(artifacts, { recursive: true });
  if (process.getuid && process.getuid() !== 0) {
    console.log('FAIL setup: sshd needs root (privilege separation and the login\'s user); run as root, as CI does');
    console.log('0 passed, 1 failed');
    process.exit(1);
  }
  const dataDir = mkdtempSync(join(tmpdir(), 'postern-e2e-openssh-'));
  const sshdDir = mkdtempSync(join(tmpdir(), 'postern-e2e-sshd-'));
  const outDir = join(sshdDir, 'postern-openssh');
  const anyPort = '127.0.0.1:0';
  const daemon = spawn(join(buildDir, 'postern'), [
    'start', '--data-dir', dataDir, '--cluster-name', 'e2e-ossh', '--roles', 'auth,proxy',
    '--ssh-addr', anyPort, '--web-addr', anyPort, '--auth-addr', anyPort,
    '--diag-addr', anyPort, '--tunnel-addr', anyPort, '--peer-addr', anyPort,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  const webAddrP = servingAddr(daemon, 'Web server is serving.');
  webAddrP.catch(() => {});
  const log = createWriteStream(join(artifacts, 'postern-openssh.log'));
  daemon.stdout.pipe(log);
  daemon.stderr.pipe(log);
  let daemonExited = false;
  daemon.on('exit', () => { daemonExited = true; });
  const pctl = (args, input) => execFileSync(join(buildDir, 'pctl'), ['--data-dir', dataDir, ...args],
    { input, stdio: ['pipe', 'pipe', 'pipe'] }).toString();
  let sshd;
  let browser;
  try {
    sshd = new Sshd(sshdDir, await freePort());
    await sshd.start();
    await waitFor('postern to start', () => {
      if (daemonExited) throw new Error('postern exited; see e2e/artifacts/postern-openssh.log');
      pctl(['users', 'ls']);
      return true;
    });
    const webAddr = await webAddrP;
    const base = `https://127.0.0.1:${webAddr.slice(webAddr.lastIndexOf(':') + 1)}`;
    pctl(['users', 'add', user, '--logins', login], `${password}\n`);

    browser = await chromium.launch({
      executablePath: chromiumPath, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    const ctx = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1200, height: 800 } });
    const page = await ctx.newPage();
    let recordingID = '';

    await step(page, 'register the running sshd with pctl nodes add-openssh, confirming its host key', async () => {
      const fp = execFileSync('ssh-keygen', ['-l', '-f', join(sshdDir, 'ssh_host_ed25519_key.pub')]).toString().split(' ')[1];
      // Not confirmed: nothing is registered.
      const add = ['nodes', 'add-openssh', '--name', nodeName, '--addr', `127.0.0.1:${sshd.port}`, '--labels', 'env=e2e', '--out', outDir];
      let refused = '';
      try { pctl(add, 'n\n'); } catch (err) { refused = `${err.stdout}${err.stderr}`; }
      if (!refused.includes('host key not confirmed') || !refused.includes(fp)) throw new Error(`without a yes: ${refused || 'registered'}`);
      const out = pctl(add, 'y\n');
      if (!out.includes(fp) || !out.includes(`OpenSSH node "${nodeName}" registered`)) throw new Error(`add-openssh said: ${out}`);
      // The admin's part: the snippet into sshd_config, sshd restarted.
      sshd.configure([`Include ${join(outDir, 'sshd_config.snippet')}`]);
      await sshd.stop();
      await sshd.start();
    });

    await step(page, 'log in and see the node as openssh, online', async () => {
      await page.goto(base);
      await page.fill('#login-user', user);
      await page.fill('#login-password', password);
      await page.click('#login-submit');
      await page.locator('#view-nodes').waitFor({ state: 'visible' });
      // The checker saw sshd before it had its certificate: it may call
      // it offline until its next check.
      const row = await nodeRow(page, 'online', 90000);
      const kind = (await row.locator('td.kind').innerText()).trim();
      if (kind !== 'openssh online') throw new Error(`kind column says ${JSON.stringify(kind)}`);
      await row.locator('select.login').selectOption(login);
    });

    await step(page, 'open a terminal, run a command and read its output', async () => {
      const link = page.locator(`tr[data-hostname="${nodeName}"] a.connect`);
      await link.click();
      await page.locator('#term-status[data-status="connected"]').waitFor({ timeout: 30000 });
      await waitFor('a shell prompt', async () => (await rowsText(page)).trim().length > 0, 60000);
      // Computed by the shell, so that it is not the echo of the typing.
      await typeInTerminal(page, 'echo "openssh-web-$((6*7))"; uname -s\n');
      await waitFor('the output', async () => (await rowsText(page)).includes('openssh-web-42'), 30000);
    });

    await step(page, 'close the terminal', async () => {
      await page.click('#term-disconnect');
      await page.locator('#term-status[data-status="disconnected"]').waitFor({ timeout: 30000 });
    });

    await step(page, 'the proxy\'s recording is listed and plays the command\'s output in the web player', async () => {
      // The proxy uploads the final chunk shortly after the end.
      recordingID = await waitFor('a complete recording of the terminal', async () => {
        await page.click('#nav-recordings');
        await page.locator('#view-recordings').waitFor({ state: 'visible' });
        const rows = await page.locator('#recordings tbody tr').evaluateAll((trs) => trs.map((tr) => ({
          id: tr.dataset.id, state: tr.querySelector('.state').textContent, host: tr.querySelector('.hostname').textContent,
        })));
        const r = rows.find((x) => x.host === nodeName && x.state === 'complete');
        if (!r) { await page.reload(); return null; }
        return r.id;
      }, 30000, 500);
      await page.click(`#recordings tbody tr[data-id="${recordingID}"] a.play`);
      await page.locator('#view-player').waitFor({ state: 'visible' });
      await waitFor('the player to load', () => page.evaluate(() => window.posternPlayer && window.posternPlayer.getDuration() !== undefined), 30000, 50);
      await page.locator('#player-verification[data-state="verified"]').waitFor({ timeout: 10000 });
      await page.evaluate(() => window.posternPlayer.seek(window.posternPlayer.getDuration()));
      await waitFor('the output on the player\'s screen', async () => {
        const lines = await page.evaluate(() => [...document.querySelectorAll('#player .ap-term-text .ap-line')].map((l) => l.textContent.trim()));
        return lines.includes('openssh-web-42') && lines.includes('Linux');
      }, 15000, 100);
      const title = await page.locator('#player-title').innerText();
      if (!title.includes(`${user} as ${login}@${nodeName}`)) throw new Error(`player title ${JSON.stringify(title)}`);
      const markers = await page.locator('#player-markers').innerText();
      if (!/exit-status/.test(markers)) throw new Error(`markers: ${markers}`);
      const verified = pctl(['recordings', 'verify', recordingID]);
      if (!verified.includes('hash chain intact')) throw new Error(`pctl recordings verify: ${verified}`);
    });

    await step(page, 'sshd stops: the node is offline in the UI and in pctl nodes ls', async () => {
      await sshd.stop();
      await page.click('#nav-nodes');
      await nodeRow(page, 'offline', 90000);
      // The proxy's next heartbeat carries what its checker found.
      await waitFor('pctl nodes ls: offline', async () => new RegExp(`^${nodeName} .* openssh +offline$`, 'm').test(pctl(['nodes', 'ls'])), 60000, 500);
      // A terminal to it says why, without dialing.
      await page.locator(`tr[data-hostname="${nodeName}"] select.login`).selectOption(login);
      await page.locator(`tr[data-hostname="${nodeName}"] a.connect`).click();
      await page.locator('#term-status[data-status="disconnected"]', { hasText: 'its SSH server does not answer' }).waitFor({ timeout: 30000 });
    });

    await step(page, 'sshd starts again: the node is online again', async () => {
      await sshd.start();
      await page.click('#term-back');
      await nodeRow(page, 'online', 90000);
      await waitFor('pctl nodes ls: online', async () => new RegExp(`^${nodeName} .* openssh +online$`, 'm').test(pctl(['nodes', 'ls'])), 60000, 500);
    });
  } catch (err) {
    steps.failed++;
    console.log(`FAIL setup: ${err.message}`);
  } finally {
    if (browser) await browser.close();
    if (sshd) await sshd.stop();
    daemon.kill('SIGTERM');
    await new Promise((r) => (daemonExited ? r() : daemon.once('exit', r)));
    if (!process.env.E2E_KEEP) {
      rmSync(dataDir, { recursive: true, force: true });
      rmSync(sshdDir, { recursive: true, force: true });
    }
  }
  process.exit(steps.summary());
}

main();
