// A tiny static file server for web/ on localhost (no dependencies), which also serves the
// model cache that `dynrt fetch` fills under /models/ (GGUF, safetensors and JSON files,
// streamed).
//
//   node web/serve.mjs [port] [--models DIR]
//       (default port 8080; then open http://localhost:8080/)
//
// The model directory is, as for `dynrt fetch`: --models DIR, else $DYNRT_MODELS, else
// $XDG_CACHE_HOME/dynrt/models, else ~/.cache/dynrt/models (dynrt::fetch::models_dir).
// The page fetches http://localhost:PORT/models/SmolLM2-135M-Instruct.Q4_1.gguf from here:
// nothing comes from outside localhost.
//
// Why not `python3 -m http.server`: it works for web/ too, but this one always sends
// `application/wasm` (needed for WebAssembly.instantiateStreaming), never caches (a rebuilt
// web/pkg is picked up on reload), sends Content-Length for the page's progress bar, and
// test.mjs reuses it on a random free port. WebGPU needs a secure context; http://localhost
// is one.
import { createServer } from 'node:http';
import { createReadStream } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { homedir } from 'node:os';
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

/** The URL prefix under which the model directory is served. */
export const MODELS_PREFIX = '/models/';
// What a model folder holds: GGUF files, and a sentence-transformers folder's weights and
// JSON files (the search page).
const MODEL_EXTENSIONS = ['.gguf', '.safetensors', '.json'];

/** The model cache directory of `dynrt fetch` (without --dir). */
export function defaultModelsDir(env = process.env) {
  if (env.DYNRT_MODELS) return env.DYNRT_MODELS;
  const cache = env.XDG_CACHE_HOME || join(homedir(), '.cache');
  return join(cache, 'dynrt', 'models');
}

/** `path` inside `root` (absolute), or null when the URL path escapes it (../). */
function inside(root, urlPath) {
  const path = normalize(join(root, urlPath));
  return path === root || path.startsWith(root + sep) ? path : null;
}

/**
 * Serves `root` on 127.0.0.1:`port` (0 = any free port), and `.gguf` files of `modelsDir`
 * (default: defaultModelsDir()) under /models/. Resolves to the http.Server.
 */
export function serve(root, port = 8080, modelsDir = defaultModelsDir()) {
  const rootAbs = resolve(root);
  const modelsAbs = resolve(modelsDir);
  const server = createServer(async (req, res) => {
    try {
      const urlPath = decodeURIComponent(new URL(req.url, 'http://localhost').pathname);
      if (urlPath.startsWith(MODELS_PREFIX)) {
        const path = inside(modelsAbs, urlPath.slice(MODELS_PREFIX.length));
        if (!path || !MODEL_EXTENSIONS.includes(extname(path))) {
          res.writeHead(403).end('forbidden');
          return;
        }
        const { size } = await stat(path);
        // Streamed: a 98 MB model is never held in the server's memory.
        res.writeHead(200, {
          'content-type': 'application/octet-stream',
          'content-length': String(size),
          'cache-control': 'no-store',
        });
        createReadStream(path).on('error', () => res.destroy()).pipe(res);
        return;
      }
      let path = inside(rootAbs, urlPath);
      // Refuse anything that escapes the served folder (../ in the URL).
      if (!path) {
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
  const args = process.argv.slice(2);
  let modelsDir = defaultModelsDir();
  const at = args.indexOf('--models');
  if (at >= 0) {
    if (!args[at + 1]) throw new Error('--models needs a directory');
    modelsDir = args[at + 1];
    args.splice(at, 2);
  }
  const port = Number(args[0] ?? 8080);
  const root = fileURLToPath(new URL('.', import.meta.url));
  const server = await serve(root, port, modelsDir);
  console.log(`serving ${root} on http://localhost:${server.address().port}/ and the models in ${resolve(modelsDir)} under ${MODELS_PREFIX} (Ctrl-C stops)`);
}
