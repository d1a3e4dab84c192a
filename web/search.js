// The search page: loads all-MiniLM-L6-v2's sentence-transformers folder from this server
// (web/serve.mjs serves the `dynrt fetch` cache under /models/) into the wasm `Embedder`,
// then embeds the sentences and the query in one call and ranks the sentences by cosine
// similarity (the vectors are normalized: a dot product).
//
// What web/test.mjs reads: #status[data-state] (pending, ready, error), #rank-state
// [data-state] (idle, running, done, error) and `window.searchResult` ({query, sentences,
// vectors: number[][], scores, order}).

const FOLDER = 'models/all-minilm-l6-v2/';
const $ = (id) => document.getElementById(id);
let embedder = null;

function setStatus(state, html) {
  const el = $('status');
  el.dataset.state = state;
  el.innerHTML = html;
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

async function text(name, optional = false) {
  const r = await fetch(FOLDER + name);
  if (!r.ok) {
    if (optional && r.status === 404) return '';
    throw new Error(`${FOLDER}${name}: HTTP ${r.status}`);
  }
  return r.text();
}

async function load(wasm) {
  const [config, tokenizer, modules, pooling, sbert] = await Promise.all([
    text('config.json'), text('tokenizer.json'), text('modules.json'),
    text('1_Pooling/config.json'), text('sentence_bert_config.json', true),
  ]);
  const r = await fetch(FOLDER + 'model.safetensors');
  if (!r.ok) throw new Error(`${FOLDER}model.safetensors: HTTP ${r.status} (run \`dynrt fetch all-minilm-l6-v2\`)`);
  const weights = new Uint8Array(await r.arrayBuffer());
  return wasm.Embedder.create(config, tokenizer, modules, pooling, sbert, weights);
}

async function rank() {
  const sentences = $('sentences').value.split('\n').map((s) => s.trim()).filter((s) => s.length);
  const query = $('query').value;
  $('rank').disabled = true;
  $('rank-state').dataset.state = 'running';
  $('rank-state').textContent = 'embedding…';
  try {
    const t0 = performance.now();
    const flat = await embedder.embed([query, ...sentences]);
    const ms = performance.now() - t0;
    const dim = embedder.dim;
    const vectors = [];
    for (let i = 0; i <= sentences.length; i += 1) vectors.push(Array.from(flat.subarray(i * dim, (i + 1) * dim)));
    const q = vectors[0];
    const scores = vectors.slice(1).map((v) => v.reduce((s, x, j) => s + x * q[j], 0));
    const order = scores.map((s, i) => i).sort((a, b) => scores[b] - scores[a]);
    $('ranking').replaceChildren(...order.map((i) => {
      const li = document.createElement('li');
      li.innerHTML = `<span class="score">${scores[i].toFixed(4)}</span>${escapeHtml(sentences[i])}`;
      return li;
    }));
    window.searchResult = { query, sentences, vectors, scores, order };
    $('rank-state').dataset.state = 'done';
    $('rank-state').textContent = `${sentences.length + 1} texts in ${ms.toFixed(0)} ms`;
  } catch (e) {
    $('rank-state').dataset.state = 'error';
    $('rank-state').innerHTML = `<span class="fail">${escapeHtml(e?.message ?? e)}</span>`;
  } finally {
    $('rank').disabled = false;
  }
}

async function main() {
  if (!navigator.gpu) {
    setStatus('error', '<strong>No WebGPU.</strong> This browser does not offer navigator.gpu.');
    return;
  }
  let wasm;
  try {
    wasm = await import('./pkg/dynrt.js');
    await wasm.default();
  } catch (e) {
    setStatus('error', `<strong>Could not load the wasm package</strong>: ${escapeHtml(e?.message ?? e)}. Build it with <code>web/build.sh</code>.`);
    return;
  }
  setStatus('pending', 'Loading all-MiniLM-L6-v2…');
  try {
    embedder = await load(wasm);
  } catch (e) {
    setStatus('error', `<strong>Could not load the model:</strong> ${escapeHtml(e?.message ?? e)}`);
    return;
  }
  setStatus('ready', `all-MiniLM-L6-v2 loaded: ${embedder.dim} dimensions.`);
  $('rank').disabled = false;
  $('rank').addEventListener('click', rank);
}

main();
