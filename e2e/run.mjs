// End-to-end test of the web UI: a real `build/postern start` (auth, proxy
// and node roles, SQLite backend, loopback ports picked at run time) driven
// by Debian's chromium through playwright-core. Each step saves a
// screenshot under e2e/artifacts/. The last line is `N passed, N failed`;
// the exit status is non-zero when anything failed.
//
//   node e2e/run.mjs            (make e2e; needs `make build` and `npm ci` in e2e/)
//
// Environment: POSTERN_BUILD_DIR (default ./build), CHROMIUM (default
// /usr/bin/chromium), E2E_KEEP=1 keeps the data dir.
import { chromium } from 'playwright-core';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, createWriteStream, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo, hostname } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sleep, waitFor, servingAddr, Steps } from './harness.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '..');
const buildDir = resolve(root, process.env.POSTERN_BUILD_DIR || 'build');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const artifacts = join(here, 'artifacts');
const steps = new Steps(artifacts, '');
const step = (page, name, fn) => steps.step(page, name, fn);
const user = 'e2e';
const password = 'correct horse battery staple e2e';
const login = userInfo().username;
const nodename = 'e2e-node';
// tunnelName is a second node process that joins through the proxy's web
// port alone (--proxy-server) and lives on its reverse tunnel: no
// listening port, no route to auth.
const tunnelName = 'e2e-tunnel';
const userB = 'e2e-b';
// leafName is a second all-in-one `postern start` on loopback that trusts
// this cluster as its root (a leaf cluster): its node is reached through
// this proxy, picked in the nodes view's cluster picker.
const leafName = 'e2e-leaf';
const leafNode = 'e2e-leaf-node';

// The single sign-on step's identity provider (fixtures/oidc-op, a real
// OpenID provider) and its user, who maps to a role with this login.
const ssoConnector = 'corp';
const ssoDisplay = 'Corp SSO';
const ssoUser = 'alice';
const ssoPassword = 'verysecure';
const ssoEmail = 'alice@example.com';


// firstLine resolves to the first line a child prints on stdout.
function firstLine(child, what) {
  return new Promise((res, rej) => {
    let buf = '';
    const on = (d) => {
      buf += d.toString();
      const i = buf.indexOf('\n');
      if (i >= 0) {
        child.stdout.off('data', on);
        res(buf.slice(0, i));
      }
    };
    child.stdout.on('data', on);
    child.once('exit', () => rej(new Error(`${what} exited before printing its first line`)));
  });
}

// rowsText is the terminal's visible text, read from xterm's buffer (the
// WebGL renderer draws into a canvas: there are no DOM rows to read).
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

// allText is the terminal's whole buffer, scrollback included.
async function allText(page) {
  return page.evaluate(() => {
    const t = window.posternTerminal;
    if (!t) return '';
    const b = t.buffer.active;
    const out = [];
    for (let y = 0; y < b.length; y++) out.push(b.getLine(y).translateToString(true));
    return out.join('\n');
  });
}

async function snapshot(page) {
  return page.evaluate(() => (window.posternSerialize ? window.posternSerialize() : null));
}

// stableSnapshot waits until two serializations 300 ms apart agree.
async function stableSnapshot(page) {
  let prev = await snapshot(page);
  return waitFor('a stable screen', async () => {
    await sleep(300);
    const cur = await snapshot(page);
    const same = cur === prev;
    prev = cur;
    return same ? cur : null;
  }, 15000, 0);
}

async function resumeToken(page) {
  return page.evaluate(() => {
    for (const k of Object.keys(sessionStorage)) {
      if (k.startsWith('postern.term:')) return JSON.parse(sessionStorage.getItem(k)).resume;
    }
    return null;
  });
}

// tryResume opens a terminal socket from the page with TOKEN (the page's
// web session) and RESUME, and returns how it closed.
async function tryResume(page, token, resume) {
  return page.evaluate(([t, r]) => new Promise((resolve) => {
    const params = { host: 'x', login: 'x', cols: 80, rows: 24, cluster: '' };
    const ws = new WebSocket(`wss://${location.host}/webapi/terminal?params=${encodeURIComponent(JSON.stringify(params))}`, 'postern.v1');
    ws.onopen = () => ws.send(JSON.stringify({ token: t, resume: r, ack: 0 }));
    ws.onclose = (ev) => resolve({ code: ev.code, reason: ev.reason });
  }), [token, resume]);
}

// webapi GETs path with the page's web session (its cookie and bearer
// token) through Playwright's request context: not from the page, whose
// console would log an expected 404 as an error.
async function webapi(page, path) {
  const tok = await page.evaluate(() => sessionStorage.getItem('postern.token'));
  const r = await page.request.get(new URL(path, page.url()).href, { headers: { Authorization: `Bearer ${tok}` } });
  let body = null;
  try { body = await r.json(); } catch { /* not JSON */ }
  return { status: r.status(), body };
}

async function typeInTerminal(page, text) {
  await page.locator('.xterm-helper-textarea').focus();
  await page.keyboard.type(text);
}

// sttySize types a command that prints the pty size behind a marker and
// returns the last [rows, cols] seen on the screen.
async function sttySize(page, marker) {
  await typeInTerminal(page, `echo "${marker}=$(stty size)"\n`);
  const re = new RegExp(`${marker}=(\\d+) (\\d+)`, 'g');
  return waitFor(`${marker} on the screen`, async () => {
    const m = [...(await rowsText(page)).matchAll(re)];
    return m.length ? [Number(m.at(-1)[1]), Number(m.at(-1)[2])] : null;
  }, 30000);
}


// inkBelowBaseline prints TEXT at the start of a row and counts, in the
// screenshot, the pixels that differ from the background in the lower
// third of the cell at column COL (under the baseline, where `_`, `g`, `y`
// draw). The screenshot is decoded in the page (a data: image into a
// canvas: the UI's CSP allows data: images), so no PNG library is needed.
async function inkBelowBaseline(page, marker, col) {
  const box = await page.evaluate((marker) => {
    const t = window.posternTerminal;
    const buf = t.buffer.active;
    for (let y = buf.length - 1; y >= 0; y--) {
      const line = buf.getLine(y);
      if (line && line.translateToString(true).startsWith(marker)) {
        const row = y - buf.viewportY;
        if (row < 0 || row >= t.rows) return null;
        const r = document.querySelector('.xterm-screen').getBoundingClientRect();
        return { left: r.left, top: r.top, cw: r.width / t.cols, ch: r.height / t.rows, row };
      }
    }
    return null;
  }, marker);
  if (!box) throw new Error(`no row starting with ${marker} on the screen`);
  const clip = { x: box.left + col * box.cw, y: box.top + box.row * box.ch, width: box.cw, height: box.ch };
  const png = await page.screenshot({ clip });
  return page.evaluate(async (b64) => {
    const img = new Image();
    img.src = `data:image/png;base64,${b64}`;
    await img.decode();
    const c = document.createElement('canvas');
    c.width = img.width; c.height = img.height;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const { data, width, height } = g.getImageData(0, 0, c.width, c.height);
    // The background is the colour of the cell's top-left pixel.
    const bg = [data[0], data[1], data[2]];
    let ink = 0;
    for (let y = Math.floor(height * 2 / 3); y < height; y++) {
      for (let x = 0; x < width; x++) {
        const i = (y * width + x) * 4;
        const d = Math.abs(data[i] - bg[0]) + Math.abs(data[i + 1] - bg[1]) + Math.abs(data[i + 2] - bg[2]);
        if (d > 120) ink++;
      }
    }
    return ink;
  }, png.toString('base64'));
}

// playerScreen is the visible text of an asciinema-player in EL (a CSS
// selector): its terminal's lines, trailing blanks cut.
async function playerScreen(page, sel) {
  return page.evaluate((sel) => {
    const lines = [...document.querySelectorAll(`${sel} .ap-term-text .ap-line`)].map((l) => l.textContent.replace(/\s+$/, ''));
    return lines;
  }, sel);
}

// rendererRSS is the largest resident set (MB) of the chromium renderer
// processes this test started (descendants of this node process): a
// bound on any one tab's.
function rendererRSS(only) {
  const parent = new Map();
  const renderers = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      parent.set(Number(d), ppid);
      if (readFileSync(`/proc/${d}/cmdline`, 'utf8').includes('--type=renderer')) renderers.push(Number(d));
    } catch { /* gone */ }
  }
  let max = 0;
  for (const pid of renderers) {
    if (only && !only.has(pid)) continue;
    let p = pid;
    while (p > 1 && p !== process.pid) p = parent.get(p) || 0;
    if (p !== process.pid) continue;
    try {
      const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
      if (m) max = Math.max(max, Number(m[1]) / 1024);
    } catch { /* gone */ }
  }
  return max;
}

// rendererPids lists the chromium renderer processes now running.
function rendererPids() {
  const out = new Set();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try { if (readFileSync(`/proc/${d}/cmdline`, 'utf8').includes('--type=renderer')) out.add(Number(d)); } catch { /* gone */ }
  }
  return out;
}

async function main() {
  rmSync(artifacts, { recursive: true, force: true });
  mkdirSync(artifacts, { recursive: true });
  const dataDir = mkdtempSync(join(tmpdir(), 'postern-e2e-'));
  const log = createWriteStream(join(artifacts, 'postern.log'));
  // Every listener on loopback port 0 (read back from the log): the
  // defaults (e.g. the peering port's 0.0.0.0:3021) may be taken by
  // another cluster on the machine.
  const anyPort = '127.0.0.1:0';
  const daemon = spawn(join(buildDir, 'postern'), [
    'start', '--data-dir', dataDir, '--cluster-name', 'e2e', '--roles', 'auth,proxy,node',
    '--nodename', nodename, '--labels', 'env=e2e,team=web',
    '--node-addr', anyPort, '--ssh-addr', anyPort, '--web-addr', anyPort, '--auth-addr', anyPort,
    '--diag-addr', anyPort, '--tunnel-addr', anyPort, '--peer-addr', anyPort,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  const webAddrP = servingAddr(daemon, 'Web server is serving.');
  webAddrP.catch(() => {}); // awaited below, where its failure is reported
  daemon.stdout.pipe(log);
  daemon.stderr.pipe(log);
  let daemonExited = false;
  daemon.on('exit', () => { daemonExited = true; });

  let tunnelNode;
  let tunnelExited = false;
  const tunnelDir = mkdtempSync(join(tmpdir(), 'postern-e2e-tunnel-'));

  // The leaf cluster starts now, beside the root, so that it is up by
  // the time trust is set up; every one of its ports on loopback too.
  const leafDir = mkdtempSync(join(tmpdir(), 'postern-e2e-leaf-'));
  const leafLog = createWriteStream(join(artifacts, 'postern-leaf.log'));
  const leafDaemon = spawn(join(buildDir, 'postern'), [
    'start', '--data-dir', leafDir, '--cluster-name', leafName, '--roles', 'auth,proxy,node',
    '--nodename', leafNode, '--labels', 'env=e2e,team=leaf',
    '--node-addr', anyPort, '--ssh-addr', anyPort, '--web-addr', anyPort, '--auth-addr', anyPort,
    '--diag-addr', anyPort, '--tunnel-addr', anyPort, '--peer-addr', anyPort,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  leafDaemon.stdout.pipe(leafLog);
  leafDaemon.stderr.pipe(leafLog);
  let leafExited = false;
  leafDaemon.on('exit', () => { leafExited = true; });

  let context;
  let profile;
  let contextB;
  let profileB;
  let contextSSO;
  let profileSSO;
  let oidcop;
  let oidcopExited = false;
  let termHref = '';
  const launchOptions = {
    executablePath: chromiumPath,
    headless: true,
    ignoreHTTPSErrors: true,
    viewport: { width: 1200, height: 800 },
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  };
  try {
    const pctl = (args, input) => execFileSync(join(buildDir, 'pctl'), ['--data-dir', dataDir, ...args],
      { input, stdio: ['pipe', 'pipe', 'pipe'] }).toString();
    await waitFor('postern to start', () => {
      if (daemonExited) throw new Error('postern exited; see e2e/artifacts/postern.log');
      pctl(['users', 'ls']);
      return true;
    });
    const webAddr = await webAddrP;
    const webPort = webAddr.slice(webAddr.lastIndexOf(':') + 1);
    const base = `https://127.0.0.1:${webPort}`;
    pctl(['users', 'add', user, '--logins', login], `${password}\n`);

    // Single sign-on: a real OpenID provider whose one registered
    // redirect URI is this proxy's callback, and the connector naming it.
    const opDir = join(dataDir, 'oidcop');
    mkdirSync(opDir);
    oidcop = spawn(join(buildDir, 'oidc-op'), ['--dir', opDir, '--redirect-url', `${base}/webapi/oidc/callback`],
      { stdio: ['ignore', 'pipe', 'pipe'] });
    oidcop.stderr.pipe(createWriteStream(join(artifacts, 'oidc-op.log')));
    oidcop.on('exit', () => { oidcopExited = true; });
    const op = JSON.parse(await firstLine(oidcop, 'oidc-op'));
    writeFileSync(join(opDir, 'role.yaml'), [
      'kind: role', 'version: v1', 'metadata: {name: sso-dev}', 'spec:',
      `  logins: [${JSON.stringify(login)}]`, '  node_labels: {"*": "*"}', '',
    ].join('\n'));
    pctl(['create', '-f', join(opDir, 'role.yaml')]);
    writeFileSync(join(opDir, 'connector.yaml'), [
      'kind: oidc_connector', 'version: v1', `metadata: {name: ${ssoConnector}}`, 'spec:',
      `  display: ${JSON.stringify(ssoDisplay)}`, `  issuer_url: ${JSON.stringify(op.issuer)}`,
      `  ca_file: ${JSON.stringify(op.ca_file)}`, `  client_id: ${JSON.stringify(op.client_id)}`,
      `  client_secret: ${JSON.stringify(op.client_secret)}`, '  scopes: [email, profile]',
      '  username_claim: email', '  claims_to_roles:', '  - {claim: email, value: "*@example.com", roles: [sso-dev]}', '',
    ].join('\n'));
    pctl(['create', '-f', join(opDir, 'connector.yaml')]);

    // The node behind NAT joins now, so that it is up by the time its
    // step runs; the join command is the one `pctl tokens add` prints.
    const joinCmd = pctl(['tokens', 'add', '--type', 'node']).match(/--token (\S+) --ca-pin (sha256:[0-9a-f]+)/);
    if (!joinCmd) throw new Error('no join command in `pctl tokens add`');
    const tunnelLog = createWriteStream(join(artifacts, 'postern-tunnel.log'));
    tunnelNode = spawn(join(buildDir, 'postern'), [
      'start', '--data-dir', tunnelDir, '--roles', 'node', '--nodename', tunnelName, '--labels', 'env=e2e,team=nat',
      '--proxy-server', `127.0.0.1:${webPort}`, '--token', joinCmd[1], '--ca-pin', joinCmd[2],
      '--diag-addr', anyPort,
    ], { stdio: ['ignore', 'pipe', 'pipe'] });
    tunnelNode.stdout.pipe(tunnelLog);
    tunnelNode.stderr.pipe(tunnelLog);
    tunnelNode.on('exit', () => { tunnelExited = true; });

    profile = mkdtempSync(join(tmpdir(), 'postern-e2e-chromium-'));
    context = await chromium.launchPersistentContext(profile, launchOptions);
    const page = context.pages()[0] || await context.newPage();
    const consoleErrors = [];
    // Each error keeps where it was logged: the drop tests route the
    // terminal socket through Playwright's in-page WebSocket stand-in,
    // and when the test cuts the server side, the stand-in's own inner
    // socket may still be sent to; Chromium logs that against the
    // stand-in's script, not ours. The same message from app.js (our
    // code sending on a closed socket) still fails the run.
    const onConsole = (m) => {
      if (m.type() !== 'error') return;
      const at = m.location() || {};
      const ours = /\/app\.js/.test(at.url || '');
      if (!ours && /WebSocket is already in CLOSING or CLOSED state/.test(m.text())) return;
      // The 404 step loads an unknown path on purpose.
      if (/\/web\/no-such-page$/.test(at.url || '') && /status of 404/.test(m.text())) return;
      consoleErrors.push(`${m.text()} (at ${at.url || 'no script'}:${at.lineNumber ?? '?'})`);
    };
    page.on('console', onConsole);

    await step(page, 'login page loads with a strict CSP', async () => {
      const resp = await page.goto(`${base}/`);
      const csp = resp.headers()['content-security-policy'] || '';
      if (!csp.includes("script-src 'self'")) throw new Error(`CSP is ${JSON.stringify(csp)}`);
      await page.locator('#view-login').waitFor({ state: 'visible' });
    });

    await step(page, 'wrong password is refused', async () => {
      await page.fill('#login-user', user);
      await page.fill('#login-password', 'wrong password');
      await page.click('#login-submit');
      await page.locator('#login-error', { hasText: 'invalid credentials' }).waitFor();
    });

    await step(page, 'log in', async () => {
      await page.fill('#login-password', password);
      await page.click('#login-submit');
      await page.locator('#view-nodes').waitFor({ state: 'visible' });
    });

    await step(page, 'without leaf clusters the cluster picker stays hidden', async () => {
      const clusters = await webapi(page, '/webapi/clusters');
      if (clusters.status !== 200) throw new Error(`/webapi/clusters: ${clusters.status} ${JSON.stringify(clusters.body)}`);
      const names = (clusters.body.items || []).map((c) => `${c.name}${c.local ? '(local)' : ''}`);
      if (names.join(',') !== 'e2e(local)') throw new Error(`/webapi/clusters lists ${names.join(',')}`);
      if (await page.locator('#cluster-picker').isVisible()) throw new Error('the cluster picker is shown without leaves');
    });

    // Trust: a trusted_cluster token on this (root) cluster, a
    // trusted_cluster resource on the leaf naming it, as an operator
    // does; the leaf's tunnel to this proxy comes up while the steps
    // below run.
    const leafPctl = (args, input) => execFileSync(join(buildDir, 'pctl'), ['--data-dir', leafDir, ...args],
      { input, stdio: ['pipe', 'pipe', 'pipe'] }).toString();
    await waitFor('the leaf cluster to start', () => {
      if (leafExited) throw new Error('the leaf exited; see e2e/artifacts/postern-leaf.log');
      leafPctl(['users', 'ls']);
      return true;
    });
    const trustTok = pctl(['tokens', 'add', '--type', 'trusted_cluster']).match(/token: (\S+@sha256:[0-9a-f]{64})\n/);
    if (!trustTok) throw new Error('no token in `pctl tokens add --type trusted_cluster`');
    const trustFile = join(leafDir, 'trusted_cluster.yaml');
    writeFileSync(trustFile, `kind: trusted_cluster\nmetadata: {name: e2e}\nspec:\n  enabled: true\n  proxy_addr: 127.0.0.1:${webPort}\n  token: ${trustTok[1]}\n  role_map: [{remote: access, local: [access]}]\n`, { mode: 0o600 });
    leafPctl(['create', '-f', trustFile]);

    await step(page, 'see the node and search', async () => {
      // The node registers with its first heartbeat, shortly after start.
      await waitFor('the node in the list', async () => {
        if (await page.locator(`tr[data-hostname="${nodename}"]`).count()) return true;
        await page.reload();
        await page.locator('#view-nodes').waitFor({ state: 'visible' });
        return false;
      }, 30000, 1000);
      await page.fill('#node-search', 'team=web');
      await page.locator(`tr[data-hostname="${nodename}"]`).waitFor();
      await page.fill('#node-search', 'no-such-node');
      await page.locator('#nodes-empty', { hasText: 'matches "no-such-node"' }).waitFor({ state: 'visible' });
      await page.fill('#node-search', '');
      await page.locator(`tr[data-hostname="${nodename}"] select.login`).selectOption(login);
    });

    await step(page, 'a phone-sized window (390 px) keeps the node list and the top bar on the page', async () => {
      await page.setViewportSize({ width: 390, height: 800 });
      try {
        const over = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        if (over > 1) {
          const wide = await page.evaluate(() => [...document.querySelectorAll('body *')]
            .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1 && e.offsetParent !== null)
            .slice(0, 5).map((e) => `${e.tagName.toLowerCase()}${e.id ? `#${e.id}` : ''} ${Math.round(e.getBoundingClientRect().right)}`));
          throw new Error(`the page is ${over} px wider than a 390 px window: ${wide.join(', ')}`);
        }
      } finally {
        await page.setViewportSize(launchOptions.viewport);
      }
    });

    await step(page, 'an unknown path is a 404 page, not the node list', async () => {
      const res = await page.goto(new URL('/web/no-such-page', page.url()).href);
      if (res.status() !== 404) throw new Error(`/web/no-such-page: ${res.status()}`);
      await page.locator('#view-notfound', { hasText: 'Page not found' }).waitFor();
      if (await page.locator('#view-nodes').isVisible()) throw new Error('the node list under an unknown path');
      await page.click('#notfound-home');
      await page.locator(`tr[data-hostname="${nodename}"]`).waitFor();
      await page.locator(`tr[data-hostname="${nodename}"] select.login`).selectOption(login);
    });

    await step(page, 'open a terminal from its link', async () => {
      const link = page.locator(`tr[data-hostname="${nodename}"] a.connect`);
      const href = await link.getAttribute('href');
      if (!/^\/web\/cluster\/e2e\/node\/[0-9a-f-]{36}\/[^/]+$/.test(href)) throw new Error(`link ${href}`);
      termHref = href;
      await link.click();
      await page.waitForURL((u) => u.pathname === href);
      await page.locator('#term-status[data-status="connected"]').waitFor({ timeout: 30000 });
      // Generous: root's shell start-up (~/.bashrc) is slow on a loaded CI box.
      await waitFor('a shell prompt', async () => (await rowsText(page)).trim().length > 0, 60000);
    });

    await step(page, 'type a command and read its output', async () => {
      await typeInTerminal(page, 'echo "postern-$((6*7))"\n');
      await waitFor('the output', async () => (await rowsText(page)).includes('postern-42'), 30000);
    });

    await step(page, 'underscores and descenders are visible', async () => {
      // printf's escapes keep the command line itself from matching.
      await typeInTerminal(page, "printf 'a\\137b\\n'; printf 'gy|\\n'\n");
      await waitFor('a_b on the screen', async () => /^a_b$/m.test(await rowsText(page)), 30000);
      await waitFor('gy| on the screen', async () => /^gy\|$/m.test(await rowsText(page)), 30000);
      const underscore = await inkBelowBaseline(page, 'a_b', 1);
      const g = await inkBelowBaseline(page, 'gy|', 0);
      const renderer = await page.locator('#terminal').getAttribute('data-renderer');
      console.log(`     ink below the baseline (${renderer} renderer): '_' ${underscore} px, 'g' ${g} px`);
      if (underscore < 2) throw new Error(`the underscore of a_b is clipped: ${underscore} px of ink under the baseline`);
      if (g < 2) throw new Error(`the descender of g is clipped: ${g} px of ink under the baseline`);
    });

    let before;
    await step(page, 'stty size matches the terminal', async () => {
      before = await sttySize(page, 'SIZE1');
      const [rows, cols] = await page.evaluate(() => [window.posternTerminal.rows, window.posternTerminal.cols]);
      if (before[0] !== rows || before[1] !== cols) throw new Error(`stty size ${before} but xterm is ${rows} ${cols}`);
    });

    await step(page, 'resize the window and see stty size change', async () => {
      await page.setViewportSize({ width: 800, height: 500 });
      await waitFor('xterm to refit', async () => {
        const [rows, cols] = await page.evaluate(() => [window.posternTerminal.rows, window.posternTerminal.cols]);
        return rows < before[0] && cols < before[1];
      }, 10000);
      const after = await sttySize(page, 'SIZE2');
      const [rows, cols] = await page.evaluate(() => [window.posternTerminal.rows, window.posternTerminal.cols]);
      if (after[0] !== rows || after[1] !== cols) throw new Error(`stty size ${after} but xterm is ${rows} ${cols}`);
      if (after[0] >= before[0] || after[1] >= before[1]) throw new Error(`stty size did not shrink: ${before} -> ${after}`);
      console.log(`     stty size ${before.join('x')} -> ${after.join('x')}`);
    });

    await step(page, 'ping latency is shown', async () => {
      await page.locator('#term-latency', { hasText: 'ms' }).waitFor({ timeout: 15000 });
    });

    await step(page, 'reload while top runs: the same shell and screen are back', async () => {
      await typeInTerminal(page, 'clear; echo "PID=$$"\n');
      const pid = await waitFor('the PID', async () => ((await rowsText(page)).match(/^PID=(\d+)$/m) || [])[1]);
      // The marker after top tells when it has exited: top reads keys in
      // batches and resets the tty as it goes, so what is typed before it
      // is gone can be eaten (seen on a loaded machine).
      await typeInTerminal(page, 'top -d 3600; echo "TOP""-EXITED"\n');
      await waitFor('top on the screen', async () => /load average/.test(await rowsText(page)), 30000);
      const before = await stableSnapshot(page);
      const start = Date.now();
      await page.reload();
      await waitFor('the same screen', async () => (await snapshot(page)) === before, 10000, 50);
      const took = Date.now() - start;
      console.log(`     resumed and restored in ${took} ms (${before.length} bytes of serialized screen)`);
      if (took > 2000) throw new Error(`the screen came back after ${took} ms`);
      await page.locator('#term-status[data-status="connected"]').waitFor();
      await typeInTerminal(page, 'q');
      await waitFor('top to exit', async () => /TOP-EXITED/.test(await rowsText(page)));
      await typeInTerminal(page, 'echo "AFTER=$$"\n');
      const after = await waitFor('the PID again', async () => ((await rowsText(page)).match(/^AFTER=(\d+)$/m) || [])[1]);
      if (after !== pid) throw new Error(`shell PID ${after} after the reload, ${pid} before`);
      console.log(`     the same shell (PID ${pid})`);
    });

    await step(page, 'a reload after vim, less and terminal queries types nothing into the shell', async () => {
      // The replay after a reload holds the queries these programs sent
      // (device attributes, status, cursor position, OSC 10/11 colours).
      // They were answered live, to the program that asked; answered
      // again by the new page, the answers reach the shell as typed text
      // ("1RR0;276;0c10;rgb:..." and "command not found").
      // less is started by the same command line, not typed while vim
      // runs: vim reads ahead of ':q!' and drops what it read when it
      // exits, so a command typed behind it could be lost.
      await typeInTerminal(page, 'clear; vim -u NONE -N -n -c "call setline(1, \'IN-VIM\')"; printf "LESS-LINE-%s\\n" 1 2 3 | less\n');
      await waitFor('vim on the screen', async () => /IN-VIM/.test(await rowsText(page)), 15000);
      await typeInTerminal(page, ':q!\n');
      await waitFor('less on the screen', async () => /LESS-LINE-3/.test(await rowsText(page)), 15000);
      await typeInTerminal(page, 'q');
      // A program that asks and reads the answers itself, as vim does.
      await typeInTerminal(page, "printf '\\033[c\\033[>c\\033[5n\\033[6n\\033]10;?\\007\\033]11;?\\007'; read -rs -t 2 -N 1000 ANS; echo \"ANSWERED-${#ANS}\"\n");
      const answered = await waitFor('the query program', async () => ((await rowsText(page)).match(/^ANSWERED-(\d+)$/m) || [])[1], 15000);
      if (Number(answered) === 0) throw new Error('the live terminal answered no query');
      await typeInTerminal(page, 'clear\n');
      await waitFor('a cleared screen', async () => !/ANSWERED-/.test(await rowsText(page)), 15000);
      await page.reload();
      await page.locator('#term-status[data-status="connected"]').waitFor();
      await typeInTerminal(page, 'echo "CLEAN-$((20+22))"\n');
      await waitFor('the command after the reload', async () => /^CLEAN-42$/m.test(await rowsText(page)), 15000);
      // Anything sent after it would be a line of its own by now.
      await typeInTerminal(page, 'echo "CHECK-$((1+2))"\n');
      await waitFor('a second command', async () => /^CHECK-3$/m.test(await rowsText(page)), 15000);
      const text = await rowsText(page);
      if (/command not found|rgb:|\d+;\d+R|\?\d+;\d+c/.test(text)) throw new Error(`the reload typed into the shell:\n${text}`);
      if (!/[#$] echo "CLEAN-\$\(\(20\+22\)\)"$/m.test(text)) throw new Error(`the command line is not what was typed:\n${text}`);
      const dropped = await page.evaluate(() => window.posternTerminalDropped && window.posternTerminalDropped());
      console.log(`     ${answered} answer bytes live; ${dropped} replayed answer bytes not sent (filter: ${await page.locator('#terminal').getAttribute('data-replay-filter')})`);
    });

    await step(page, 'a second tab opens a terminal deep link without a login, and neither tab ends the other', async () => {
      const page2 = await context.newPage();
      try {
        await page2.goto(page.url());
        await page2.locator('#term-status[data-status="connected"]').waitFor({ timeout: 15000 });
        if (await page2.locator('#login-user').isVisible()) throw new Error('the new tab asked for a login');
        await typeInTerminal(page2, 'echo "TAB-$((1+1))"\n');
        await waitFor('the second tab\'s shell', async () => /^TAB-2$/m.test(await rowsText(page2)), 15000);
      } finally {
        await page2.close();
      }
      await typeInTerminal(page, 'echo "FIRST-$((2+1))"\n');
      await waitFor('the first tab still works', async () => /^FIRST-3$/m.test(await rowsText(page)), 15000);
      const again = await webapi(page, '/webapi/nodes');
      if (again.status !== 200) throw new Error(`the first tab's session after the second tab: ${again.status}`);
    });

    await step(page, 'UTF-8 round-trips: the shell has a UTF-8 locale and ✓ 日本 come back as typed', async () => {
      await typeInTerminal(page, 'clear; echo "LANG=$LANG"; printf "%s" "✓日本" | od -An -tx1 | tr -d " \\n"; echo; echo "U=✓日本"\n');
      await waitFor('the echo', async () => /^U=✓日本$/m.test(await rowsText(page)), 15000);
      const text = await rowsText(page);
      const lang = (text.match(/^LANG=(\S*)$/m) || [])[1] || '';
      if (!/utf-?8/i.test(lang)) throw new Error(`the shell's LANG is ${JSON.stringify(lang)}, not a UTF-8 locale`);
      if (!/^e29c93e697a5e69cac$/m.test(text)) throw new Error(`the shell got other bytes than typed:\n${text}`);
      console.log(`     LANG=${lang}`);
    });

    await step(page, 'the DOM renderer shows underscores too', async () => {
      await page.evaluate(() => localStorage.setItem('postern.renderer', 'dom'));
      await page.reload();
      await page.locator('#terminal[data-renderer="dom"]').waitFor();
      await page.locator('#term-status[data-status="connected"]').waitFor();
      await typeInTerminal(page, "clear; printf 'a\\137b\\n'\n");
      await waitFor('a_b on the screen', async () => /^a_b$/m.test(await rowsText(page)), 30000);
      const ink = await inkBelowBaseline(page, 'a_b', 1);
      console.log(`     ink below the baseline (dom renderer): '_' ${ink} px`);
      if (ink < 2) throw new Error(`the underscore is clipped in the DOM renderer: ${ink} px`);
      await page.evaluate(() => localStorage.removeItem('postern.renderer'));
    });

    await step(page, 'offline for 10s: every number once, in order, typing delivered once', async () => {
      const sockets = [];
      page.on('websocket', (ws) => sockets.push(ws.url()));
      await typeInTerminal(page, 'clear; for i in $(seq 1 150); do echo "N=$i"; sleep 0.1; done; echo "COUNT""-DONE"\n');
      await waitFor('the counter', async () => /^N=5$/m.test(await allText(page)), 30000, 50);
      await page.context().setOffline(true);
      // Typed while offline: delivered once when back (bash reads it after
      // the loop).
      await typeInTerminal(page, 'echo "OFF""LINE-$((2+3))"\n');
      await sleep(10000);
      await page.context().setOffline(false);
      await waitFor('the end of the counter', async () => /^COUNT-DONE$/m.test(await allText(page)), 60000);
      await waitFor('the offline command', async () => /^OFFLINE-5$/m.test(await allText(page)), 30000);
      const text = await allText(page);
      const nums = [...text.matchAll(/N=(\d+)/g)].map((m) => Number(m[1]));
      const want = Array.from({ length: 150 }, (_, i) => i + 1);
      if (JSON.stringify(nums) !== JSON.stringify(want)) {
        throw new Error(`counter lines ${nums.length}: ${JSON.stringify(nums.slice(0, 20))}...`);
      }
      const typed = [...text.matchAll(/^OFFLINE-5$/gm)].length;
      if (typed !== 1) throw new Error(`the offline command ran ${typed} times`);
      console.log(`     150 numbers once each; ${sockets.length} new socket(s) while offline and after`);
    });

    await step(page, 'a dropped connection for 10s: resumed, every number once, typing delivered once', async () => {
      // Keystroke echoes may land between counter lines, so numbers are
      // matched anywhere on a line.
      // Chromium's offline mode keeps an established websocket, so the
      // drop is made by routing the terminal socket through Playwright:
      // it is cut, and new sockets are refused for 10s.
      let down = false;
      let live = [];
      let opened = 0;
      await page.routeWebSocket(/\/webapi\/terminal/, (ws) => {
        if (down) { ws.close({ code: 1006 }); return; }
        opened++;
        const server = ws.connectToServer();
        live.push({ ws, server });
      });
      await page.reload(); // the next socket goes through the route
      await page.locator('#term-status[data-status="connected"]').waitFor();
      await typeInTerminal(page, 'clear; for i in $(seq 1 150); do echo "M=$i"; sleep 0.1; done; echo "DROP""-DONE"\n');
      await waitFor('the counter', async () => /^M=5$/m.test(await allText(page)), 30000, 50);
      down = true;
      for (const { ws, server } of live) { server.close(); ws.close({ code: 1006 }); }
      live = [];
      await page.locator('#term-status[data-status="reconnecting"]').waitFor({ timeout: 5000 });
      await typeInTerminal(page, 'echo "DRO""PPED-$((3+4))"\n');
      await sleep(10000);
      down = false;
      await waitFor('the end of the counter', async () => /^DROP-DONE$/m.test(await allText(page)), 60000);
      await waitFor('the command typed while down', async () => /^DROPPED-7$/m.test(await allText(page)), 30000);
      const text = await allText(page);
      const nums = [...text.matchAll(/M=(\d+)/g)].map((m) => Number(m[1]));
      const want = Array.from({ length: 150 }, (_, i) => i + 1);
      if (JSON.stringify(nums) !== JSON.stringify(want)) {
        const miss = want.find((n) => nums.filter((x) => x === n).length !== 1);
        const lines = text.split('\n');
        const at = lines.findIndex((l) => l.includes(`M=${miss - 1}`));
        throw new Error(`counter lines ${nums.length}, first wrong ${miss}, around it: ${JSON.stringify(lines.slice(at - 2, at + 4))}`);
      }
      const typed = [...text.matchAll(/^DROPPED-7$/gm)].length;
      if (typed !== 1) throw new Error(`the command typed while down ran ${typed} times`);
      await page.unrouteAll();
      console.log(`     150 numbers once each across ${opened} sockets`);
    });

    await step(page, 'more than the buffer while disconnected: the screen is restored with a notice', async () => {
      let down = false;
      let live = [];
      await page.routeWebSocket(/\/webapi\/terminal/, (ws) => {
        if (down) { ws.close({ code: 1006 }); return; }
        live.push({ ws, server: ws.connectToServer() });
      });
      await page.reload();
      await page.locator('#term-status[data-status="connected"]').waitFor();
      await typeInTerminal(page, 'sleep 2; seq 1 600000; top -d 3600\n');
      await waitFor('the command to be echoed', async () => /seq 1 600000; top/.test(await rowsText(page)), 15000, 50);
      down = true;
      for (const { ws, server } of live) { server.close(); ws.close({ code: 1006 }); }
      live = [];
      await sleep(10000);
      down = false;
      await page.locator('#term-notice', { hasText: 'scrolled away' }).waitFor({ timeout: 30000 });
      await waitFor('top restored', async () => /load average/.test(await rowsText(page)), 15000);
      const rows = await rowsText(page);
      if (/^\d+$/m.test(rows.split('\n').slice(1).join('\n'))) throw new Error(`seq output on the restored screen:\n${rows}`);
      console.log(`     notice: ${await page.locator('#term-notice').innerText()}`);
      await page.unrouteAll();
      await typeInTerminal(page, 'q');
      await typeInTerminal(page, 'clear; echo "back-$((1+1))"\n');
      await waitFor('the shell after top', async () => /^back-2$/m.test(await rowsText(page)), 15000);
    });

    const resumeOfA = await resumeToken(page);
    await step(page, 'user B with A\'s resume token or deep link is refused and audited', async () => {
      if (!resumeOfA) throw new Error('no resume token in sessionStorage');
      pctl(['users', 'add', userB, '--logins', 'nobody-here'], `${password}\n`);
      profileB = mkdtempSync(join(tmpdir(), 'postern-e2e-chromium-b-'));
      contextB = await chromium.launchPersistentContext(profileB, launchOptions);
      const pageB = contextB.pages()[0] || await contextB.newPage();
      await pageB.goto(page.url()); // A's deep link
      await pageB.fill('#login-user', userB);
      await pageB.fill('#login-password', password);
      await pageB.click('#login-submit');
      // The deep link opens B's own terminal, which B's roles refuse.
      await pageB.locator('#term-error', { hasText: 'not found' }).waitFor({ timeout: 15000 });
      const tokenB = await pageB.evaluate(() => sessionStorage.getItem('postern.token'));
      const res = await tryResume(pageB, tokenB, resumeOfA);
      if (res.code !== 1008 || !/resume refused/.test(res.reason)) throw new Error(`B's resume: ${JSON.stringify(res)}`);
      const audit = await waitFor('the refusal in the audit log', () => {
        const lines = pctl(['events', 'ls', '--type', 'access.denied', '--format', 'json']).trim().split('\n');
        return lines.map((l) => JSON.parse(l)).find((e) => e.user === userB && /resume refused/.test(JSON.stringify(e)));
      }, 15000, 500);
      console.log(`     ${res.code} "${res.reason}"; audit: ${JSON.stringify(audit).slice(0, 160)}`);
      // A's terminal is untouched.
      await typeInTerminal(page, 'echo "still-$((40+2))"\n');
      await waitFor('A still works', async () => /^still-42$/m.test(await rowsText(page)), 15000);
    });

    await step(page, 'the sessions view lists the terminal', async () => {
      await page.click('#nav-sessions');
      await page.locator('#sessions tbody tr').first().waitFor();
      const text = await page.locator('#sessions tbody').innerText();
      if (!text.includes(nodename) || !/detached|attached/.test(text)) throw new Error(`sessions: ${text}`);
      await page.locator('#sessions tbody tr button.resume').first().click();
      await page.locator('#term-status[data-status="connected"]').waitFor();
      await typeInTerminal(page, 'echo "PID=$$"\n');
      try {
        await waitFor('the same shell', async () => /^PID=\d+$/m.test(await rowsText(page)), 15000);
      } catch (err) {
        throw new Error(`${err.message}; the screen reads ${JSON.stringify(await rowsText(page))}`);
      }
    });

    let lastScreen;
    await step(page, 'a recognisable last screen before the session ends', async () => {
      await typeInTerminal(page, "clear; printf 'REC-END-%s\\n' $((6*7)); seq 1 5\n");
      await waitFor('REC-END-42 and the seq', async () => /^REC-END-42$/m.test(await rowsText(page)) && /^5$/m.test(await rowsText(page)), 15000);
      await sleep(500);
      lastScreen = (await rowsText(page)).split('\n').map((l) => l.replace(/\s+$/, '')).filter(Boolean);
    });

    let token;
    let lastResume;
    await step(page, 'logging out ends the open terminal', async () => {
      token = await page.evaluate(() => sessionStorage.getItem('postern.token'));
      lastResume = await resumeToken(page);
      const status = await page.evaluate(async (t) => {
        const r = await fetch('/webapi/sessions', { method: 'DELETE', headers: { Authorization: `Bearer ${t}` } });
        return r.status;
      }, token);
      if (status !== 204) throw new Error(`DELETE /webapi/sessions: ${status}`);
      await page.locator('#term-status[data-status="disconnected"]').waitFor();
      const text = await page.locator('#term-status').innerText();
      if (!/session ended/.test(text)) throw new Error(`status: ${text}`);
    });

    await step(page, 'the websocket is refused after logout', async () => {
      const res = await page.evaluate((t) => new Promise((resolve) => {
        const params = { host: 'e2e-node', login: 'x', cols: 80, rows: 24, cluster: '' };
        const ws = new WebSocket(`wss://${location.host}/webapi/terminal?params=${encodeURIComponent(JSON.stringify(params))}`, 'postern.v1');
        const seen = [];
        ws.onopen = () => ws.send(JSON.stringify({ token: t }));
        ws.onmessage = (ev) => seen.push(typeof ev.data === 'string' ? ev.data : 'binary');
        ws.onclose = (ev) => resolve({ code: ev.code, reason: ev.reason, seen });
      }), token);
      if (res.code !== 1008 || !/log in again/.test(res.reason) || res.seen.length) {
        throw new Error(`websocket: ${JSON.stringify(res)}`);
      }
      console.log(`     closed with ${res.code} "${res.reason}"`);
      // A new web session of the same user cannot use the old resume token:
      // logout ended the terminal.
      const relogin = await page.evaluate(async ([u, p]) => {
        const r = await fetch('/webapi/sessions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ user: u, password: p, otp_token: '' }) });
        return (await r.json()).token;
      }, [user, password]);
      const again = await tryResume(page, relogin, lastResume);
      if (again.code !== 1008 || !/resume refused/.test(again.reason)) throw new Error(`resume after logout: ${JSON.stringify(again)}`);
      await page.click('#term-back');
      await page.locator('#view-login').waitFor({ state: 'visible' });
    });

    let recA;
    await step(page, 'logged out: a notice, not an error; a deep link says where the login leads', async () => {
      await page.goto(`${base}/`);
      await page.locator('#view-nodes').waitFor({ state: 'visible' });
      await page.click('#logout');
      await page.locator('#login-notice', { hasText: 'Logged out.' }).waitFor();
      if ((await page.locator('#login-error').innerText()).trim()) throw new Error('logged out shown as an error');
      await page.goto(`${base}/web/cluster/e2e/node/0d421dfd-4ba4-4028-9165-65ef13f0c62b/${login}`);
      await page.locator('#login-notice', { hasText: `Log in to open a terminal as ${login} on node 0d421dfd` }).waitFor();
      console.log(`     ${await page.locator('#login-notice').innerText()}`);
      // Logged in again for what follows, as the step before left it.
      const status = await page.evaluate(async ([u, p]) => (await fetch('/webapi/sessions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ user: u, password: p, otp_token: '' }) })).status, [user, password]);
      if (status < 200 || status >= 300) throw new Error(`login again: ${status}`);
    });

    await step(page, 'the recordings page lists the session, complete', async () => {
      // From the front page: logging in at the old terminal's URL would
      // open a new terminal there.
      // The login above (relogin) left a live session in this browser:
      // the reloaded tab adopts it instead of asking for a login.
      await page.goto(`${base}/`);
      await page.locator('#view-nodes').waitFor({ state: 'visible' });
      // The node uploads the final chunk within a second or so of the end.
      recA = await waitFor('a complete recording that ends on REC-END-42', async () => {
        await page.click('#nav-recordings');
        await page.locator('#view-recordings').waitFor({ state: 'visible' });
        const rows = await page.locator('#recordings tbody tr').evaluateAll((trs) => trs.map((tr) => ({
          id: tr.dataset.id, state: tr.querySelector('.state').textContent, user: tr.querySelector('.user').textContent,
        })));
        for (const r of rows.filter((r) => r.state === 'complete' && r.user === user)) {
          const file = join(dataDir, `${r.id}.cast`);
          pctl(['recordings', 'export', r.id, '--out', file]);
          const cast = readFileSync(file, 'utf8');
          if (cast.includes('REC-END-')) return { id: r.id, cast };
        }
        await sleep(500);
        return null;
      }, 30000, 0);
    });

    await step(page, 'the exported asciicast plays in asciinema-player and ends on the same screen', async () => {
      await page.evaluate(() => {
        const el = document.createElement('div');
        el.id = 'cast-test';
        document.body.append(el);
      });
      await page.evaluate((cast) => { window.castPlayer = window.posternPlayCast(cast, document.getElementById('cast-test'), { preload: true }); }, recA.cast);
      await waitFor('the cast to load', () => page.evaluate(() => window.castPlayer.getDuration() !== undefined), 15000, 100);
      await page.evaluate(() => window.castPlayer.seek(window.castPlayer.getDuration()));
      const want = lastScreen.join('\n');
      let got;
      try {
        await waitFor('the last screen in the player', async () => {
          got = (await playerScreen(page, '#cast-test')).filter(Boolean);
          // The shell may print one more line (its prompt) after the capture.
          return got.slice(0, lastScreen.length).join('\n') === want && got.length <= lastScreen.length + 1;
        }, 10000, 100);
      } catch (err) {
        throw new Error(`${err.message}\nwant:\n${want}\ngot:\n${(got || []).join('\n')}`);
      }
      console.log(`     ${lastScreen.length} lines match; the cast is ${recA.cast.length} bytes`);
      await page.evaluate(() => { window.castPlayer.dispose(); document.getElementById('cast-test').remove(); });
    });

    await step(page, 'user B cannot list or play A\'s recordings through the web API', async () => {
      const pageB = contextB.pages()[0];
      const tokenB = await pageB.evaluate(() => sessionStorage.getItem('postern.token'));
      const res = await pageB.evaluate(async ([t, id]) => {
        const h = { headers: { Authorization: `Bearer ${t}` } };
        const list = await (await fetch('/webapi/recordings', h)).json();
        const out = { list: list.items.map((i) => i.user) };
        for (const p of ['index', 'segments/0', 'cast', 'markers']) {
          const r = await fetch(`/webapi/recordings/${id}/${p}`, h);
          const miss = await fetch(`/webapi/recordings/00000000-0000-4000-8000-000000000000/${p}`, h);
          out[p] = [r.status, miss.status, (await r.text()).replace(id, 'ID') === (await miss.text()).replace('00000000-0000-4000-8000-000000000000', 'ID')];
        }
        return out;
      }, [tokenB, recA.id]);
      if (res.list.includes(user)) throw new Error(`B lists A's recordings: ${JSON.stringify(res.list)}`);
      for (const p of ['index', 'segments/0', 'cast', 'markers']) {
        const [code, missCode, same] = res[p];
        if (code !== 404 || missCode !== 404 || !same) throw new Error(`B's ${p}: ${JSON.stringify(res[p])}`);
      }
      console.log(`     B's list: ${JSON.stringify(res.list)}; index/segments/cast/markers: 404 like a missing recording`);
    });

    let big;
    let bigPage;
    let bigRenderers;
    await step(page, 'a generated 30-minute, ~100 MB recording opens in the player with its markers', async () => {
      const t0 = Date.now();
      big = execFileSync(join(buildDir, 'genrec'), ['--dir', join(dataDir, 'auth', 'recordings'), '--user', user, '--minutes', '30', '--mb', '110']).toString().trim();
      console.log(`     generated ${big} in ${Date.now() - t0} ms`);
      // A tab of its own, so that its renderer's memory is the player's.
      const before = rendererPids();
      bigPage = await context.newPage();
      bigPage.on('console', onConsole);
      const page = bigPage;
      // A new tab of the logged-in browser adopts its session: no login.
      await page.goto(`${base}/`);
      await page.locator('#view-nodes').waitFor({ state: 'visible' });
      bigRenderers = new Set([...rendererPids()].filter((p) => !before.has(p)));
      const o0 = Date.now();
      await page.goto(`${base}/web/recordings/${big}`);
      try {
        await page.locator('#view-player').waitFor({ state: 'visible' });
      } catch (err) {
        const shown = await page.evaluate(() => [...document.querySelectorAll('section[id^="view-"]:not([hidden])')].map((e) => e.id).join(','));
        throw new Error(`${err.message.split('\n')[0]}; the tab shows ${shown || 'no view'} at ${page.url()}`);
      }
      try {
        await waitFor('the player to load', () => page.evaluate(() => window.posternPlayer && window.posternPlayer.getDuration() !== undefined), 30000, 50);
      } catch (err) {
        throw new Error(`${err.message}; console: ${consoleErrors.slice(-3).join(' | ')}; page: ${await page.locator('#player-error').innerText()}`);
      }
      await page.locator('#player-markers li').nth(6).waitFor({ timeout: 10000 });
      const markers = await page.locator('#player-markers').innerText();
      if (!/checkpoint 5/.test(markers) || !/exit-status 0/.test(markers)) throw new Error(`markers: ${markers}`);
      // The bar draws its markers when the player's UI gets the core's
      // metadata event, which can come after getDuration answers: await it.
      const bar = page.locator('#player .ap-marker-container');
      try {
        await bar.nth(5).waitFor({ state: 'attached', timeout: 10000 });
      } catch {
        throw new Error(`${await bar.count()} markers on the progress bar`);
      }
      // The controls stay on screen: the player fits the room under the
      // toolbar and the verification banner.
      const ctl = await page.locator('#player .ap-control-bar').boundingBox();
      const vh = page.viewportSize().height;
      if (!ctl || ctl.y + ctl.height > vh) throw new Error(`the player's controls are below the fold: ${JSON.stringify(ctl)} in a ${vh} px window`);
      const onBar = await bar.count();
      console.log(`     opened in ${Date.now() - o0} ms; ${onBar} markers on the timeline`);
    });

    await step(page, 'seeking to 90% shows the right screen within 1s and the tab stays under 300 MB', async () => {
      const page = bigPage;
      const res = await page.evaluate(async () => {
        const p = window.posternPlayer;
        const lines = () => [...document.querySelectorAll('#player .ap-term-text .ap-line')].map((l) => l.textContent.trim()).filter(Boolean);
        const start = performance.now();
        await p.seek('90%');
        const t = p.getCurrentTime();
        const k = String(Math.floor(t * 10 + 1e-6)).padStart(6, '0');
        for (;;) {
          const ls = lines();
          if (ls.length >= 20 && ls.every((l) => l.startsWith(`k=${k} `))) break;
          if (performance.now() - start > 5000) return { error: `screen after 5s (k=${k}): ${JSON.stringify(ls.slice(-3))}` };
          await new Promise((r) => requestAnimationFrame(r));
        }
        const took = performance.now() - start;
        const fetched = performance.getEntriesByType('resource').filter((e) => e.name.includes('/segments/') && e.startTime >= start)
          .map((e) => `${e.name.replace(/.*\/segments\//, '')} ${e.duration.toFixed(0)} ms ${(e.encodedBodySize / 1048576).toFixed(1)} MB`);
        return { fetched, took, t, duration: p.getDuration(), k, heap: performance.memory ? performance.memory.usedJSHeapSize / 1048576 : -1 };
      });
      if (res.error) throw new Error(res.error);
      const rss = rendererRSS(bigRenderers.size ? bigRenderers : null);
      console.log(`     ${bigRenderers.size ? 'the tab\'s own renderer' : 'no renderer of its own: the largest one'}`);
      console.log(`     segments fetched: ${res.fetched.join(', ')}`);
      console.log(`     seek to ${res.t.toFixed(1)}s of ${res.duration.toFixed(1)}s: screen of tick ${res.k} in ${res.took.toFixed(0)} ms; JS heap ${res.heap.toFixed(1)} MB, renderer RSS ${rss.toFixed(0)} MB`);
      if (Math.abs(res.t - 0.9 * res.duration) > 1) throw new Error(`seeked to ${res.t}`);
      if (res.took > 1000) throw new Error(`the screen took ${res.took} ms`);
      if (res.heap > 300 || rss > 300) throw new Error(`memory: heap ${res.heap} MB, RSS ${rss} MB`);
    });

    await step(page, 'a node behind NAT: listed as a tunnel node, its terminal works', async () => {
      await page.click('#nav-nodes');
      await page.locator('#view-nodes').waitFor({ state: 'visible' });
      const row = page.locator(`tr[data-hostname="${tunnelName}"]`);
      await waitFor('the tunnel node in the list', async () => {
        if (tunnelExited) throw new Error('the tunnel node exited; see e2e/artifacts/postern-tunnel.log');
        if (await row.count()) return true;
        await page.reload();
        await page.locator('#view-nodes').waitFor({ state: 'visible' });
        return false;
      }, 30000, 1000);
      const addr = (await row.locator('td.addr').innerText()).trim();
      if (addr !== '(tunnel)') throw new Error(`address column of the tunnel node: ${JSON.stringify(addr)}`);
      const uuid = (await row.locator('td.uuid').innerText()).trim();
      await row.locator('select.login').selectOption(login);
      await row.locator('a.connect').click();
      await page.waitForURL((u) => u.pathname.includes(`/node/${uuid}/`));
      await page.locator('#term-status[data-status="connected"]').waitFor({ timeout: 30000 });
      await waitFor('a shell prompt', async () => (await rowsText(page)).trim().length > 0, 60000);
      // The host UUID proves the shell runs on the tunnel node.
      await typeInTerminal(page, 'echo "tunnel-$((6*7)) $SSH_POSTERN_HOST_UUID"\n');
      await waitFor('the output', async () => (await rowsText(page)).split('\n').some((l) => l.trim() === `tunnel-42 ${uuid}`), 30000);
    });

    await step(page, 'a leaf cluster: picked in the cluster picker, its node listed, its terminal works', async () => {
      await page.click('#nav-nodes');
      await page.locator('#view-nodes').waitFor({ state: 'visible' });
      await waitFor('the leaf in the cluster picker', async () => {
        if (leafExited) throw new Error('the leaf exited; see e2e/artifacts/postern-leaf.log');
        if (await page.locator(`#cluster-select option[value="${leafName}"]:not([data-status="offline"])`).count()) return true;
        await page.reload();
        await page.locator('#view-nodes').waitFor({ state: 'visible' });
        return false;
      }, 30000, 1000);
      await page.locator('#cluster-picker').waitFor({ state: 'visible' });
      const local = await page.locator('#cluster-select option').first().innerText();
      if (local.trim() !== 'e2e') throw new Error(`the first cluster is ${JSON.stringify(local)}, not the local one`);
      await page.locator('#cluster-select').selectOption(leafName);
      const row = page.locator(`tr[data-hostname="${leafNode}"]`);
      await waitFor('the leaf node in the list', async () => {
        if (await row.count()) return true;
        await page.reload();
        await page.locator('#view-nodes').waitFor({ state: 'visible' });
        return false;
      }, 30000, 1000);
      if (await page.locator(`tr[data-hostname="${nodename}"]`).count()) throw new Error('the root\'s node is listed under the leaf');
      const uuid = (await row.locator('td.uuid').innerText()).trim();
      await row.locator('select.login').selectOption(login);
      const href = await row.locator('a.connect').getAttribute('href');
      const want = `/web/cluster/${leafName}/node/${uuid}/${encodeURIComponent(login)}`;
      if (href !== want) throw new Error(`link ${href}, want ${want}`);
      await row.locator('a.connect').click();
      await page.waitForURL((u) => u.pathname === want);
      await page.locator('#term-status[data-status="connected"]').waitFor({ timeout: 30000 });
      await waitFor('a shell prompt', async () => (await rowsText(page)).trim().length > 0, 60000);
      await typeInTerminal(page, 'echo "leaf-$((6*7)) $SSH_POSTERN_CLUSTER_NAME $SSH_POSTERN_HOST_UUID"\n');
      await waitFor('the output', async () => (await rowsText(page)).split('\n').some((l) => l.trim() === `leaf-42 ${leafName} ${uuid}`), 30000);
      // Back to the list: the picked leaf is still the one shown.
      await page.click('#term-back');
      await row.waitFor();
      // An unknown cluster is one plain error, no list.
      const res = await webapi(page, '/webapi/nodes?cluster=nope');
      if (res.status !== 404 || !/cluster "nope" not found/.test(res.body.error || '')) throw new Error(`/webapi/nodes?cluster=nope: ${res.status} ${JSON.stringify(res.body)}`);
      // A terminal link into an unknown cluster says so plainly.
      await page.goto(`${base}/web/cluster/nope/node/${uuid}/${encodeURIComponent(login)}`);
      await page.locator('#term-error', { hasText: 'cluster "nope" not found' }).waitFor({ timeout: 15000 });
      await page.click('#term-back');
      await row.waitFor();
      await page.locator('#cluster-select').selectOption('');
      await page.locator(`tr[data-hostname="${nodename}"]`).waitFor();
    });

    await step(page, 'single sign-on: a deep link, "Sign in with ...", the provider\'s own login page, and the terminal opens', async () => {
      if (!termHref) throw new Error('no terminal link from the earlier step');
      profileSSO = mkdtempSync(join(tmpdir(), 'postern-e2e-chromium-sso-'));
      contextSSO = await chromium.launchPersistentContext(profileSSO, launchOptions);
      const pageS = contextSSO.pages()[0] || await contextSSO.newPage();
      const errorsS = [];
      // Ours only: the provider's pages are not (its login page asks for
      // a favicon it has not). The adoption attempt before the login is
      // a 401, as in the main run.
      pageS.on('console', (m) => {
        const at = (m.location() || {}).url || '';
        if (m.type() === 'error' && at.startsWith(base) && !/status of 401/.test(m.text())) errorsS.push(`${m.text()} (at ${at})`);
      });
      await pageS.goto(`${base}${termHref}`);
      const button = pageS.locator('a.sso-button', { hasText: `Sign in with ${ssoDisplay}` });
      await button.waitFor({ timeout: 15000 });
      const href = new URL(await button.getAttribute('href'), base);
      if (href.searchParams.get('return_to') !== termHref) throw new Error(`the button returns to ${href.searchParams.get('return_to')}`);
      await button.click();
      // The example OP's own login form, on its own origin.
      await pageS.waitForURL((u) => u.origin !== base, { timeout: 15000 });
      await pageS.locator('input[name="username"]').fill(ssoUser);
      await pageS.locator('input[name="password"]').fill(ssoPassword);
      await Promise.all([
        pageS.waitForURL((u) => u.origin === base && u.pathname === termHref, { timeout: 30000 }),
        pageS.locator('input[name="password"]').press('Enter'),
      ]);
      await pageS.locator('#term-status[data-status="connected"]').waitFor({ timeout: 30000 });
      await waitFor('the SSO user\'s name', async () => (await pageS.locator('#whoami').textContent()) === ssoEmail, 15000);
      await waitFor('a shell prompt', async () => (await rowsText(pageS)).trim().length > 0, 60000);
      await typeInTerminal(pageS, 'echo "sso-$SSH_POSTERN_USER-$((6*7))"\n');
      await waitFor('the SSO user in the shell', async () => (await rowsText(pageS)).includes(`sso-${ssoEmail}-42`), 30000);
      const audit = pctl(['events', 'ls', '--type', 'auth.login', '--format', 'json']);
      if (!audit.includes(ssoEmail)) throw new Error('no auth.login event for the SSO user');
      await pageS.screenshot({ path: join(artifacts, 'sso-terminal.png') }).catch(() => {});
      if (errorsS.length) throw new Error(`console errors: ${errorsS.join('; ')}`);
      await contextSSO.close();
      contextSSO = null;
    });

    await step(page, 'single sign-on: the provider\'s answer replayed is told to start again, escaped', async () => {
      const resp = await page.request.get(`${base}/webapi/oidc/callback?state=${encodeURIComponent('<b>x</b>')}&code=c`, { maxRedirects: 0 });
      const body = await resp.text();
      if (resp.status() !== 400 || !/already used or has expired: start again/.test(body) || /<b>x/.test(body)) {
        throw new Error(`${resp.status()}: ${body.slice(0, 300)}`);
      }
    });

    await step(page, 'no console errors', async () => {
      // The refused login's 401 is logged by chromium as a failed resource load.
      const real = consoleErrors.filter((e) => !/status of 401/.test(e));
      if (real.length) throw new Error(real.join('\n'));
    });
  } catch (err) {
    steps.failed++;
    console.log(`FAIL setup: ${err.message}`);
  } finally {
    if (context) await context.close().catch(() => {});
    if (contextB) await contextB.close().catch(() => {});
    if (contextSSO) await contextSSO.close().catch(() => {});
    if (profileSSO) rmSync(profileSSO, { recursive: true, force: true });
    if (oidcop && !oidcopExited) oidcop.kill('SIGTERM');
    if (profileB) rmSync(profileB, { recursive: true, force: true });
    if (profile) rmSync(profile, { recursive: true, force: true });
    if (tunnelNode && !tunnelExited) {
      tunnelNode.kill('SIGTERM');
      await waitFor('the tunnel node to exit', () => tunnelExited, 15000).catch(() => tunnelNode.kill('SIGKILL'));
    }
    if (!process.env.E2E_KEEP) rmSync(tunnelDir, { recursive: true, force: true });
    if (!leafExited) {
      leafDaemon.kill('SIGTERM');
      await waitFor('the leaf to exit', () => leafExited, 15000).catch(() => leafDaemon.kill('SIGKILL'));
    }
    if (!process.env.E2E_KEEP) rmSync(leafDir, { recursive: true, force: true });
    daemon.kill('SIGTERM');
    await waitFor('postern to exit', () => daemonExited, 15000).catch(() => daemon.kill('SIGKILL'));
    if (!process.env.E2E_KEEP) rmSync(dataDir, { recursive: true, force: true });
  }
  process.exit(steps.summary());
}

main();
