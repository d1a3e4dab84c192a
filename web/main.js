// The demo page: checks for WebGPU, loads the wasm package built by web/build.sh, runs the
// decode demo step by step and draws bytes in use per memory kind as it goes.
//
// Everything the test (web/test.mjs) reads is in the DOM: #gpu-status[data-state],
// #run-state[data-state], #result-json (the final report as JSON), #chart[data-points].

const KINDS = ['usm_device', 'usm_host', 'usm_shared', 'cl_mem'];
const KIND_COLOURS = {
  usm_device: '#1f77b4',
  usm_host: '#ff7f0e',
  usm_shared: '#2ca02c',
  cl_mem: '#9467bd',
};

const $ = (id) => document.getElementById(id);

function setGpuStatus(state, html) {
  const el = $('gpu-status');
  el.dataset.state = state;
  el.className = `panel ${state === 'ok' ? 'ok' : state === 'error' ? 'error' : ''}`;
  el.innerHTML = html;
}

function setRunState(state, text) {
  const el = $('run-state');
  el.dataset.state = state;
  el.textContent = text;
  el.className = state === 'error' ? 'fail' : 'muted';
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
 * Draws `points` ([{step, bytes_in_use: {kind: n}, reallocations: n}]) into
 * #chart. `totalSteps` fixes the x axis so the chart grows left to right while running.
 */
export function drawChart(points, totalSteps) {
  const host = $('chart');
  const W = 900;
  const H = 320;
  const M = { left: 80, right: 20, top: 16, bottom: 44 };
  const plotW = W - M.left - M.right;
  const plotH = H - M.top - M.bottom;
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'bytes in use per memory kind over the decode steps' });

  const xMax = Math.max(1, totalSteps - 1, ...points.map((p) => p.step));
  let yMax = 1;
  for (const p of points) for (const k of KINDS) yMax = Math.max(yMax, p.bytes_in_use[k] ?? 0);
  yMax *= 1.08;
  const x = (step) => M.left + (step / xMax) * plotW;
  const y = (b) => M.top + plotH - (b / yMax) * plotH;

  // Axes and grid.
  svg.append(svgEl('rect', { x: M.left, y: M.top, width: plotW, height: plotH, fill: '#fff', stroke: '#ccc' }));
  for (let i = 0; i <= 4; i += 1) {
    const b = (yMax / 1.08) * (i / 4);
    svg.append(svgEl('line', { x1: M.left, x2: M.left + plotW, y1: y(b), y2: y(b), stroke: '#eee' }));
    svg.append(svgEl('text', { x: M.left - 6, y: y(b) + 4, 'text-anchor': 'end', 'font-size': 11, fill: '#555' }, formatBytes(Math.round(b))));
  }
  const xTicks = Math.min(8, xMax);
  for (let i = 0; i <= xTicks; i += 1) {
    const s = Math.round((xMax * i) / xTicks);
    svg.append(svgEl('text', { x: x(s), y: M.top + plotH + 16, 'text-anchor': 'middle', 'font-size': 11, fill: '#555' }, String(s)));
  }
  svg.append(svgEl('text', { x: M.left + plotW / 2, y: H - 8, 'text-anchor': 'middle', 'font-size': 12, fill: '#333' }, 'step'));

  // One line per kind that was ever non-zero.
  const used = KINDS.filter((k) => points.some((p) => (p.bytes_in_use[k] ?? 0) > 0));
  for (const k of used) {
    const d = points.map((p, i) => `${i ? 'L' : 'M'}${x(p.step).toFixed(1)},${y(p.bytes_in_use[k] ?? 0).toFixed(1)}`).join('');
    svg.append(svgEl('path', { d, fill: 'none', stroke: KIND_COLOURS[k], 'stroke-width': 2, class: `series series-${k}` }));
  }

  // Reallocations: a dashed line at every step that made real allocations, and a marker on
  // the line of the kind whose bytes grew most in that step (the runtime counts them per step).
  let nMarks = 0;
  points.forEach((p, i) => {
    const n = p.reallocations ?? 0;
    if (n === 0) return;
    const prev = i > 0 ? points[i - 1].bytes_in_use : {};
    let k = used[0] ?? KINDS[0];
    let growth = -Infinity;
    for (const kind of used) {
      const g = (p.bytes_in_use[kind] ?? 0) - (prev[kind] ?? 0);
      if (g > growth) { growth = g; k = kind; }
    }
    const cx = x(p.step);
    const cy = y(p.bytes_in_use[k] ?? 0);
    svg.append(svgEl('line', { x1: cx, x2: cx, y1: M.top, y2: M.top + plotH, stroke: '#c62828', 'stroke-opacity': 0.25, 'stroke-dasharray': '3 3' }));
    const mark = svgEl('circle', { cx, cy, r: 3 + Math.min(4, n), fill: '#c62828', stroke: '#fff', class: 'realloc' });
    mark.append(svgEl('title', {}, `step ${p.step}: ${n} allocation${n === 1 ? '' : 's'} (${k} grew by ${formatBytes(Math.max(0, growth))})`));
    svg.append(mark);
    nMarks += n;
  });

  // Legend.
  let lx = M.left + 8;
  for (const k of used) {
    svg.append(svgEl('line', { x1: lx, x2: lx + 18, y1: M.top + 12, y2: M.top + 12, stroke: KIND_COLOURS[k], 'stroke-width': 3 }));
    svg.append(svgEl('text', { x: lx + 22, y: M.top + 16, 'font-size': 12, fill: '#333' }, k));
    lx += 110;
  }
  svg.append(svgEl('circle', { cx: lx + 6, cy: M.top + 12, r: 4, fill: '#c62828' }));
  svg.append(svgEl('text', { x: lx + 14, y: M.top + 16, 'font-size': 12, fill: '#333' }, `real allocations (${nMarks})`));

  host.replaceChildren(svg);
  host.dataset.points = String(points.length);
  host.dataset.reallocMarks = String(nMarks);
}

// ---------------------------------------------------------------------------------------
// Result table.

function showSummary(rows) {
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
  $('summary').replaceChildren(tbody);
}

function showReport(report, tolerance) {
  const errOk = report.max_abs_err <= tolerance;
  const peak = KINDS.filter((k) => report.peak_bytes?.[k] > 0)
    .map((k) => `${k} ${formatBytes(report.peak_bytes[k])}`).join(', ') || '—';
  showSummary([
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
    drawChart(points, steps);
    for (;;) {
      const json = await demo.step();
      if (json === undefined || json === null) break;
      const point = JSON.parse(json);
      points.push(point);
      drawChart(points, steps);
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

async function main() {
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
  const check = info.self_check;
  setGpuStatus('ok', `<strong>WebGPU adapter:</strong> ${escapeHtml(info.name || detected.label || '(unnamed)')} · backend ${escapeHtml(info.backend)} · ${escapeHtml(info.device_type)}`
    + (info.driver ? ` · driver ${escapeHtml(info.driver)}` : '')
    + ` · dynrt ${escapeHtml(wasm.version())}`
    + (check ? `<br><span class="${check.passed ? 'pass' : 'fail'}">GPU self-check ${check.passed ? 'passed' : 'FAILED'}</span>: ${escapeHtml(check.detail)}` : ''));
  document.body.dataset.selfCheck = check ? String(check.passed) : 'absent';

  if (typeof wasm.WebDemo !== 'function') {
    setRunState('unavailable', 'the decode demo is not in this wasm build yet (only the GPU self-check above)');
    return;
  }
  $('controls').addEventListener('submit', runDemo);
  $('run').disabled = false;
  setRunState('idle', 'ready');
}

main();
