// Injected before any page script (playwright addInitScript): counts WebGPU API calls in
// globalThis.__gpuCounts, the same counter for every runtime in the page (web/peer/run.mjs).
// liveBytes / peakLiveBytes: GPUBuffer bytes created and not yet destroyed, now and at the
// most (a buffer dropped without destroy() stays counted until the page ends).
(() => {
  const C = { createBuffer: 0, createBufferBytes: 0, destroyBuffer: 0, submit: 0, dispatch: 0,
              writeBuffer: 0, writeBufferBytes: 0, mapAsync: 0, createComputePipeline: 0, createBindGroup: 0,
              liveBytes: 0, peakLiveBytes: 0 };
  globalThis.__gpuCounts = C;
  if (typeof GPUDevice === 'undefined') return;
  const sizes = new WeakMap();
  const wrap = (proto, name, before, after) => {
    if (!proto || !proto[name]) return;
    const orig = proto[name];
    proto[name] = function (...a) {
      if (before) before(a, this);
      const r = orig.apply(this, a);
      if (after) after(a, r, this);
      return r;
    };
  };
  wrap(GPUDevice.prototype, 'createBuffer', (a) => { C.createBuffer++; C.createBufferBytes += a[0].size; }, (a, buf) => {
    sizes.set(buf, a[0].size);
    C.liveBytes += a[0].size;
    C.peakLiveBytes = Math.max(C.peakLiveBytes, C.liveBytes);
  });
  wrap(GPUDevice.prototype, 'createComputePipeline', () => C.createComputePipeline++);
  wrap(GPUDevice.prototype, 'createComputePipelineAsync', () => C.createComputePipeline++);
  wrap(GPUDevice.prototype, 'createBindGroup', () => C.createBindGroup++);
  wrap(GPUBuffer.prototype, 'destroy', (a, buf) => {
    C.destroyBuffer++;
    const s = sizes.get(buf);
    if (s !== undefined) { C.liveBytes -= s; sizes.delete(buf); }
  });
  wrap(GPUBuffer.prototype, 'mapAsync', () => C.mapAsync++);
  wrap(GPUQueue.prototype, 'submit', () => C.submit++);
  wrap(GPUQueue.prototype, 'writeBuffer', (a) => { C.writeBuffer++; C.writeBufferBytes += (a[4] ?? (a[2].byteLength - (a[3] || 0))); });
  wrap(GPUComputePassEncoder.prototype, 'dispatchWorkgroups', () => C.dispatch++);
  wrap(GPUComputePassEncoder.prototype, 'dispatchWorkgroupsIndirect', () => C.dispatch++);
})();
