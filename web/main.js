// The page: checks for WebGPU, loads the wasm package built by web/build.sh, then
//  - a language model (the select offers wasm.models(); `?model=NAME` picks one, SmolLM2 by
//    default): downloads the GGUF from this server (streamed, with a progress bar) into wasm
//    memory, loads it on WebGPU and generates text, streamed as tokens come, with bytes in
//    use per memory kind and per region drawn after every forward pass;
//  - the synthetic decode demo, step by step, with the same charts.
//
// Everything the test (web/test.mjs) reads is in the DOM: #gpu-status[data-state],
// #load-state[data-state], #gen-state[data-state], #llm-result-json, #output,
// #run-state[data-state], #result-json (the demo's report), the charts' data-points.

const KINDS = ['usm_device', 'usm_host', 'usm_shared', 'cl_mem'];
const KIND_COLOURS = {
  usm_device: '#1f77b4',
  usm_host: '#ff7f0e',
  usm_shared: '#2ca02c',
  cl_mem: '#9467bd',
};
const REGIONS = ['constants', 'placeholders', 'internal'];
const REGION_COLOURS = { constants: '#8c564b', placeholders: '#17becf', internal: '#bcbd22' };

/** Chart series: bytes in use per kind (one shared axis). */
const KIND_SERIES = KINDS.map((k) => ({ key: k, colour: KIND_COLOURS[k], value: (p) => p.bytes_in_use?.[k] ?? 0 }));
/** Chart series: bytes per device region (one panel each: weights dwarf the KV cache). */
const REGION_SERIES = REGIONS.map((r) => ({ key: r, colour: REGION_COLOURS[r], value: (p) => p.region_bytes?.[r] ?? 0 }));

/** The preallocation policies (`Policy` in dynrt), for both policy selects (adaptive selected). */
const POLICIES = [
  ['none', 'none (exact sizes)'],
  ['openvino', 'openvino (OpenVINO rule)'],
  ['adaptive', 'adaptive'],
];

function fillPolicySelect(select) {
  select.replaceChildren(...POLICIES.map(([value, text]) => new Option(text, value, false, value === 'adaptive')));
}

/** Where the page downloads models: web/serve.mjs serves the `dynrt fetch` cache here. */
const MODELS_URL = 'models/';

/** The models dynrt knows (wasm.models()), filled at start. */
let knownModels = [];

/** The model chosen in the select (`?model=NAME` picks it at start). */
function chosenModel() {
  return knownModels.find((m) => m.name === $('model-name').value) ?? knownModels[0];
}

/** The chosen model's URL on this server. */
function modelUrl() {
  return MODELS_URL + chosenModel().file;
}

const $ = (id) => document.getElementById(id);

function setGpuStatus(state, html) {
  const el = $('gpu-status');
  el.dataset.state = state;
  el.className = `panel ${state === 'ok' ? 'ok' : state === 'error' ? 'error' : ''}`;
  el.innerHTML = html;
}

/** Sets a status line's `data-state` (what the test waits on) and text. */
function setState(id, state, text) {
  const el = $(id);
  el.dataset.state = state;
  el.textContent = text;
  el.className = state === 'error' ? 'fail' : 'muted';
}

function setRunState(state, text) {
  setState('run-state', state, text);
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

export function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = -1;
  do {
    v /= 1024;
    i += 1;
  } while (v >= 1024 && i < units.length - 1);
  return `${v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
}

// ---------------------------------------------------------------------------------------
// WebGPU detection: done in JS first so a browser without WebGPU gets a clear message
// instead of a wasm error.

async function detectWebGpu() {
  if (!window.isSecureContext) {
    return { ok: false, why: 'This page is not a secure context, and WebGPU is only offered to secure contexts. Open it from <code>http://localhost</code> or over https.' };
  }
  if (!('gpu' in navigator)) {
    return { ok: false, why: 'This browser has no WebGPU (<code>navigator.gpu</code> is missing). Use a recent Chrome or Edge (113+) on a machine with a supported GPU driver, or enable WebGPU in the browser\'s settings / flags.' };
  }
  let adapter = null;
  try {
    adapter = await navigator.gpu.requestAdapter();
  } catch (e) {
    return { ok: false, why: `WebGPU is present but requesting an adapter failed: ${escapeHtml(e)}` };
  }
  if (!adapter) {
    return { ok: false, why: 'WebGPU is present but the browser offers no adapter (GPU blocklisted or disabled). In Chrome, see <code>chrome://gpu</code>.' };
  }
  // wgpu's WebGPU backend leaves AdapterInfo.name empty; the browser's GPUAdapterInfo says more.
  const i = adapter.info ?? {};
  const label = [i.vendor, i.architecture, i.description].filter((x) => x).join(' ');
  return { ok: true, label };
}

// ---------------------------------------------------------------------------------------
// The live chart: inline SVG, bytes in use per kind against the step, reallocations marked.

const SVG_NS = 'http://www.w3.org/2000/svg';

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

/**
 * Draws one panel at (`left`, `top`) of `width` x `height` into `svg`: `series` (objects
 * {key, colour, value(point)}) against the step, with every step that made real allocations
 * marked (a dashed line, and a dot on the series that grew most). Returns the marks drawn.
 */
function drawPanel(svg, box, points, series, xMax, title) {
  const M = { left: 78, right: 12, top: title ? 34 : 16, bottom: 36 };
  const plotW = box.width - M.left - M.right;
  const plotH = box.height - M.top - M.bottom;
  const X0 = box.left + M.left;
  const Y0 = box.top + M.top;
  let yMax = 1;
  for (const p of points) for (const s of series) yMax = Math.max(yMax, s.value(p));
  yMax *= 1.08;
  const x = (step) => X0 + (step / xMax) * plotW;
  const y = (b) => Y0 + plotH - (b / yMax) * plotH;

  if (title) svg.append(svgEl('text', { x: X0, y: box.top + 14, 'font-size': 13, 'font-weight': 600, fill: '#333' }, title));
  svg.append(svgEl('rect', { x: X0, y: Y0, width: plotW, height: plotH, fill: '#fff', stroke: '#ccc' }));
  for (let i = 0; i <= 4; i += 1) {
    const b = (yMax / 1.08) * (i / 4);
    svg.append(svgEl('line', { x1: X0, x2: X0 + plotW, y1: y(b), y2: y(b), stroke: '#eee' }));
    svg.append(svgEl('text', { x: X0 - 6, y: y(b) + 4, 'text-anchor': 'end', 'font-size': 11, fill: '#555' }, formatBytes(Math.round(b))));
  }
  // At most 9 labels, on whole multiples of one stride (rounding xMax * i / 8 gave uneven
  // gaps such as 6, 8, 9, 11).
  const xStride = Math.max(1, Math.ceil(xMax / 8));
  for (let s = 0; s <= xMax; s += xStride) {
    svg.append(svgEl('text', { x: x(s), y: Y0 + plotH + 16, 'text-anchor': 'middle', 'font-size': 11, fill: '#555' }, String(s)));
  }
  svg.append(svgEl('text', { x: X0 + plotW / 2, y: box.top + box.height - 6, 'text-anchor': 'middle', 'font-size': 12, fill: '#333' }, 'step'));

  for (const s of series) {
    const d = points.map((p, i) => `${i ? 'L' : 'M'}${x(p.step).toFixed(1)},${y(s.value(p)).toFixed(1)}`).join('');
    svg.append(svgEl('path', { d, fill: 'none', stroke: s.colour, 'stroke-width': 2, class: `series series-${s.key}` }));
  }

  let nMarks = 0;
  points.forEach((p, i) => {
    const n = p.reallocations ?? 0;
    if (n === 0) return;
    const prev = i > 0 ? points[i - 1] : null;
    let s = series[0];
    let growth = -Infinity;
    for (const c of series) {
      const g = c.value(p) - (prev ? c.value(prev) : 0);
      if (g > growth) { growth = g; s = c; }
    }
    const cx = x(p.step);
    const cy = y(s.value(p));
    svg.append(svgEl('line', { x1: cx, x2: cx, y1: Y0, y2: Y0 + plotH, stroke: '#c62828', 'stroke-opacity': 0.25, 'stroke-dasharray': '3 3' }));
    const mark = svgEl('circle', { cx, cy, r: 3 + Math.min(4, n), fill: '#c62828', stroke: '#fff', class: 'realloc' });
    mark.append(svgEl('title', {}, `step ${p.step}: ${n} allocation${n === 1 ? '' : 's'} (${s.key} grew by ${formatBytes(Math.max(0, growth))})`));
    svg.append(mark);
    nMarks += n;
  });
  return { nMarks, legendX: X0 + 8, legendY: Y0 + 12 };
}

/**
 * Draws `points` ([{step, bytes_in_use: {kind: n}, region_bytes: {region: n},
 * reallocations: n}]) into `host`: `series` on one shared axis, or with `separate` one
 * panel per series, each on its own axis. `totalSteps` fixes the x axis so the chart grows
 * left to right while running. Series that stay at zero are left out.
 */
export function drawChart(host, points, totalSteps, series, { separate = false, label = 'bytes' } = {}) {
  const used = series.filter((s) => points.some((p) => s.value(p) > 0));
  const shown = used.length ? used : series.slice(0, 1);
  const W = 900;
  const panelH = separate ? 200 : 320;
  const panels = separate ? shown.map((s) => [s]) : [shown];
  const H = panelH * panels.length;
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${label} over the steps` });
  const xMax = Math.max(1, totalSteps - 1, ...points.map((p) => p.step));
  let nMarks = 0;
  panels.forEach((panel, i) => {
    const r = drawPanel(svg, { left: 0, top: i * panelH, width: W, height: panelH }, points, panel, xMax, separate ? panel[0].key : '');
    if (i === 0) nMarks = r.nMarks;
    if (separate) return;
    let lx = r.legendX;
    for (const s of panel) {
      svg.append(svgEl('line', { x1: lx, x2: lx + 18, y1: r.legendY, y2: r.legendY, stroke: s.colour, 'stroke-width': 3 }));
      svg.append(svgEl('text', { x: lx + 22, y: r.legendY + 4, 'font-size': 12, fill: '#333' }, s.key));
      lx += 110;
    }
    svg.append(svgEl('circle', { cx: lx + 6, cy: r.legendY, r: 4, fill: '#c62828' }));
    svg.append(svgEl('text', { x: lx + 14, y: r.legendY + 4, 'font-size': 12, fill: '#333' }, `real allocations (${r.nMarks})`));
  });
  host.replaceChildren(svg);
  host.dataset.points = String(points.length);
  host.dataset.reallocMarks = String(nMarks);
}

/** The two charts of a run: per kind into `kindsHost`, per region into `regionsHost`. */
function drawMemory(kindsHost, regionsHost, points, totalSteps) {
  drawChart(kindsHost, points, totalSteps, KIND_SERIES, { label: 'bytes in use per memory kind' });
  drawChart(regionsHost, points, totalSteps, REGION_SERIES, { separate: true, label: 'bytes per device region' });
}

// ---------------------------------------------------------------------------------------
// Result table.

function showSummary(tableId, rows) {
  const tbody = document.createElement('tbody');
  for (const [name, value] of rows) {
    const tr = document.createElement('tr');
    const th = document.createElement('th');
    th.textContent = name;
    const td = document.createElement('td');
    td.className = 'num';
    td.innerHTML = value;
    tr.append(th, td);
    tbody.append(tr);
  }
  $(tableId).replaceChildren(tbody);
}

function showReport(report, tolerance) {
  const errOk = report.max_abs_err <= tolerance;
  const peak = KINDS.filter((k) => report.peak_bytes?.[k] > 0)
    .map((k) => `${k} ${formatBytes(report.peak_bytes[k])}`).join(', ') || '—';
  showSummary('summary', [
    ['adapter', `${escapeHtml(report.adapter)} (${escapeHtml(report.backend)})`],
    ['policy', escapeHtml(report.policy)],
    ['steps', report.steps],
    ['max |error| vs CPU reference', `${report.max_abs_err.toExponential(3)} <span class="${errOk ? 'pass' : 'fail'}">${errOk ? '≤' : '>'} ${tolerance.toExponential(0)}</span>`],
    ['allocations', report.allocations],
    ['reallocations', report.reallocations],
    ['bytes allocated in total', formatBytes(report.bytes_allocated_total)],
    ['peak bytes', peak],
    ['pipeline cache', `${report.pipeline_cache.hits} hits, ${report.pipeline_cache.misses} misses`],
    ['shape updates skipped', report.shape_updates_skipped],
    ['ms per step', report.ms_per_step.toFixed(2)],
  ]);
  const tokens = $('tokens');
  tokens.textContent = report.tokens.join(' ');
  tokens.className = 'mono';
  $('result-json').textContent = JSON.stringify(report, null, 2);
}

// ---------------------------------------------------------------------------------------
// Running.

let wasm = null;
let running = false;

async function runDemo(event) {
  event.preventDefault();
  if (running) return;
  running = true;
  $('run').disabled = true;
  const steps = Number($('steps').value);
  const policy = $('policy').value;
  const seed = Number($('seed').value);
  const points = [];
  $('result-json').textContent = '';
  setRunState('running', `running ${steps} steps (${policy})…`);
  try {
    if (!Number.isInteger(steps) || steps < 1) throw new Error('steps must be a whole number ≥ 1');
    if (!Number.isInteger(seed) || seed < 0) throw new Error('seed must be a whole number ≥ 0');
    const demo = await wasm.WebDemo.create(JSON.stringify({ steps, policy, seed }));
    drawMemory($('chart'), $('chart-regions'), points, steps);
    for (;;) {
      const json = await demo.step();
      if (json === undefined || json === null) break;
      const point = JSON.parse(json);
      points.push(point);
      drawMemory($('chart'), $('chart-regions'), points, steps);
      setRunState('running', `step ${point.step + 1} / ${steps} (${policy})…`);
    }
    const report = JSON.parse(demo.finish());
    demo.free();
    showReport(report, wasm.WebDemo.tolerance());
    setRunState('done', `done: ${report.steps} steps, ${report.reallocations} reallocations`);
  } catch (e) {
    console.error(e);
    setRunState('error', `failed: ${e?.message ?? e}`);
  } finally {
    running = false;
    $('run').disabled = false;
  }
}

// ---------------------------------------------------------------------------------------
// A language model (SmolLM2 by default; any model of wasm.models()): download, load, generate.

let model = null;
let generating = false;
/** The browser's name for the adapter (wgpu's WebGPU backend reports none). */
let adapterLabel = '';

/** Lets the browser paint (the load itself runs without yielding). */
const nextFrame = () => new Promise((ok) => requestAnimationFrame(() => setTimeout(ok, 0)));

function showDownload(received, total) {
  const bar = $('download-progress');
  bar.max = total > 0 ? total : Math.max(1, received);
  bar.value = received;
  bar.dataset.received = String(received);
  bar.dataset.total = String(total);
  const pct = total > 0 ? ` (${Math.floor((100 * received) / total)}%)` : '';
  setState('load-state', 'downloading', `downloading ${formatBytes(received)}${total > 0 ? ` of ${formatBytes(total)}` : ''}${pct}…`);
}

/**
 * Downloads the GGUF with a streamed fetch, chunk by chunk into wasm memory (a
 * ModelDownload), then loads it on WebGPU. Resolves to the WebModel and the download time.
 */
async function downloadAndLoad(url) {
  const t0 = performance.now();
  let response;
  try {
    response = await fetch(url, { cache: 'no-store' });
  } catch (e) {
    throw new Error(`could not download ${url}: ${e?.message ?? e}`);
  }
  if (!response.ok) {
    throw new Error(`could not download ${url}: HTTP ${response.status} ${response.statusText}. `
      + 'Fetch the model once with `cargo run --release -- fetch` and serve this page with '
      + '`node web/serve.mjs`, which serves the model cache under /models/.');
  }
  const total = Number(response.headers.get('content-length') ?? 0);
  const download = new wasm.ModelDownload(total);
  try {
    const reader = response.body.getReader();
    let received = 0;
    let shown = 0;
    showDownload(0, total);
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      download.push(value);
      received += value.length;
      // Redraw the bar every MiB, not every chunk.
      if (received - shown >= 1 << 20) {
        showDownload(received, total);
        shown = received;
      }
    }
    showDownload(received, total);
  } catch (e) {
    download.free();
    throw new Error(`the download of ${url} failed: ${e?.message ?? e}`);
  }
  const downloadMs = performance.now() - t0;
  setState('load-state', 'loading', 'parsing the GGUF and uploading the weights…');
  await nextFrame();
  // load() consumes the download, also when it fails.
  const loaded = await download.load();
  return { loaded, downloadMs };
}

async function loadModel(event) {
  event.preventDefault();
  if (model) return;
  $('load').disabled = true;
  $('model-name').disabled = true;
  try {
    const { loaded, downloadMs } = await downloadAndLoad(modelUrl());
    model = loaded;
    const info = JSON.parse(model.info());
    info.download_ms = downloadMs;
    $('model-info').dataset.info = JSON.stringify(info);
    showSummary('model-info', [
      ['model', `${escapeHtml(info.architecture)}: ${info.layers} layers, width ${info.width}, ${info.heads} query / ${info.kv_heads} KV heads, context ${info.context}, vocabulary ${info.vocabulary}`],
      ['file', `${formatBytes(info.file_bytes)}, of which tensors ${formatBytes(info.weights_file_bytes)}`],
      ['weights on the device', `${formatBytes(info.weights_device_bytes)} (${(info.weights_device_bytes / info.weights_file_bytes).toFixed(3)}x the file's tensor bytes: block formats kept)`],
      ['constants region', `${formatBytes(info.constants_region_bytes)} of weights in ${info.data_region_buffers.length} buffer${info.data_region_buffers.length === 1 ? '' : 's'} (${info.data_region_buffers.map(formatBytes).join(', ')}; inputs and outputs share its high end)`],
      ['adapter limits', `maxBufferSize ${formatBytes(info.max_buffer_size)}, maxStorageBufferBindingSize ${formatBytes(info.max_storage_buffer_binding_size)}`],
      ['download', `${(downloadMs / 1000).toFixed(2)} s`],
      ['load (parse, compile, upload)', `${(info.load_ms / 1000).toFixed(2)} s`],
    ]);
    setState('load-state', 'ready', 'loaded');
    // A base model (Gemma 3 270M) has no chat template: its prompt is continued as text.
    $('chat').disabled = !info.chat_template;
    if (!info.chat_template) $('chat').checked = false;
    $('generate').disabled = false;
    setState('gen-state', 'idle', 'ready');
  } catch (e) {
    console.warn(e);
    setState('load-state', 'error', `failed: ${e?.message ?? e}`);
    $('load').disabled = false;
    $('model-name').disabled = false;
  }
}

/** Fills the model select from wasm.models(); `?model=NAME` in the URL chooses one. */
function fillModels() {
  knownModels = JSON.parse(wasm.models());
  const select = $('model-name');
  select.replaceChildren(...knownModels.map((m) => {
    const o = document.createElement('option');
    o.value = m.name;
    o.textContent = `${m.name} (${m.architecture}, ${formatBytes(m.bytes)})`;
    return o;
  }));
  const asked = new URLSearchParams(location.search).get('model');
  const initial = knownModels.find((m) => m.name === asked) ?? knownModels.find((m) => m.default) ?? knownModels[0];
  select.value = initial.name;
  const show = () => {
    const m = chosenModel();
    $('model-url').textContent = modelUrl();
    $('model-license').textContent = `${m.summary}. License: ${m.license}.`;
    setState('load-state', 'idle', `about ${formatBytes(m.bytes)} from this server`);
  };
  select.addEventListener('change', show);
  show();
}

function showGeneration(report) {
  const peak = KINDS.filter((k) => report.peak_bytes?.[k] > 0)
    .map((k) => `${k} ${formatBytes(report.peak_bytes[k])}`).join(', ') || '—';
  const regions = REGIONS.map((r) => `${r} ${formatBytes(report.regions[r].peak_bytes)}`).join(', ');
  showSummary('gen-summary', [
    ['adapter', `${escapeHtml(report.adapter || adapterLabel)} (${escapeHtml(report.backend)})`],
    ['policy', escapeHtml(report.policy)],
    ['tokens', `${report.prompt_tokens} prompt, ${report.tokens.length} generated (stop: ${escapeHtml(report.stop)})`],
    ['prefill', `${report.prefill_ms.toFixed(0)} ms, ${report.prefill_tokens_per_s.toFixed(1)} tokens/s`],
    ['decode', report.decode_steps > 0 ? `${report.decode_ms_per_token.toFixed(1)} ms/token, ${(1000 / report.decode_ms_per_token).toFixed(2)} tokens/s` : '—'],
    ['KV cache', `${formatBytes(report.kv_reserved_bytes)} reserved for ${formatBytes(report.kv_needed_bytes)} needed (${report.kv_reserved_over_needed.toFixed(2)}x)`],
    ['allocations', `${report.allocations} (${report.reallocations} reallocations)`],
    ['peak bytes per kind', peak],
    ['peak bytes per region', regions],
  ]);
  const tokens = $('llm-tokens');
  tokens.textContent = report.tokens.join(' ');
  tokens.className = 'mono';
  $('llm-result-json').textContent = JSON.stringify(report, null, 2);
}

async function generate(event) {
  event.preventDefault();
  if (!model || generating) return;
  generating = true;
  $('generate').disabled = true;
  const options = {
    prompt: $('prompt').value,
    chat: $('chat').checked,
    max_tokens: Number($('max-tokens').value),
    policy: $('llm-policy').value,
    temperature: Number($('temperature').value),
    seed: Number($('llm-seed').value),
  };
  const output = $('output');
  output.textContent = '';
  output.className = '';
  $('llm-result-json').textContent = '';
  const points = [];
  const decodeMs = [];
  drawMemory($('llm-chart-kinds'), $('llm-chart-regions'), points, options.max_tokens);
  setState('gen-state', 'running', 'prefill…');
  try {
    if (!Number.isInteger(options.max_tokens) || options.max_tokens < 1) throw new Error('max tokens must be a whole number ≥ 1');
    if (!Number.isInteger(options.seed) || options.seed < 0) throw new Error('seed must be a whole number ≥ 0');
    const onToken = (json) => {
      const e = JSON.parse(json);
      output.append(e.text);
      if (e.index > 0) decodeMs.push(e.forward_ms);
      if (e.memory) points.push({ ...e.memory, token: e.token });
      drawMemory($('llm-chart-kinds'), $('llm-chart-regions'), points, options.max_tokens);
      const mean = decodeMs.reduce((a, b) => a + b, 0) / Math.max(1, decodeMs.length);
      setState('gen-state', 'running', e.index === 0
        ? `prefill took ${e.forward_ms.toFixed(0)} ms; decoding…`
        : `${e.index + 1} tokens, ${mean.toFixed(1)} ms/token (${(1000 / mean).toFixed(2)} tokens/s)…`);
    };
    const report = JSON.parse(await model.generate(JSON.stringify(options), onToken));
    showGeneration(report);
    setState('gen-state', 'done', `done: ${report.tokens.length} tokens; prefill ${report.prefill_tokens_per_s.toFixed(1)} tokens/s, decode ${report.decode_ms_per_token.toFixed(1)} ms/token`);
  } catch (e) {
    console.warn(e);
    setState('gen-state', 'error', `failed: ${e?.message ?? e}`);
  } finally {
    generating = false;
    $('generate').disabled = false;
  }
}

async function main() {
  fillPolicySelect($('llm-policy'));
  fillPolicySelect($('policy'));
  const detected = await detectWebGpu();
  if (!detected.ok) {
    setGpuStatus('error', `<strong>No WebGPU.</strong> ${detected.why}`);
    return;
  }
  try {
    wasm = await import('./pkg/dynrt.js');
    await wasm.default();
  } catch (e) {
    setGpuStatus('error', `<strong>Could not load the wasm package</strong> (<code>web/pkg/</code>): ${escapeHtml(e?.message ?? e)}. Build it with <code>web/build.sh</code>.`);
    return;
  }
  let info;
  try {
    info = JSON.parse(await wasm.adapter_info());
  } catch (e) {
    setGpuStatus('error', `<strong>WebGPU is present but dynrt could not open a device:</strong> ${escapeHtml(e?.message ?? e)}`);
    return;
  }
  adapterLabel = info.name || detected.label || '';
  const check = info.self_check;
  setGpuStatus('ok', `<strong>WebGPU adapter:</strong> ${escapeHtml(info.name || detected.label || '(unnamed)')} · backend ${escapeHtml(info.backend)} · ${escapeHtml(info.device_type)}`
    + (info.driver ? ` · driver ${escapeHtml(info.driver)}` : '')
    + ` · dynrt ${escapeHtml(wasm.version())}`
    + (check ? `<br><span class="${check.passed ? 'pass' : 'fail'}">GPU self-check ${check.passed ? 'passed' : 'FAILED'}</span>: ${escapeHtml(check.detail)}` : ''));
  document.body.dataset.selfCheck = check ? String(check.passed) : 'absent';

  fillModels();
  $('load-form').addEventListener('submit', loadModel);
  $('llm-controls').addEventListener('submit', generate);
  $('load').disabled = false;

  if (typeof wasm.WebDemo !== 'function') {
    setRunState('unavailable', 'the decode demo is not in this wasm build yet (only the GPU self-check above)');
    return;
  }
  $('controls').addEventListener('submit', runDemo);
  $('run').disabled = false;
  setRunState('idle', 'ready');
}

main();
