// The browser's half of `psh login --auth web`, driven by the Go
// integration test (integration/weblogin_test.go), which runs the real
// psh binary and hands this script the URL psh printed. Debian's chromium
// through playwright-core, with Chromium's virtual authenticator (CDP
// WebAuthn domain) as the user's passkey:
//
//  1. the user, who has no second factor while the cluster requires a
//     passkey, logs in with the password into a register-only session
//     and registers a passkey;
//  2. opens psh's URL, logs in with password and passkey, approves, and
//     the browser takes the sealed result to psh's loopback listener.
//
// With SESSION_URL_FROM_STDIN set, it then reads a URL from stdin (psh
// ssh's page for a require_session_mfa node) and confirms that session
// with the same passkey.
//
// Environment: BASE (https://localhost:PORT), PSH_URL, LOGIN_USER,
// LOGIN_PASSWORD, CHROMIUM (default /usr/bin/chromium), ARTIFACTS (a
// directory for a screenshot when a step fails). Prints one line per
// step and exits non-zero on the first failure.
import { chromium } from 'playwright-core';
import { join } from 'node:path';

const { BASE: base, PSH_URL: pshURL, LOGIN_USER: user, LOGIN_PASSWORD: password } = process.env;
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';

// readLine reads one line of stdin.
function readLine() {
  return new Promise((resolve, reject) => {
    let buf = '';
    const on = (d) => {
      buf += d.toString();
      const i = buf.indexOf('\n');
      if (i >= 0) { process.stdin.off('data', on); process.stdin.pause(); resolve(buf.slice(0, i).trim()); }
    };
    process.stdin.on('data', on);
    process.stdin.once('end', () => reject(new Error('stdin ended before a URL')));
  });
}

async function main() {
  const browser = await chromium.launch({
    executablePath: chromiumPath, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const ctx = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await ctx.newPage();
  page.setDefaultTimeout(20000);
  let stepName = 'start';
  try {
    stepName = 'register a passkey in a register-only session';
    await page.goto(base);
    const cdp = await ctx.newCDPSession(page);
    await cdp.send('WebAuthn.enable', { enableUI: false });
    await cdp.send('WebAuthn.addVirtualAuthenticator', {
      options: {
        protocol: 'ctap2', transport: 'internal', hasResidentKey: true, hasUserVerification: true,
        isUserVerified: true, automaticPresenceSimulation: true,
      },
    });
    await page.fill('#login-user', user);
    await page.fill('#login-password', password);
    await page.click('#login-submit');
    await page.waitForSelector('#account-notice:not([hidden])');
    await page.fill('#passkey-name', 'laptop');
    await page.click('#passkey-add');
    await page.waitForFunction(() => document.querySelector('#login-notice').textContent.includes('Passkey registered'));
    console.log(`ok   ${stepName}`);

    stepName = "log in on psh's page with password and passkey, and approve";
    await page.goto(pshURL);
    await page.waitForSelector('#view-login:not([hidden])');
    const notice = await page.textContent('#login-notice');
    if (!notice.includes('psh')) throw new Error(`the login page does not say it is for psh: "${notice}"`);
    await page.waitForSelector('#login-passkey:not([hidden])');
    await page.fill('#login-user', user);
    await page.fill('#login-password', password);
    await page.click('#login-passkey');
    await page.waitForSelector('#view-cli:not([hidden])');
    await page.click('#cli-approve');
    await page.waitForURL(/^http:\/\/127\.0\.0\.1:\d+\/callback\?response=/);
    const body = await page.textContent('body');
    if (!body.includes('Logged in, you can close this tab')) throw new Error(`psh's page says: ${body}`);
    console.log(`ok   ${stepName}`);

    if (process.env.SESSION_URL_FROM_STDIN) {
      // psh ssh to a require_session_mfa node, confirmed with the same
      // passkey: the test starts it now and sends the page's URL.
      stepName = "confirm psh ssh's session with the passkey";
      const sessionURL = await readLine();
      await page.goto(sessionURL);
      // The browser's session (of the psh login above) is adopted: the
      // passkey asked next is the session's fresh factor, not a login.
      await page.waitForSelector('#view-cli:not([hidden]), #view-login:not([hidden])');
      if (await page.isVisible('#view-login')) {
        await page.fill('#login-user', user);
        await page.fill('#login-password', password);
        await page.click('#login-passkey');
      }
      await page.waitForSelector('#cli-session-text:not([hidden])');
      await page.click('#cli-approve');
      await page.waitForURL(/^http:\/\/127\.0\.0\.1:\d+\/callback\?response=/);
      const done = await page.textContent('body');
      if (!done.includes('Logged in, you can close this tab')) throw new Error(`psh's page says: ${done}`);
      console.log(`ok   ${stepName}`);
    }
  } catch (err) {
    console.log(`FAIL ${stepName}: ${err.message}`);
    if (process.env.ARTIFACTS) {
      try { await page.screenshot({ path: join(process.env.ARTIFACTS, 'pshweblogin-failure.png') }); } catch { /* gone */ }
    }
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
  // stdin may still be open (the test's pipe): do not wait for it.
  process.exit(process.exitCode || 0);
}

main();
