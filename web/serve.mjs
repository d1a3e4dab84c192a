// A tiny static file server for web/ on localhost (no dependencies).
//
//   node web/serve.mjs [port]        (default 8080; then open http://localhost:8080/)
//
// Why not `python3 -m http.server`: it works too, but this one always sends
// `application/wasm` (needed for WebAssembly.instantiateStreaming), never caches (a rebuilt
// web/pkg is picked up on reload), and test.mjs reuses it on a random free port.
// WebGPU needs a secure context; http://localhost is one.
import { createServer } from 'node:http';
import { readFile, stat } from 'node:fs/promises';
import { extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
};

/** Serves `root` on 127.0.0.1:`port` (0 = any free port). Resolves to the http.Server. */
export function serve(root, port = 8080) {
  const rootAbs = resolve(root);
  const server = createServer(async (req, res) => {
    try {
      const urlPath = decodeURIComponent(new URL(req.url, 'http://localhost').pathname);
      let path = normalize(join(rootAbs, urlPath));
      // Refuse anything that escapes the served folder (../ in the URL).
      if (path !== rootAbs && !path.startsWith(rootAbs + sep)) {
        res.writeHead(403).end('forbidden');
        return;
      }
      if ((await stat(path)).isDirectory()) path = join(path, 'index.html');
      const body = await readFile(path);
      res.writeHead(200, {
        'content-type': MIME[extname(path)] ?? 'application/octet-stream',
        'cache-control': 'no-store',
      });
      res.end(body);
    } catch {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
    }
  });
  return new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(port, '127.0.0.1', () => ok(server));
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const port = Number(process.argv[2] ?? 8080);
  const root = fileURLToPath(new URL('.', import.meta.url));
  const server = await serve(root, port);
  console.log(`serving ${root} on http://localhost:${server.address().port}/ (Ctrl-C stops)`);
}
