// The browser route of scripts/bench_peer.sh: opens web/peer/index.html in Debian's headless
// Chromium (WebGPU on SwiftShader, no workaround flags beyond enabling WebGPU on Linux) with
// webgpu-count.js injected before any script, and runs each workload of the manifest on ONNX
// Runtime Web and on dynrt's wasm package, interleaved: round r runs both runtimes once, the
// order alternating, each on a fresh session.
//
//   node web/peer/run.mjs MODELS_DIR [--workloads a,b] [--rounds 3] [--runtimes ort,dynrt]
//
// MODELS_DIR: what scripts/peer_models.py wrote. Prints one JSON line per (workload, runtime,
// round) on stdout: {"route":"browser","adapter":...,"workload":...,"round":r, ...the page's
// document (web/peer/peer.js)}; progress on stderr. Serves web/peer/ at /peer/, web/pkg/ at
// /pkg/ and MODELS_DIR at /models/ on a free 127.0.0.1 port (a secure context for WebGPU);
// nothing leaves the machine. CHROMIUM overrides /usr/bin/chromium.
import { chromium } from 'playwright-core';
import { createReadStream, existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const peerDir = dirname(fileURLToPath(import.meta.url));
const webDir = resolve(peerDir, '..');

function parseArgs(argv) {
  const a = { rounds: 3, runtimes: ['ort', 'dynrt'], workloads: null, models: null };
  for (let i = 0; i < argv.length; i += 1) {
    const k = argv[i];
    if (k === '--rounds') a.rounds = Number(argv[++i]);
    else if (k === '--runtimes') a.runtimes = argv[++i].split(',');
    else if (k === '--workloads') a.workloads = argv[++i].split(',');
    else if (!a.models) a.models = resolve(k);
    else throw new Error(`unexpected argument ${k}`);
  }
  if (!a.models) throw new Error('usage: node web/peer/run.mjs MODELS_DIR [--workloads a,b] [--rounds N] [--runtimes ort,dynrt]');
  return a;
}

const MIME = { '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm', '.json': 'application/json' };

/** Static files from a few mounts; large model files are streamed. */
function serve(mounts) {
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://127.0.0.1').pathname);
    const mount = Object.keys(mounts).find((m) => path.startsWith(m));
    if (!mount) return res.writeHead(404).end();
    const root = mounts[mount];
    let file = normalize(join(root, path.slice(mount.length)));
    if (file !== root && !file.startsWith(root + sep)) return res.writeHead(403).end();
    try {
      if (statSync(file).isDirectory()) file = join(file, 'index.html');
      const size = statSync(file).size;
      res.writeHead(200, { 'content-type': MIME[extname(file)] ?? 'application/octet-stream', 'content-length': size, 'cache-control': 'no-store' });
      createReadStream(file).pipe(res);
    } catch {
      res.writeHead(404).end();
    }
    return undefined;
  });
  return new Promise((ok) => server.listen(0, '127.0.0.1', () => ok(server)));
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const rows = readFileSync(join(args.models, 'workloads.json'), 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
  const chosen = args.workloads ? rows.filter((r) => args.workloads.includes(r.workload)) : rows;
  const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';
  if (!existsSync(chromiumPath)) throw new Error(`no chromium at ${chromiumPath} (apt-get install chromium, or set CHROMIUM)`);

  const server = await serve({ '/peer/': peerDir, '/pkg/': join(webDir, 'pkg'), '/models/': args.models });
  const url = `http://127.0.0.1:${server.address().port}/peer/index.html`;
  const profile = mkdtempSync(join(tmpdir(), 'dynrt-peer-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    // WebGPU is behind a flag on Linux; the sandbox needs namespaces this machine may lack.
    args: ['--no-sandbox', '--enable-unsafe-webgpu', '--disable-background-networking', '--disable-component-update', '--no-first-run'],
  });
  await context.route(/^(?!http:\/\/127\.0\.0\.1:).*/, (route) => route.abort());
  try {
    const page = await context.newPage();
    page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') process.stderr.write(`[page ${m.type()}] ${m.text()}\n`); });
    page.on('pageerror', (e) => process.stderr.write(`[page error] ${e}\n`));
    await page.addInitScript({ path: join(peerDir, 'webgpu-count.js') });
    await page.goto(url);
    await page.waitForFunction(() => document.getElementById('status').dataset.state !== 'pending', null, { timeout: 120_000 });
    const info = await page.evaluate(() => window.peer.init());
    process.stderr.write(`browser adapter: ${info.adapter} (fallback ${info.fallback}), onnxruntime-web ${info.ort}\n`);
    const dynrtMissing = await page.evaluate(() => window.peer.dynrtStatus());
    for (const row of chosen) {
      for (let r = 0; r < args.rounds; r += 1) {
        const order = r % 2 === 0 ? args.runtimes : [...args.runtimes].reverse();
        for (const rt of order) {
          if (rt === 'dynrt' && dynrtMissing) {
            if (r === 0) console.log(JSON.stringify({ route: 'browser', adapter: info.adapter, workload: row.workload, round: r, runtime: 'dynrt', missing: dynrtMissing }));
            continue;
          }
          const t = Date.now();
          let doc;
          try {
            doc = await page.evaluate(([rt2, row2, steps]) => window.peer.run(rt2, row2, steps), [rt, row, row.steps]);
          } catch (e) {
            doc = { runtime: rt, error: String(e).split('\n')[0] };
          }
          process.stderr.write(`  browser ${row.workload} round ${r} ${rt}: ${doc.error ?? doc.missing ?? `${doc.steps.length} steps`} (${((Date.now() - t) / 1000).toFixed(1)} s)\n`);
          console.log(JSON.stringify({ route: 'browser', adapter: info.adapter, workload: row.workload, round: r, ...doc }));
        }
      }
    }
  } finally {
    await context.close();
    server.close();
    rmSync(profile, { recursive: true, force: true });
  }
}

main().catch((e) => {
  process.stderr.write(`web/peer/run.mjs: ${e.stack ?? e}\n`);
  process.exit(1);
});
