// The pieces every e2e script shares: waiting on a condition, reading a
// `postern start` child's listener addresses from its log, and running
// steps that stop at the first failure (later steps build on earlier ones)
// with a screenshot each, ending in the `N passed, N failed` line `make e2e`
// reads.
import { join } from 'node:path';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// waitFor polls fn until it returns something truthy: a condition awaited,
// never a fixed sleep. The last error fn threw is in the timeout's message.
export async function waitFor(what, fn, timeoutMs = 30000, everyMs = 200) {
  const end = Date.now() + timeoutMs;
  let last;
  while (Date.now() < end) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) { last = err; }
    await sleep(everyMs);
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${last.message}` : ''}`);
}

// servingAddr resolves to the address a `postern start` child logs for
// one of its listeners ("Web server is serving." addr=...). Every
// listener binds port 0: a port picked here and released could be taken
// meanwhile (by any process's outgoing connection, too) before the
// daemon binds it.
export function servingAddr(child, msg) {
  const re = new RegExp(`msg="${msg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}"[^\n]*? addr="?([0-9a-f.:\\[\\]]+)"?`);
  return new Promise((res, rej) => {
    let buf = '';
    const on = (d) => {
      buf += d.toString();
      const m = buf.match(re);
      if (m) {
        child.stdout.off('data', on);
        child.stderr.off('data', on);
        res(m[1]);
      } else if (buf.length > 1 << 20) buf = buf.slice(-65536);
    };
    child.stdout.on('data', on);
    child.stderr.on('data', on);
    child.once('exit', () => rej(new Error(`postern exited before logging "${msg}"`)));
  });
}

// Steps counts passed and failed steps. After the first failure the rest
// are counted as failed without running: they depend on what failed, and
// their own errors would only bury the first one.
export class Steps {
  constructor(artifacts, prefix = '') {
    this.artifacts = artifacts;
    this.prefix = prefix;
    this.passed = 0;
    this.failed = 0;
    this.broken = null;
  }

  async step(page, name, fn) {
    const n = this.passed + this.failed + 1;
    const shot = join(this.artifacts, `${this.prefix}${String(n).padStart(2, '0')}-${name.replace(/[^a-z0-9]+/gi, '-').toLowerCase()}.png`);
    if (this.broken) {
      this.failed++;
      console.log(`FAIL ${name}: skipped after "${this.broken}" failed`);
      return;
    }
    const start = Date.now();
    try {
      await fn();
      this.passed++;
      console.log(`ok   ${name} (${Date.now() - start} ms)`);
    } catch (err) {
      this.failed++;
      this.broken = name;
      console.log(`FAIL ${name}: ${err.message}`);
    }
    try { await page.screenshot({ path: shot }); } catch { /* browser gone */ }
  }

  // summary prints the last line and gives the exit status.
  summary() {
    console.log(`${this.passed} passed, ${this.failed} failed`);
    return this.failed ? 1 : 0;
  }
}
