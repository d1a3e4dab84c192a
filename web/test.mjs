// The browser test: the demo page in real headless Chromium (WebGPU on SwiftShader), checked
// against the native binary.
//
//   web/build.sh && cargo build --release && node web/test.mjs
//
// Starts its own static server on a free localhost port, launches /usr/bin/chromium through
// playwright-core with a fresh profile and no network, and checks:
//   - a browser without WebGPU gets the clear message (navigator.gpu removed by an init script);
//   - with WebGPU: the adapter is shown and the wasm GPU self-check (through dynrt's Engine)
//     passes, with no console errors;
//   - the decode demo, per policy, with a fixed seed: tokens equal the native
//     `dynrt demo --json` tokens for the same arguments, max error within tolerance, the
//     reallocation counts order the policies as the native run does, the chart rendered;
// and saves a screenshot to $CARGO_TARGET_DIR/web-demo.png (default target/).
// Environment: DYNRT_WEB_STEPS (default 24), DYNRT_WEB_SEED (default 7),
// CHROMIUM (default /usr/bin/chromium). Exits non-zero when any check fails.
import { chromium } from 'playwright-core';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { serve } from './serve.mjs';

const webDir = dirname(fileURLToPath(import.meta.url));
const repoDir = resolve(webDir, '..');
const targetDir = resolve(repoDir, process.env.CARGO_TARGET_DIR ?? 'target');
const nativeBin = join(targetDir, 'release', 'dynrt');
const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';
const steps = Number(process.env.DYNRT_WEB_STEPS ?? 24);
const seed = Number(process.env.DYNRT_WEB_SEED ?? 7);
const POLICIES = ['none', 'reference', 'adaptive'];
// The page and the native binary run the same f32 kernels (WGSL) on different GPUs
// (SwiftShader vs lavapipe/llvmpipe), each checked against the same f64-free CPU reference.
const MAX_ABS_ERR = 1e-3;

let passed = 0;
let failed = 0;
function check(name, ok, detail = '') {
  if (ok) passed += 1;
  else failed += 1;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}${detail ? `: ${detail}` : ''}`);
  return ok;
}

function nativeDemo(policy) {
  const args = ['demo', '--json', '--seed', String(seed), '--steps', String(steps), '--policy', policy];
  const out = execFileSync(nativeBin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 300_000 });
  return JSON.parse(out);
}

/** Whether the native binary has the decode demo (until the runtime lands it has no --json). */
function nativeHasDemo() {
  const help = execFileSync(nativeBin, ['demo', '--help'], { encoding: 'utf8', timeout: 60_000 });
  return help.includes('--json');
}

const CHROMIUM_ARGS = [
  '--no-sandbox',
  '--enable-unsafe-webgpu',
  '--disable-gpu-sandbox',
  // Keep the browser off the network: no updates, sync, safe-browsing lists, field trials.
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-default-apps',
  '--disable-domain-reliability',
  '--disable-field-trial-config',
  '--disable-quic',
  '--no-first-run',
  '--no-default-browser-check',
  '--metrics-recording-only',
  '--safebrowsing-disable-auto-update',
];

async function main() {
  const pkgBuilt = existsSync(join(webDir, 'pkg', 'dynrt.js'));
  if (!check('wasm package built (web/pkg/dynrt.js)', pkgBuilt, pkgBuilt ? '' : 'run web/build.sh first')) return;
  const haveChromium = existsSync(chromiumPath);
  if (!check(`chromium at ${chromiumPath}`, haveChromium, haveChromium ? '' : 'apt-get install chromium, or set CHROMIUM')) return;

  const server = await serve(webDir, 0);
  const url = `http://localhost:${server.address().port}/`;
  const profile = mkdtempSync(join(tmpdir(), 'dynrt-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1100, height: 1000 },
  });
  // Anything the page tries to fetch from outside localhost is a bug (and would hang offline).
  await context.route(/^(?!http:\/\/localhost:).*/, (route) => {
    const u = route.request().url();
    if (u.startsWith('data:') || u.startsWith('blob:')) return route.continue();
    check('page stays on localhost', false, u);
    return route.abort();
  });
  try {
    await testNoWebGpu(context, url);
    await testWithWebGpu(context, url);
  } finally {
    await context.close();
    server.close();
    rmSync(profile, { recursive: true, force: true });
  }
}

async function testNoWebGpu(context, url) {
  const page = await context.newPage();
  // A browser without WebGPU: remove the API before the page's scripts run.
  await page.addInitScript(() => {
    delete Navigator.prototype.gpu;
  });
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById('gpu-status').dataset.state !== 'pending', null, { timeout: 30_000 });
  const state = await page.$eval('#gpu-status', (el) => el.dataset.state);
  const text = await page.$eval('#gpu-status', (el) => el.textContent);
  check('no WebGPU: clear message on the page', state === 'error' && text.includes('no WebGPU'), `${state}: ${text.trim().slice(0, 120)}`);
  check('no WebGPU: run button stays disabled', await page.$eval('#run', (b) => b.disabled));
  await page.close();
}

async function testWithWebGpu(context, url) {
  const page = await context.newPage();
  const consoleErrors = [];
  page.on('console', (m) => {
    if (m.type() === 'error') consoleErrors.push(m.text());
  });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById('gpu-status').dataset.state !== 'pending', null, { timeout: 120_000 });
  const status = await page.$eval('#gpu-status', (el) => ({ state: el.dataset.state, text: el.textContent }));
  console.log(`     page says: ${status.text.trim()}`);
  check('WebGPU adapter found and dynrt device opened', status.state === 'ok', status.text.trim());
  const selfCheck = await page.evaluate(() => document.body.dataset.selfCheck);
  check('GPU self-check in wasm passed', selfCheck === 'true', `self_check=${selfCheck}`);

  const runState = await page.$eval('#run-state', (el) => el.dataset.state);
  const pageHasDemo = runState !== 'unavailable';
  const nativeDemoAvailable = existsSync(nativeBin) && nativeHasDemo();
  if (!pageHasDemo && !nativeDemoAvailable) {
    console.log('     (decode demo checks not run: neither the wasm build nor the native binary has the decode demo yet)');
  } else if (check('decode demo present in both builds', pageHasDemo && nativeDemoAvailable, `page=${pageHasDemo} native=${nativeDemoAvailable} (${nativeBin})`)) {
    await testDemo(page);
  }
  check('no console errors', consoleErrors.length === 0, consoleErrors.slice(0, 3).join(' | '));

  mkdirSync(targetDir, { recursive: true });
  const shot = join(targetDir, 'web-demo.png');
  await page.screenshot({ path: shot, fullPage: true });
  console.log(`     screenshot: ${shot}`);
  await page.close();
}

async function runOnPage(page, policy) {
  await page.fill('#steps', String(steps));
  await page.fill('#seed', String(seed));
  await page.selectOption('#policy', policy);
  await page.click('#run');
  await page.waitForFunction(() => ['done', 'error'].includes(document.getElementById('run-state').dataset.state), null, { timeout: 300_000 });
  const state = await page.$eval('#run-state', (el) => ({ state: el.dataset.state, text: el.textContent }));
  if (!check(`page run (${policy}) finished`, state.state === 'done', state.text)) return null;
  const report = JSON.parse(await page.$eval('#result-json', (el) => el.textContent));
  const chart = await page.$eval('#chart', (el) => ({
    points: Number(el.dataset.points),
    marks: Number(el.dataset.reallocMarks),
    series: el.querySelectorAll('path.series').length,
  }));
  return { report, chart };
}

async function testDemo(page) {
  const web = {};
  const native = {};
  for (const policy of POLICIES) {
    native[policy] = nativeDemo(policy);
    const got = await runOnPage(page, policy);
    if (!got) continue;
    web[policy] = got.report;
    const n = native[policy];
    const w = got.report;
    check(`${policy}: ${w.tokens.length} tokens equal the native run's`, w.tokens.length === n.tokens.length && w.tokens.every((t, i) => t === n.tokens[i]),
      `web [${w.tokens.slice(0, 8)}…] native [${n.tokens.slice(0, 8)}…]`);
    check(`${policy}: tokens non-trivial (${steps} requested)`, w.tokens.length === steps && new Set(w.tokens).size > 1, `distinct=${new Set(w.tokens).size}`);
    check(`${policy}: max |error| vs CPU reference within ${MAX_ABS_ERR}`, Number.isFinite(w.max_abs_err) && w.max_abs_err <= MAX_ABS_ERR, `web ${w.max_abs_err} native ${n.max_abs_err}`);
    // Reallocations must match. Total allocations may not: the browser has no usm_shared
    // (no MAPPABLE_PRIMARY_BUFFERS in WebGPU), so inputs and outputs go through usm_host
    // staging buffers there, which are allocations too.
    check(`${policy}: reallocations equal the native run's`, w.reallocations === n.reallocations,
      `web ${w.reallocations} native ${n.reallocations} (allocations: web ${w.allocations} native ${n.allocations})`);
    check(`${policy}: chart rendered`, got.chart.points === steps && got.chart.series > 0 && got.chart.marks > 0,
      `points=${got.chart.points} series=${got.chart.series} marks=${got.chart.marks}`);
  }
  if (POLICIES.every((p) => web[p])) {
    const r = Object.fromEntries(POLICIES.map((p) => [p, web[p].reallocations]));
    // Preallocation exists to cut reallocations of growing buffers: exact sizes (none) must
    // reallocate most, and adaptive must not do worse than the reference rule.
    check('reallocations: none > reference >= adaptive', r.none > r.reference && r.reference >= r.adaptive, JSON.stringify(r));
  }
}

try {
  await main();
} catch (e) {
  check('test ran to completion', false, e?.stack ?? String(e));
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
