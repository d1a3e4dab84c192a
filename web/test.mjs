// The browser test: the page in real headless Chromium (WebGPU on SwiftShader), checked
// against the native binary.
//
//   web/build.sh && cargo build --release && cargo run --release -- fetch && node web/test.mjs
//
// Starts its own static server on a free localhost port (serving the model cache under
// /models/), launches /usr/bin/chromium through playwright-core with a fresh profile and no
// network, and checks:
//   - a browser without WebGPU gets the clear message (navigator.gpu removed by an init script);
//   - a failed model download (the server answering 404) is an error on the page;
//   - an adapter with storage bindings of 16 MiB (loads: tables in pieces) and one too small
//     for the model (512 KiB, reported by the
//     browser's limits objects) is an error on the page that names the weight;
//   - with WebGPU, on a device with WebGPU's default limits (256 MiB buffers, 128 MiB storage
//     bindings; see capLimits): the adapter is shown and the wasm GPU self-check (through
//     dynrt's Engine) passes;
//   - SmolLM2: the page downloads the GGUF (progress bar to the full size), loads it with
//     the weights in their block formats, generates greedily for a fixed prompt, and its
//     tokens equal the native `dynrt generate --json` run's for the same prompt, max tokens
//     and policy; the streamed text equals the final text; both memory charts rendered;
//   - the decode demo, per policy, with a fixed seed: tokens equal the native
//     `dynrt demo --json` tokens for the same arguments, max error within tolerance, the
//     reallocation counts order the policies as the native run does, the chart rendered;
//   - no console errors;
//   - Gemma 3 270M (when fetched; required with DYNRT_REQUIRE_MODEL/GPU), chosen with
//     ?model=: loads at WebGPU's default limits (its 170 MiB embedding in row pieces), weights
//     within 1.03x of the file's, the chat box off (a base model), and 8 greedy tokens of a
//     raw prompt equal the native run's;
//   - the live charts of `dynrt serve` (the native server on SmolLM2, its page at /): while
//     three chats run on 6 MiB of KV pools the page lists the active requests, then shows
//     none active, with no console errors;
//   - the search page (web/search.html, when all-minilm-l6-v2 is fetched; required with
//     DYNRT_REQUIRE_MODEL/GPU): all-MiniLM-L6-v2 from its sentence-transformers folder ranks
//     sentences against a query; its vectors equal the native `dynrt embed` run's within
//     cosine 0.9999 and the ranking is the same;
// and saves screenshots to $CARGO_TARGET_DIR/web-llm.png, web-demo.png,
// web-serve-dashboard.png and web-search.png (default target/).
// Environment: DYNRT_WEB_STEPS (default 24), DYNRT_WEB_SEED (default 7) for the demo;
// DYNRT_WEB_PROMPT (default "What is the capital of France?", in the chat template),
// DYNRT_WEB_TOKENS (default 16), DYNRT_WEB_POLICY (default adaptive) for SmolLM2;
// CHROMIUM (default /usr/bin/chromium). Without the fetched model the SmolLM2 checks are
// skipped, unless DYNRT_REQUIRE_MODEL=1 or DYNRT_REQUIRE_GPU=1 (then they fail).
// Exits non-zero when any check fails.
import { chromium } from 'playwright-core';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, mkdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { serve } from './serve.mjs';

const webDir = dirname(fileURLToPath(import.meta.url));
const repoDir = resolve(webDir, '..');
const targetDir = resolve(repoDir, process.env.CARGO_TARGET_DIR ?? 'target');
const nativeBin = join(targetDir, 'release', 'dynrt');
const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';
const steps = Number(process.env.DYNRT_WEB_STEPS ?? 24);
const seed = Number(process.env.DYNRT_WEB_SEED ?? 7);
const POLICIES = ['none', 'openvino', 'adaptive'];
const llm = {
  prompt: process.env.DYNRT_WEB_PROMPT ?? 'What is the capital of France?',
  maxTokens: Number(process.env.DYNRT_WEB_TOKENS ?? 16),
  policy: process.env.DYNRT_WEB_POLICY ?? 'adaptive',
};
const requireModel = process.env.DYNRT_REQUIRE_MODEL === '1' || process.env.DYNRT_REQUIRE_GPU === '1';
// The page's default model and the file `dynrt fetch` puts in the cache.
const MODEL_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf';
// The second model the page runs: Gemma 3 270M (a base model: a raw prompt).
const GEMMA = { name: 'gemma3-270m', prompt: 'The capital of France is', maxTokens: 8 };
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

/** The fetched model's path (`dynrt fetch --check [NAME]`: never downloads), or null. */
function fetchedModel(name) {
  try {
    const out = execFileSync(nativeBin, ['fetch', '--check', ...(name ? [name] : [])], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 120_000 });
    const path = out.trim().split('\n').pop();
    return path && existsSync(path) ? path : null;
  } catch {
    return null;
  }
}

function nativeGenerate(modelPath, mode = '--chat', prompt = llm.prompt, maxTokens = llm.maxTokens) {
  const args = ['generate', '--json', '--model', modelPath, mode, prompt,
    '--max-tokens', String(maxTokens), '--policy', llm.policy];
  const out = execFileSync(nativeBin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 600_000 });
  return JSON.parse(out);
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

  const modelPath = existsSync(nativeBin) ? fetchedModel() : null;
  if (!modelPath) {
    const why = `no fetched model (\`${nativeBin} fetch --check\` failed): run \`cargo run --release -- fetch\``;
    if (requireModel) check('the fetched model for the SmolLM2 checks', false, why);
    else console.log(`     (SmolLM2 checks skipped: ${why})`);
  } else if (basename(modelPath) !== MODEL_FILE) {
    check(`the fetched model is ${MODEL_FILE}`, false, modelPath);
  }
  const server = await serve(webDir, 0, modelPath ? dirname(modelPath) : join(targetDir, 'no-models'));
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
    await testFailedDownload(context, url);
    if (modelPath) await testAdapterTooSmall(context, url);
    await testWithWebGpu(context, url, modelPath);
    const gemmaPath = modelPath ? fetchedModel(GEMMA.name) : null;
    if (gemmaPath) await testGemma(context, url, gemmaPath);
    else if (requireModel) check(`the fetched ${GEMMA.name} for the Gemma checks`, false, `run \`cargo run --release -- fetch ${GEMMA.name}\``);
    else console.log(`     (Gemma checks skipped: ${GEMMA.name} is not fetched)`);
    if (modelPath) await testServeDashboard(context, modelPath);
    const embedFolder = modelPath ? fetchedModel(SEARCH.model) : null;
    if (embedFolder && dirname(embedFolder) === dirname(modelPath)) await testSentenceSearch(context, url);
    else if (requireModel) check(`the fetched ${SEARCH.model} beside SmolLM2 for the search page`, false, `run \`cargo run --release -- fetch ${SEARCH.model}\``);
    else console.log(`     (search page checks skipped: ${SEARCH.model} is not fetched)`);
  } finally {
    await context.close();
    server.close();
    rmSync(profile, { recursive: true, force: true });
  }
}

// The search page (web/search.html): all-MiniLM-L6-v2 loaded from the model cache, the
// sentences ranked against the query; every vector within cosine 0.9999 of the native
// `dynrt embed` run's (SwiftShader against lavapipe/llvmpipe) and the ranking the same.
const SEARCH = { model: 'all-minilm-l6-v2' };
async function testSentenceSearch(context, url) {
  const page = await context.newPage();
  const errors = [];
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await page.goto(`${url}search.html`);
  await page.waitForFunction(() => document.getElementById('status').dataset.state !== 'pending', null, { timeout: 600_000 });
  const state = await page.$eval('#status', (el) => el.dataset.state);
  if (!check('search page: the model loads', state === 'ready', await page.$eval('#status', (el) => el.textContent))) {
    await page.close();
    return;
  }
  await page.click('#rank');
  await page.waitForFunction(() => ['done', 'error'].includes(document.getElementById('rank-state').dataset.state), null, { timeout: 600_000 });
  const result = await page.evaluate(() => window.searchResult ?? null);
  if (!check('search page: ranks the sentences', result !== null, await page.$eval('#rank-state', (el) => el.textContent))) {
    await page.close();
    return;
  }
  const texts = [result.query, ...result.sentences];
  const out = execFileSync(nativeBin, ['embed', '--model', SEARCH.model, ...texts], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 600_000 });
  const native = out.trim().split('\n').map((l) => JSON.parse(l).embedding);
  let worst = 1;
  for (let i = 0; i < texts.length; i += 1) {
    const a = result.vectors[i];
    const b = native[i];
    const dot = a.reduce((s, x, j) => s + x * b[j], 0);
    const na = Math.sqrt(a.reduce((s, x) => s + x * x, 0));
    const nb = Math.sqrt(b.reduce((s, x) => s + x * x, 0));
    worst = Math.min(worst, dot / (na * nb));
  }
  check('search page: vectors equal the native run\'s', worst >= 0.9999 && result.vectors.length === native.length, `smallest cosine ${worst}`);
  const q = native[0];
  const scores = native.slice(1).map((v) => v.reduce((s, x, j) => s + x * q[j], 0));
  const order = scores.map((s, i) => i).sort((a, b) => scores[b] - scores[a]);
  check('search page: the ranking equals the native one', JSON.stringify(order) === JSON.stringify(result.order), `${result.order} vs ${order}`);
  check('search page: the best match is about eating', /eating/.test(result.sentences[result.order[0]]), result.sentences[result.order[0]]);
  const items = await page.locator('#ranking li').count();
  check('search page: the list shows every sentence', items === result.sentences.length, `${items}`);
  check('search page: no console errors', errors.length === 0, errors.join(' | '));
  await page.screenshot({ path: join(targetDir, 'web-search.png') });
  await page.close();
}

// The page at / of `dynrt serve` (the native binary, SmolLM2) while requests run.
async function testServeDashboard(context, modelPath) {
  const args = ['serve', '--port', '0', '--model', modelPath, '--budget-mib', '6', '--page-size', '8'];
  const server = spawn(nativeBin, args, { stdio: ['ignore', 'pipe', 'ignore'] });
  try {
    const address = await new Promise((resolveAddr, reject) => {
      let out = '';
      const timer = setTimeout(() => reject(new Error('dynrt serve printed no address in 120 s')), 120_000);
      server.stdout.on('data', (d) => {
        out += d;
        const m = /listening on http:\/\/(\S+)/.exec(out);
        if (m) {
          clearTimeout(timer);
          resolveAddr(m[1]);
        }
      });
      server.on('exit', (code) => reject(new Error(`dynrt serve exited with ${code}`)));
    });
    const base = `http://localhost:${address.split(':').pop()}`;
    const page = await context.newPage();
    const errors = [];
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(`${base}/`);
    const ask = (i) => fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: `Tell me about the number ${i}.` }], temperature: 0, max_tokens: 40 }),
    }).then((r) => r.json());
    const answers = Promise.all([1, 2, 3].map(ask));
    let rows = 0;
    const until = Date.now() + 120_000;
    while (rows === 0 && Date.now() < until) {
      rows = await page.locator('#requests tbody tr').count();
      await page.waitForTimeout(200);
    }
    const done = await answers;
    check('serve dashboard: the page lists the active requests while they run', rows > 0, `rows ${rows}`);
    check('serve dashboard: every request answered', done.every((a) => (a.choices?.[0]?.message?.content ?? '').length > 0), JSON.stringify(done).slice(0, 300));
    let status = '';
    for (let i = 0; i < 50 && !/^0 active, 0 queued/.test(status); i++) {
      await page.waitForTimeout(200);
      status = (await page.locator('#status').textContent()) ?? '';
    }
    check('serve dashboard: then none active', /^0 active, 0 queued/.test(status), status);
    await page.screenshot({ path: join(targetDir, 'web-serve-dashboard.png') });
    check('serve dashboard: no console errors', errors.length === 0, errors.join('; '));
    await page.close();
  } catch (e) {
    check('serve dashboard', false, String(e));
  } finally {
    server.kill();
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
  check('no WebGPU: load button stays disabled', await page.$eval('#load', (b) => b.disabled));
  await page.close();
}

async function testFailedDownload(context, url) {
  const page = await context.newPage();
  // The server answers 404 for the model, as it does when it was never fetched.
  await page.route(`**/models/${MODEL_FILE}`, (route) => route.fulfill({ status: 404, body: 'not found' }));
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById('gpu-status').dataset.state !== 'pending', null, { timeout: 120_000 });
  await page.click('#load');
  await page.waitForFunction(() => ['ready', 'error'].includes(document.getElementById('load-state').dataset.state), null, { timeout: 60_000 });
  const state = await page.$eval('#load-state', (el) => ({ state: el.dataset.state, text: el.textContent }));
  check('failed download: error shown on the page', state.state === 'error' && state.text.includes('HTTP 404') && state.text.includes('fetch'), `${state.state}: ${state.text.slice(0, 160)}`);
  check('failed download: generate stays disabled', await page.$eval('#generate', (b) => b.disabled));
  await page.close();
}

/**
 * Makes the browser report lower limits than its adapter has, before the page's scripts run:
 * `caps` ({limit name: bytes}) caps the values of GPUAdapter.limits, which wgpu reads and
 * requests the device with, so the device really gets them (a request at or above WebGPU's
 * default is granted as asked). With `device`, GPUDevice.limits report them too: needed
 * for a cap below WebGPU's default, which the browser raises to the default.
 */
async function capLimits(page, caps, { device = false } = {}) {
  await page.addInitScript(({ caps, device }) => {
    for (const cls of [globalThis.GPUAdapter, device ? globalThis.GPUDevice : null]) {
      const real = cls && Object.getOwnPropertyDescriptor(cls.prototype, 'limits');
      if (!real) continue;
      Object.defineProperty(cls.prototype, 'limits', {
        configurable: true,
        get() {
          const limits = real.get.call(this);
          return new Proxy(limits, {
            get(target, key) {
              const v = target[key];
              if (key in caps) return Math.min(v, caps[key]);
              return typeof v === 'function' ? v.bind(target) : v;
            },
          });
        },
      });
    }
  }, { caps, device });
}

/** WebGPU's default limits: what every adapter offers at least. */
const DEFAULT_LIMITS = { maxBufferSize: 256 * 2 ** 20, maxStorageBufferBindingSize: 128 * 2 ** 20 };

async function testAdapterTooSmall(context, url) {
  // An adapter whose storage bindings hold 16 MiB loads SmolLM2: its token_embd (Q8_0, 30 MB)
  // is held in two row pieces (as Gemma 3's 170 MiB table is at the default 128 MiB). One
  // whose bindings hold 512 KiB cannot: the FFN projections (540 KiB of Q4_1 each) are bound
  // whole, so the load must stop with the page's "too small" message. No GPU at hand is that
  // small, and both are below WebGPU's default, so the browser's limits objects report them
  // (the adapter's, and the device's, which dynrt checks bindings against).
  for (const [mib, loads] of [[16, true], [0.5, false]]) {
    const page = await context.newPage();
    await capLimits(page, { maxStorageBufferBindingSize: mib * 2 ** 20 }, { device: true });
    await page.goto(url);
    await page.waitForFunction(() => document.getElementById('gpu-status').dataset.state !== 'pending', null, { timeout: 120_000 });
    await page.click('#load');
    await page.waitForFunction(() => ['ready', 'error'].includes(document.getElementById('load-state').dataset.state), null, { timeout: 600_000 });
    const state = await page.$eval('#load-state', (el) => ({ state: el.dataset.state, text: el.textContent }));
    if (loads) {
      check(`${mib} MiB storage bindings: the model loads (embedding in pieces)`, state.state === 'ready', `${state.state}: ${state.text.slice(0, 240)}`);
    } else {
      check(`adapter too small (${mib} MiB storage bindings): error shown on the page`, state.state === 'error' && state.text.includes('too small') && state.text.includes('ffn'),
        `${state.state}: ${state.text.slice(0, 240)}`);
      check('adapter too small: generate stays disabled', await page.$eval('#generate', (b) => b.disabled));
    }
    await page.close();
  }
}

async function testWithWebGpu(context, url, modelPath) {
  const page = await context.newPage();
  // The device gets WebGPU's default limits (256 MiB buffers, 128 MiB storage bindings), not
  // SwiftShader's 1 GiB: the model must load and run on any WebGPU adapter.
  await capLimits(page, DEFAULT_LIMITS);
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

  if (modelPath) await testLlm(page, modelPath);

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

async function testLlm(page, modelPath) {
  const fileBytes = statSync(modelPath).size;
  const t0 = Date.now();
  await page.click('#load');
  await page.waitForFunction(() => ['ready', 'error'].includes(document.getElementById('load-state').dataset.state), null, { timeout: 600_000 });
  const load = await page.$eval('#load-state', (el) => ({ state: el.dataset.state, text: el.textContent }));
  if (!check('SmolLM2: downloaded and loaded on the page', load.state === 'ready', `${load.text} (${((Date.now() - t0) / 1000).toFixed(1)} s)`)) return;
  const bar = await page.$eval('#download-progress', (el) => ({ received: Number(el.dataset.received), total: Number(el.dataset.total), value: el.value, max: el.max }));
  check('SmolLM2: progress bar reached the file size', bar.total === fileBytes && bar.received === fileBytes && bar.value === bar.max, JSON.stringify(bar));
  const info = JSON.parse(await page.$eval('#model-info', (el) => el.dataset.info));
  const ratio = info.weights_device_bytes / info.weights_file_bytes;
  check('SmolLM2: weights on the device in their block formats (within 1.05x of the file\'s tensor bytes)', ratio >= 1 && ratio <= 1.05, `${info.weights_device_bytes} / ${info.weights_file_bytes} = ${ratio.toFixed(4)}`);
  check('SmolLM2: the device has WebGPU\'s default limits', info.max_buffer_size === DEFAULT_LIMITS.maxBufferSize
    && info.max_storage_buffer_binding_size === DEFAULT_LIMITS.maxStorageBufferBindingSize,
  `maxBufferSize ${info.max_buffer_size}, maxStorageBufferBindingSize ${info.max_storage_buffer_binding_size}`);
  check('SmolLM2: the data region within the adapter\'s buffer limit', info.data_region_buffers.length > 0
    && info.data_region_buffers.every((b) => b <= info.max_buffer_size)
    && info.data_region_buffers.reduce((a, b) => a + b, 0) >= info.constants_region_bytes,
  `buffers [${info.data_region_buffers}], max ${info.max_buffer_size}`);
  console.log(`     download ${(info.download_ms / 1000).toFixed(2)} s, load ${(info.load_ms / 1000).toFixed(2)} s; constants region ${info.constants_region_bytes} bytes, data region buffers [${info.data_region_buffers}]; adapter maxBufferSize ${info.max_buffer_size}, maxStorageBufferBindingSize ${info.max_storage_buffer_binding_size}`);

  const native = nativeGenerate(modelPath);
  await page.fill('#prompt', llm.prompt);
  await page.setChecked('#chat', true);
  await page.fill('#max-tokens', String(llm.maxTokens));
  await page.selectOption('#llm-policy', llm.policy);
  await page.fill('#temperature', '0');
  await page.click('#generate');
  await page.waitForFunction(() => ['done', 'error'].includes(document.getElementById('gen-state').dataset.state), null, { timeout: 600_000 });
  const gen = await page.$eval('#gen-state', (el) => ({ state: el.dataset.state, text: el.textContent }));
  if (!check('SmolLM2: generation on the page finished', gen.state === 'done', gen.text)) return;
  const w = JSON.parse(await page.$eval('#llm-result-json', (el) => el.textContent));
  check(`SmolLM2: ${w.tokens.length} greedy tokens equal the native run's`, w.tokens.length === native.tokens.length && w.tokens.every((t, i) => t === native.tokens[i]),
    `web [${w.tokens}] ${JSON.stringify(w.text)} native [${native.tokens}] ${JSON.stringify(native.text)}`);
  check('SmolLM2: same prompt tokens as the native run', w.prompt_tokens === native.prompt_tokens, `web ${w.prompt_tokens} native ${native.prompt_tokens}`);
  const streamed = await page.$eval('#output', (el) => el.textContent);
  check('SmolLM2: streamed text equals the final text', streamed === w.text && w.text.length > 0, JSON.stringify(streamed));
  const charts = await page.evaluate(() => Object.fromEntries(['llm-chart-kinds', 'llm-chart-regions'].map((id) => {
    const el = document.getElementById(id);
    return [id, { points: Number(el.dataset.points), marks: Number(el.dataset.reallocMarks), series: el.querySelectorAll('path.series').length }];
  })));
  const k = charts['llm-chart-kinds'];
  const r = charts['llm-chart-regions'];
  check('SmolLM2: memory charts rendered (per kind and per region, one point per token, reallocations marked)',
    k.points === w.tokens.length && r.points === w.tokens.length && k.series > 0 && r.series === 3 && k.marks > 0 && w.trace.length === w.tokens.length,
    JSON.stringify(charts));
  console.log(`     SmolLM2 on the page: ${w.prompt_tokens} prompt tokens at ${w.prefill_tokens_per_s.toFixed(2)} tokens/s (prefill ${w.prefill_ms.toFixed(0)} ms), ${w.decode_ms_per_token.toFixed(1)} ms per decode token; text ${JSON.stringify(w.text)}`);
  const mib = (o) => Object.entries(o).map(([k, v]) => `${k} ${(v / 2 ** 20).toFixed(1)} MiB`).join(', ');
  console.log(`     peak per kind: ${mib(w.peak_bytes)}; per region: ${mib(Object.fromEntries(Object.entries(w.regions).map(([k, v]) => [k, v.peak_bytes])))}; KV reserved/needed ${w.kv_reserved_over_needed.toFixed(3)}`);
  console.log(`     native (${native.adapter}): ${native.prefill_tokens_per_s.toFixed(2)} prompt tokens/s, ${native.decode_ms_per_token.toFixed(1)} ms per decode token`);
  mkdirSync(targetDir, { recursive: true });
  const shot = join(targetDir, 'web-llm.png');
  await page.screenshot({ path: shot, fullPage: true });
  console.log(`     screenshot: ${shot}`);
}

/**
 * Gemma 3 270M on a device with WebGPU's default limits: its 170 MiB embedding (and tied head)
 * is above the 128 MiB binding, so it loads in row pieces; a base model, so the chat box is
 * off; the greedy tokens equal the native run's.
 */
async function testGemma(context, url, modelPath) {
  const page = await context.newPage();
  await capLimits(page, DEFAULT_LIMITS);
  const consoleErrors = [];
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  await page.goto(`${url}?model=${GEMMA.name}`);
  await page.waitForFunction(() => !document.getElementById('load').disabled, null, { timeout: 120_000 });
  check('Gemma: chosen by ?model=', await page.$eval('#model-name', (s) => s.value) === GEMMA.name);
  const t0 = Date.now();
  await page.click('#load');
  await page.waitForFunction(() => ['ready', 'error'].includes(document.getElementById('load-state').dataset.state), null, { timeout: 600_000 });
  const load = await page.$eval('#load-state', (el) => ({ state: el.dataset.state, text: el.textContent }));
  if (!check('Gemma: downloaded and loaded at WebGPU\'s default limits', load.state === 'ready', `${load.text} (${((Date.now() - t0) / 1000).toFixed(1)} s)`)) {
    await page.close();
    return;
  }
  const info = JSON.parse(await page.$eval('#model-info', (el) => el.dataset.info));
  const ratio = info.weights_device_bytes / info.weights_file_bytes;
  check('Gemma: the device has WebGPU\'s default limits', info.max_storage_buffer_binding_size === DEFAULT_LIMITS.maxStorageBufferBindingSize,
    `maxStorageBufferBindingSize ${info.max_storage_buffer_binding_size}`);
  check('Gemma: weights within 1.03x of the file\'s tensor bytes', ratio >= 1 && ratio <= 1.03, `${info.weights_device_bytes} / ${info.weights_file_bytes} = ${ratio.toFixed(4)}`);
  check('Gemma: a base model, so the chat template box is off', info.chat_template === false
    && await page.$eval('#chat', (c) => c.disabled && !c.checked));
  await page.fill('#prompt', GEMMA.prompt);
  await page.fill('#max-tokens', String(GEMMA.maxTokens));
  await page.fill('#temperature', '0');
  await page.click('#generate');
  await page.waitForFunction(() => ['done', 'error'].includes(document.getElementById('gen-state').dataset.state), null, { timeout: 600_000 });
  const gen = await page.$eval('#gen-state', (el) => ({ state: el.dataset.state, text: el.textContent }));
  if (check('Gemma: generation on the page finished', gen.state === 'done', gen.text)) {
    const w = JSON.parse(await page.$eval('#llm-result-json', (el) => el.textContent));
    const native = nativeGenerate(modelPath, '--prompt', GEMMA.prompt, GEMMA.maxTokens);
    check(`Gemma: ${w.tokens.length} greedy tokens equal the native run's`, w.tokens.length === native.tokens.length && w.tokens.every((t, i) => t === native.tokens[i]),
      `web [${w.tokens}] ${JSON.stringify(w.text)} native [${native.tokens}] ${JSON.stringify(native.text)}`);
    console.log(`     Gemma on the page: load ${(info.load_ms / 1000).toFixed(1)} s, ${w.prompt_tokens} prompt tokens, ${w.decode_ms_per_token.toFixed(1)} ms per decode token; text ${JSON.stringify(w.text)}`);
  }
  check('Gemma: no page errors', consoleErrors.length === 0, consoleErrors.slice(0, 3).join(' | '));
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
    // reallocate most, and adaptive must not do worse than the OpenVINO rule.
    check('reallocations: none > openvino >= adaptive', r.none > r.openvino && r.openvino >= r.adaptive, JSON.stringify(r));
  }
}

try {
  await main();
} catch (e) {
  check('test ran to completion', false, e?.stack ?? String(e));
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
