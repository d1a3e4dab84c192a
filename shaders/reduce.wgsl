// Reductions over the last axis: softmax, layer norm, RMS norm.
//
// Entry points (one workgroup of 64 invocations per row; rows are linearised over a 2-D grid,
// row = wid.x + wid.y * num_workgroups.x, so more than 65535 rows work):
//   reduce_softmax     out = exp(x - max) / sum(exp(x - max))        (numerically stable)
//   reduce_layer_norm  out = (x - mean) / sqrt(var + eps) * gamma + beta   (two-pass variance)
//   reduce_rms_norm    out = x / sqrt(mean(x^2) + eps) * gamma
// Partial sums are combined by a tree in workgroup memory; accumulation is f32 (the CPU
// reference uses f64; tests state the tolerance). No specialisation: one pipeline per entry.
//
// Bindings (group 0); each entry point uses only the bindings it names:
//   0 uniform  RowParams (dynamic offset)
//   1 storage read_write  x      [rows, d]
//   2 storage read_write  gamma  [d]   (layer_norm, rms_norm)
//   3 storage read_write  beta   [d]   (layer_norm)
//   4 storage read_write  out    [rows, d]
//
// Rust mirror (src/gpu/kernels/reduce.rs, #[repr(C)], bytemuck::Pod), 32 bytes:
//   struct RowParams { rows: u32, d: u32, x_offset: u32, out_offset: u32,
//                      gamma_offset: u32, beta_offset: u32, eps: f32, _pad: u32 }
// Offsets are in f32 elements from the start of each binding.

struct RowParams {
    rows: u32,
    d: u32,
    x_offset: u32,
    out_offset: u32,
    gamma_offset: u32,
    beta_offset: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: RowParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> gamma: array<f32>;
@group(0) @binding(3) var<storage, read_write> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, 64>;

fn reduce_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if lid < s {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn reduce_softmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let xb = p.x_offset + row * p.d;
    let ob = p.out_offset + row * p.d;
    // Lowest finite f32: a row of masked scores (all -3.4e38) still gives a finite maximum.
    var m = -3.4028234663852886e38;
    for (var i = lid; i < p.d; i += WG) {
        m = max(m, x[xb + i]);
    }
    m = reduce_max(lid, m);
    var s = 0.0;
    for (var i = lid; i < p.d; i += WG) {
        s += exp(x[xb + i] - m);
    }
    s = reduce_sum(lid, s);
    let inv = 1.0 / s;
    for (var i = lid; i < p.d; i += WG) {
        dst[ob + i] = exp(x[xb + i] - m) * inv;
    }
}

@compute @workgroup_size(64)
fn reduce_layer_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let xb = p.x_offset + row * p.d;
    let ob = p.out_offset + row * p.d;
    let fd = f32(p.d);
    var s = 0.0;
    for (var i = lid; i < p.d; i += WG) {
        s += x[xb + i];
    }
    let mean = reduce_sum(lid, s) / fd;
    var v = 0.0;
    for (var i = lid; i < p.d; i += WG) {
        let c = x[xb + i] - mean;
        v += c * c;
    }
    let inv = inverseSqrt(reduce_sum(lid, v) / fd + p.eps);
    for (var i = lid; i < p.d; i += WG) {
        dst[ob + i] = (x[xb + i] - mean) * inv * gamma[p.gamma_offset + i] + beta[p.beta_offset + i];
    }
}

@compute @workgroup_size(64)
fn reduce_rms_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let xb = p.x_offset + row * p.d;
    let ob = p.out_offset + row * p.d;
    var s = 0.0;
    for (var i = lid; i < p.d; i += WG) {
        let v = x[xb + i];
        s += v * v;
    }
    let inv = inverseSqrt(reduce_sum(lid, s) / f32(p.d) + p.eps);
    for (var i = lid; i < p.d; i += WG) {
        dst[ob + i] = x[xb + i] * inv * gamma[p.gamma_offset + i];
    }
}
