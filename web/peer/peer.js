// The browser side of scripts/bench_peer.sh: runs one workload of scripts/peer_models.py's
// manifest on ONNX Runtime Web's WebGPU EP (onnxruntime-web, dist/ort.webgpu.mjs: its C++
// WebGPU EP compiled to wasm) or on dynrt's wasm package, step by step, with the same timing
// and the same counters (webgpu-count.js, injected before any script) for both.
//
// window.peer.run(runtime, row, steps) resolves to the document that scripts/peer/ort_native.py
// and `dynrt-bench onnx` print natively:
//   {runtime, provider, load_ms, steps: [{ms, counts}], peak_bytes, tokens}
// or {missing: "why"} when the runtime cannot run the workload here.
//
// A step is one run of the model and ends when its results are complete on the device: op
// workloads wait for the queue (GPUQueue.onSubmittedWorkDone: no read-back), decode workloads
// read the logits back for the argmax. Tensors stay on the GPU between steps: op inputs are
// GPU buffers written once (ORT: GPU tensors; dynrt: OnnxSession.keep) and the output a GPU
// buffer made once (ORT; dynrt's output stays in its placeholder); decode steps feed the
// presents of step k as the pasts of step k + 1 as GPU tensors. `counts` are the deltas of
// globalThis.__gpuCounts over the step; `peak_bytes` the most GPUBuffer bytes alive at once
// during the call (model load included) above what was alive before it.
import * as ort from './node_modules/onnxruntime-web/dist/ort.webgpu.mjs';

const statusEl = document.getElementById('status');
const logEl = document.getElementById('log');
const log = (s) => { logEl.textContent += `${s}\n`; };

ort.env.wasm.wasmPaths = new URL('./node_modules/onnxruntime-web/dist/', import.meta.url).href;
// No cross-origin isolation here, so no wasm threads: say so instead of letting ORT warn.
ort.env.wasm.numThreads = 1;
ort.env.logLevel = 'error';

let device = null;
let adapterInfo = null;

/** Parses a little-endian, C-order .npy file (f32, i64, i32) into {dtype, dims, data}. */
export function parseNpy(buf) {
  const bytes = new Uint8Array(buf);
  const magic = String.fromCharCode(...bytes.slice(1, 6));
  if (bytes[0] !== 0x93 || magic !== 'NUMPY') throw new Error('not a .npy file');
  const major = bytes[6];
  const hlen = major === 1 ? bytes[8] | (bytes[9] << 8) : new DataView(buf).getUint32(8, true);
  const hstart = major === 1 ? 10 : 12;
  const header = new TextDecoder().decode(bytes.slice(hstart, hstart + hlen));
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  if (/'fortran_order':\s*True/.test(header)) throw new Error('Fortran-order .npy is not supported');
  const dims = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim()).filter((s) => s).map(Number);
  const body = buf.slice(hstart + hlen);
  const kinds = { '<f4': ['float32', Float32Array], '<i8': ['int64', BigInt64Array], '<i4': ['int32', Int32Array] };
  if (!kinds[descr]) throw new Error(`unsupported .npy dtype ${descr}`);
  const [dtype, T] = kinds[descr];
  return { dtype, dims, data: new T(body) };
}

async function fetchBytes(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.arrayBuffer();
}

const counts = () => ({ ...globalThis.__gpuCounts });
function delta(a, b) {
  const d = {};
  for (const k of Object.keys(b)) if (typeof b[k] === 'number' && !k.startsWith('live') && !k.startsWith('peak')) d[k] = b[k] - (a[k] ?? 0);
  return d;
}
function argmaxLast(data, vocab) {
  let best = 0;
  const base = data.length - vocab;
  for (let i = 1; i < vocab; i += 1) if (data[base + i] > data[base + best]) best = i;
  return best;
}

async function init() {
  if (!navigator.gpu) throw new Error('no WebGPU in this browser');
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Error('no WebGPU adapter');
  adapterInfo = adapter.info ?? {};
  // ORT runs on this device (passed as the EP's `device` option), so the page can wait for
  // ORT's work with onSubmittedWorkDone. Its limits: what ORT itself asks for.
  const want = ['maxBufferSize', 'maxStorageBufferBindingSize', 'maxComputeWorkgroupStorageSize',
    'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX', 'maxComputeWorkgroupSizeY',
    'maxComputeWorkgroupSizeZ', 'maxComputeWorkgroupsPerDimension', 'maxStorageBuffersPerShaderStage'];
  const requiredLimits = {};
  for (const k of want) requiredLimits[k] = adapter.limits[k];
  const requiredFeatures = ['shader-f16', 'timestamp-query', 'subgroups'].filter((f) => adapter.features.has(f));
  device = await adapter.requestDevice({ requiredLimits, requiredFeatures });
  return {
    adapter: `${adapterInfo.vendor ?? ''} ${adapterInfo.architecture ?? ''} ${adapterInfo.description ?? ''}`.trim() || 'unknown',
    fallback: adapter.isFallbackAdapter ?? adapterInfo.isFallbackAdapter ?? null,
    ort: ort.env.versions?.web ?? 'unknown',
  };
}

// ---------------------------------------------------------------- ONNX Runtime Web -----------

async function ortSession(row, base) {
  // The page's device as the EP option (the C++ EP ignores env.webgpu.device when set).
  const opts = { executionProviders: [{ name: 'webgpu', device }], graphOptimizationLevel: 'all' };
  if (row.kind === 'decode') {
    opts.preferredOutputLocation = Object.fromEntries(row.outputs.map((o) => [o, o === row.logits ? 'cpu' : 'gpu-buffer']));
  } else {
    opts.preferredOutputLocation = 'gpu-buffer';
  }
  const modelUrl = `${base}/${row.model}`;
  if (row.external_data) {
    const dir = modelUrl.slice(0, modelUrl.lastIndexOf('/'));
    opts.externalData = row.external_data.map((name) => ({ path: name, data: `${dir}/${name}` }));
  }
  return ort.InferenceSession.create(modelUrl, opts);
}

function gpuTensor(feed) {
  const bytes = feed.data.byteLength;
  const buf = device.createBuffer({ size: Math.ceil(bytes / 16) * 16, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  device.queue.writeBuffer(buf, 0, feed.data);
  const tensor = ort.Tensor.fromGpuBuffer(buf, { dataType: feed.dtype, dims: feed.dims, dispose: () => buf.destroy() });
  return { tensor, buf, bytes };
}

/** The first `bytes` of a GPU buffer, as f32 (after the work queued before it). */
async function readF32(buf, bytes) {
  const staging = device.createBuffer({ size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(buf, 0, staging, 0, bytes);
  device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const out = new Float32Array(staging.getMappedRange().slice(0));
  staging.destroy();
  return out;
}

async function ortRun(row, steps, base, feeds) {
  const c0 = counts();
  const t0 = performance.now();
  const session = await ortSession(row, base);
  const loadMs = performance.now() - t0;
  const records = [];
  const tokens = [];
  let checkErr = null;
  if (row.kind === 'op') {
    const gpu = row.inputs.map((n) => gpuTensor(feeds[n]));
    const inputs = Object.fromEntries(row.inputs.map((n, i) => [n, gpu[i].tensor]));
    // The output buffer, made once (shape from a first run), passed as a pre-allocated fetch.
    const first = await session.run(inputs);
    const outName = row.outputs[0];
    const out = gpuTensor({ dtype: 'float32', dims: first[outName].dims, data: new Float32Array(first[outName].size) });
    first[outName].dispose();
    await device.queue.onSubmittedWorkDone();
    for (let s = 0; s < steps; s += 1) {
      const before = counts();
      const t = performance.now();
      await session.run(inputs, { [outName]: out.tensor });
      await device.queue.onSubmittedWorkDone();
      records.push({ ms: performance.now() - t, counts: delta(before, counts()) });
    }
    checkErr = checkOp(row, feeds, await readF32(out.buf, out.bytes));
    out.tensor.dispose();
    for (const g of gpu) g.tensor.dispose();
  } else {
    let cur = {};
    for (const n of row.inputs) cur[n] = new ort.Tensor(feeds[n].dtype, feeds[n].data, feeds[n].dims);
    let past = feeds[row.states[0][1]].dims[2];
    let owned = [];
    for (let s = 0; s < steps; s += 1) {
      const before = counts();
      const t = performance.now();
      const out = await session.run(cur);
      const logits = out[row.logits];
      const token = argmaxLast(logits.data, logits.dims[logits.dims.length - 1]);
      records.push({ ms: performance.now() - t, counts: delta(before, counts()) });
      tokens.push(token);
      for (const x of owned) x.dispose();
      past += cur[row.token_input].dims[1];
      cur = { [row.token_input]: new ort.Tensor('int64', BigInt64Array.from([BigInt(token)]), [1, 1]) };
      if (row.position_input) cur[row.position_input] = new ort.Tensor('int64', BigInt64Array.from([BigInt(past)]), [1, 1]);
      owned = [];
      for (const [o, i] of row.states) { cur[i] = out[o]; owned.push(out[o]); }
    }
    for (const x of owned) x.dispose();
  }
  await session.release();
  const c1 = counts();
  return {
    runtime: 'ort',
    provider: `onnxruntime-web ${ort.env.versions?.web ?? ''} webgpu (ort.webgpu.mjs)`,
    load_ms: loadMs,
    steps: records,
    peak_bytes: c1.peakLiveBytes - c0.liveBytes,
    tokens,
    check_error: checkErr,
  };
}

/** The largest difference from a CPU reference (sampled for matmul), or a message. */
function checkOp(row, feeds, got) {
  const a = feeds[row.inputs[0]].data;
  const b = feeds[row.inputs[1]].data;
  let err = 0;
  if (row.op === 'MatMul') {
    const n = feeds[row.inputs[0]].dims[0];
    for (let k = 0; k < 64; k += 1) {
      const i = (k * 7919) % n;
      const j = (k * 104729) % n;
      let acc = 0;
      for (let p = 0; p < n; p += 1) acc += a[i * n + p] * b[p * n + j];
      err = Math.max(err, Math.abs(acc - got[i * n + j]));
    }
    return err <= 1e-4 * Math.sqrt(n) ? null : `matmul differs from the CPU by ${err}`;
  }
  const f = row.op === 'Add' ? (x, y) => x + y : (x, y) => x * y;
  for (let i = 0; i < a.length; i += 1) err = Math.max(err, Math.abs(Math.fround(f(a[i], b[i])) - got[i]));
  return err <= 1e-6 ? null : `${row.op} differs from the CPU by ${err}`;
}

// ---------------------------------------------------------------- dynrt (wasm) ---------------

let dynrtModule;
/** dynrt's wasm package, or a reason why it cannot run ONNX files in this page. */
async function dynrt() {
  if (dynrtModule !== undefined) return dynrtModule;
  try {
    const m = await import('/pkg/dynrt.js');
    await m.default();
    dynrtModule = typeof m.OnnxSession === 'function' ? m
      : { missing: "dynrt's wasm package has no OnnxSession export yet (its interface: scripts/bench_peer.sh): no dynrt figures in the browser" };
  } catch (e) {
    dynrtModule = { missing: `dynrt's wasm package did not load (web/build.sh builds it): ${e}` };
  }
  return dynrtModule;
}

/** Encodes {dtype, dims, data} as .npy bytes (what dynrt's OnnxSession takes and returns). */
function npyBytes(feed) {
  const descr = { float32: '<f4', int64: '<i8', int32: '<i4' }[feed.dtype];
  const shape = feed.dims.length === 1 ? `(${feed.dims[0]},)` : `(${feed.dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat(64 - ((10 + header.length + 1) % 64)) + '\n';
  const out = new Uint8Array(10 + header.length + feed.data.byteLength);
  out.set([0x93, 78, 85, 77, 80, 89, 1, 0, header.length & 255, header.length >> 8]);
  out.set(new TextEncoder().encode(header), 10);
  out.set(new Uint8Array(feed.data.buffer, feed.data.byteOffset, feed.data.byteLength), 10 + header.length);
  return out;
}

async function dynrtRun(row, steps, base, feeds) {
  const m = await dynrt();
  if (m.missing) return { missing: m.missing };
  const c0 = counts();
  const t0 = performance.now();
  const model = new Uint8Array(await fetchBytes(`${base}/${row.model}`));
  const dir = `${base}/${row.model}`.slice(0, `${base}/${row.model}`.lastIndexOf('/'));
  const extNames = row.external_data ?? [];
  const extBytes = [];
  for (const name of extNames) extBytes.push(new Uint8Array(await fetchBytes(`${dir}/${name}`)));
  const session = await m.OnnxSession.create(model, extNames, extBytes);
  const loadMs = performance.now() - t0;
  const records = [];
  const tokens = [];
  let checkErr = null;
  const names = row.inputs;
  const npy = names.map((n) => npyBytes(feeds[n]));
  if (row.kind === 'op') {
    // The inputs stay on the device (written once, by the first run), as ORT's GPU tensors do.
    session.keep(names, npy);
    for (let s = 0; s < steps; s += 1) {
      const before = counts();
      const t = performance.now();
      await session.run([], [], [], []);
      records.push({ ms: performance.now() - t, counts: delta(before, counts()) });
    }
    const [out] = await session.run([], [], [row.outputs[0]], []);
    checkErr = checkOp(row, feeds, parseNpy(out.buffer.slice(out.byteOffset, out.byteOffset + out.byteLength)).data);
  } else {
    let curNames = names;
    let curNpy = npy;
    let past = feeds[row.states[0][1]].dims[2];
    for (let s = 0; s < steps; s += 1) {
      const before = counts();
      const t = performance.now();
      const [lg] = await session.run(curNames, curNpy, [row.logits], row.states);
      const logits = parseNpy(lg.buffer.slice(lg.byteOffset, lg.byteOffset + lg.byteLength));
      const token = argmaxLast(logits.data, logits.dims[logits.dims.length - 1]);
      records.push({ ms: performance.now() - t, counts: delta(before, counts()) });
      tokens.push(token);
      past += s === 0 ? feeds[row.token_input].dims[1] : 1;
      curNames = [row.token_input];
      curNpy = [npyBytes({ dtype: 'int64', dims: [1, 1], data: BigInt64Array.from([BigInt(token)]) })];
      if (row.position_input) {
        curNames.push(row.position_input);
        curNpy.push(npyBytes({ dtype: 'int64', dims: [1, 1], data: BigInt64Array.from([BigInt(past)]) }));
      }
    }
  }
  session.free();
  const c1 = counts();
  return { runtime: 'dynrt', provider: 'dynrt wasm', load_ms: loadMs, steps: records, peak_bytes: c1.peakLiveBytes - c0.liveBytes, tokens, check_error: checkErr };
}

// ---------------------------------------------------------------- driver entry ---------------

const feedCache = new Map();
async function loadFeeds(row, base) {
  if (feedCache.has(row.workload)) return feedCache.get(row.workload);
  const feeds = {};
  for (const n of row.inputs) feeds[n] = parseNpy(await fetchBytes(`${base}/${row.feeds}/${n}.npy`));
  feedCache.clear();
  feedCache.set(row.workload, feeds);
  return feeds;
}

window.peer = {
  init,
  dynrtStatus: async () => (await dynrt()).missing ?? null,
  async run(runtime, row, steps, base = '/models') {
    const feeds = await loadFeeds(row, base);
    globalThis.__gpuCounts.peakLiveBytes = globalThis.__gpuCounts.liveBytes;
    const doc = runtime === 'ort' ? await ortRun(row, steps, base, feeds) : await dynrtRun(row, steps, base, feeds);
    log(`${runtime} ${row.workload}: ${doc.missing ?? `${doc.steps.length} steps`}`);
    return doc;
  },
};
statusEl.dataset.state = 'ready';
statusEl.textContent = 'ready';
