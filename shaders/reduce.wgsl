// Reductions: normalisations along one axis or the trailing axes, reductions over any set of
// axes, and the cumulative sum.
//
// Entry points (one workgroup of 64 invocations per row; the row is the prelude's
// workgroup_index, so more than 65535 rows work):
//   reduce_softmax     out = exp(x - max) / sum(exp(x - max)) along a row of d elements
//                      inner apart: row r starts at (r / inner) * d * inner + r % inner, so
//                      inner = 1 is the last axis and inner > 1 any other axis without a
//                      transpose; flags bit 0: log-softmax, x - max - log(sum(exp(x - max)))
//   reduce_softmax_rows  the same with one invocation per row (software adapters)
//   reduce_layer_norm  out = (x - mean) / sqrt(var + eps) * gamma + beta   (two-pass variance;
//                      a row is the d trailing elements, contiguous)
//   reduce_layer_norm_nobias  the same without beta
//   reduce_rms_norm    out = x / sqrt(mean(x^2) + eps) * gamma
//   reduce_axes_input  the same, the axes read from their buffer (ONNX's axes input)
//   reduce_axes        one output element per row: the reduction (override REDUCE_OP: 0 sum,
//                      1 mean, 2 max, 3 min, 4 1 / sqrt(biased variance + eps)) of the d input
//                      elements whose kept coordinates are the row's. The row's coordinates
//                      come from kept_shape / kept_strides, each reduced element's from
//                      red_shape / red_strides (input strides, rank <= 8 each). Nothing to
//                      reduce gives 0 (sum), NaN (mean, inverse deviation), -inf (max),
//                      +inf (min).
//   reduce_cumsum      one invocation per line (d elements inner apart, like softmax's rows):
//                      running f32 sums, flags bit 0 exclusive, bit 1 reverse
//   reduce_cumsum_i32  the same on i32 values (wrapping adds), through i32 views of bindings
//                      1 and 4
// Partial sums are combined by a tree in workgroup memory; accumulation is f32 (the CPU
// reference uses f64; tests state the tolerance). Only reduce_axes is specialised (REDUCE_OP).
//
// Bindings (group 0); each entry point uses only the bindings it names:
//   0 uniform  RowParams | AxesParams | CumParams (dynamic offset)
//   1 storage read_write  x      [rows, d]
//   2 storage read_write  gamma  [d]   (layer_norm, rms_norm) / axes (reduce_axes_input)
//   3 storage read_write  beta   [d]   (layer_norm)
//   4 storage read_write  out
//
// Rust mirrors (src/gpu/kernels/reduce.rs, #[repr(C)], bytemuck::Pod):
//   struct RowParams { rows: u32, d: u32, x_offset: u32, out_offset: u32,
//                      gamma_offset: u32, beta_offset: u32, eps: f32, inner: u32,
//                      flags: u32, _pad: [u32; 3] }                                  // 48 bytes
//   struct AxesParams { rows: u32, d: u32, x_offset: u32, out_offset: u32,
//                       kept_rank: u32, red_rank: u32, eps: f32, axes_offset: u32,
//                       axes_words: u32, flags: u32, _pad: [u32; 2],
//                       kept_shape: [[u32; 4]; 2], kept_strides: [[u32; 4]; 2],
//                       red_shape: [[u32; 4]; 2], red_strides: [[u32; 4]; 2] }       // 176 bytes
//   struct CumParams { lines: u32, d: u32, inner: u32, x_offset: u32, out_offset: u32,
//                      flags: u32, _pad: [u32; 2] }                                  // 32 bytes
// Offsets are in 32-bit elements from the start of each binding.

struct RowParams {
    rows: u32,
    d: u32,
    x_offset: u32,
    out_offset: u32,
    gamma_offset: u32,
    beta_offset: u32,
    eps: f32,
    inner: u32,
    flags: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct AxesParams {
    rows: u32,
    d: u32,
    x_offset: u32,
    out_offset: u32,
    kept_rank: u32,
    red_rank: u32,
    eps: f32,
    axes_offset: u32,
    axes_words: u32,
    flags: u32,
    _pad0: u32,
    _pad1: u32,
    kept_shape: array<vec4<u32>, 2>,
    kept_strides: array<vec4<u32>, 2>,
    red_shape: array<vec4<u32>, 2>,
    red_strides: array<vec4<u32>, 2>,
}

struct CumParams {
    lines: u32,
    d: u32,
    inner: u32,
    x_offset: u32,
    out_offset: u32,
    flags: u32,
    _pad0: u32,
    _pad1: u32,
}

override REDUCE_OP: u32 = 0u;

@group(0) @binding(0) var<uniform> p: RowParams;
@group(0) @binding(0) var<uniform> ap: AxesParams;
@group(0) @binding(0) var<uniform> cp: CumParams;
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
    let row = workgroup_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let inner = p.inner;
    let start = (row / inner) * p.d * inner + row % inner;
    let xb = p.x_offset + start;
    let ob = p.out_offset + start;
    // A row of masked scores (all F32_LOWEST) still gives a finite maximum.
    var m = F32_LOWEST;
    for (var i = lid; i < p.d; i += WG) {
        m = max(m, x[xb + i * inner]);
    }
    m = reduce_max(lid, m);
    var s = 0.0;
    for (var i = lid; i < p.d; i += WG) {
        s += exp(x[xb + i * inner] - m);
    }
    s = reduce_sum(lid, s);
    if (p.flags & 1u) != 0u {
        // (x - max) first: it is exact for the large entries, whose rounding would otherwise
        // swamp a small result.
        let ls = log(s);
        for (var i = lid; i < p.d; i += WG) {
            dst[ob + i * inner] = (x[xb + i * inner] - m) - ls;
        }
    } else {
        let inv = 1.0 / s;
        for (var i = lid; i < p.d; i += WG) {
            dst[ob + i * inner] = exp(x[xb + i * inner] - m) * inv;
        }
    }
}

// reduce_softmax on software adapters: one invocation per row, 64 rows per workgroup. A
// workgroup there runs on one CPU thread, and the two tree reductions of reduce_softmax (14
// barriers) cost more than the rows of attention scores they reduce.
@compute @workgroup_size(64)
fn reduce_softmax_rows(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = workgroup_index(wid, nwg) * WG + lid;
    if row >= p.rows {
        return;
    }
    let inner = p.inner;
    let start = (row / inner) * p.d * inner + row % inner;
    let xb = p.x_offset + start;
    let ob = p.out_offset + start;
    var m = F32_LOWEST;
    for (var i = 0u; i < p.d; i++) {
        m = max(m, x[xb + i * inner]);
    }
    var s = 0.0;
    for (var i = 0u; i < p.d; i++) {
        s += exp(x[xb + i * inner] - m);
    }
    if (p.flags & 1u) != 0u {
        let ls = log(s);
        for (var i = 0u; i < p.d; i++) {
            dst[ob + i * inner] = (x[xb + i * inner] - m) - ls;
        }
    } else {
        let inv = 1.0 / s;
        for (var i = 0u; i < p.d; i++) {
            dst[ob + i * inner] = exp(x[xb + i * inner] - m) * inv;
        }
    }
}

// Mean and 1 / sqrt(var + eps) of the row starting at xb (every invocation gets both).
fn row_stats(lid: u32, xb: u32) -> vec2<f32> {
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
    return vec2<f32>(mean, inverseSqrt(reduce_sum(lid, v) / fd + p.eps));
}

@compute @workgroup_size(64)
fn reduce_layer_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = workgroup_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let xb = p.x_offset + row * p.d;
    let ob = p.out_offset + row * p.d;
    let st = row_stats(lid, xb);
    for (var i = lid; i < p.d; i += WG) {
        dst[ob + i] = (x[xb + i] - st.x) * st.y * gamma[p.gamma_offset + i] + beta[p.beta_offset + i];
    }
}

@compute @workgroup_size(64)
fn reduce_layer_norm_nobias(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = workgroup_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let xb = p.x_offset + row * p.d;
    let ob = p.out_offset + row * p.d;
    let st = row_stats(lid, xb);
    for (var i = lid; i < p.d; i += WG) {
        dst[ob + i] = (x[xb + i] - st.x) * st.y * gamma[p.gamma_offset + i];
    }
}

@compute @workgroup_size(64)
fn reduce_rms_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = workgroup_index(wid, nwg);
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

// Offset of the i-th element of a shape (row-major) under per-dimension strides.
fn strided_offset(i: u32, rank: u32, shape: array<vec4<u32>, 2>, strides: array<vec4<u32>, 2>) -> u32 {
    var rem = i;
    var off = 0u;
    for (var k = 0u; k < rank; k++) {
        let d = rank - 1u - k;
        let ext = shape[d / 4u][d % 4u];
        off += (rem % ext) * strides[d / 4u][d % 4u];
        rem = rem / ext;
    }
    return off;
}

// The reduction (REDUCE_OP) of the d elements base + strided_offset(i, red...), every
// invocation of the workgroup taking part; the result is valid in every invocation.
fn reduce_row(lid: u32, base: u32, d: u32, red_rank: u32, red_shape: array<vec4<u32>, 2>, red_strides: array<vec4<u32>, 2>, eps: f32) -> f32 {
    var acc = 0.0;
    if REDUCE_OP == 2u || REDUCE_OP == 3u {
        // The minimum is minus the maximum of the negated values.
        let sign = select(1.0, -1.0, REDUCE_OP == 3u);
        var m = -inf_f32();
        for (var i = lid; i < d; i += WG) {
            m = max(m, sign * x[base + strided_offset(i, red_rank, red_shape, red_strides)]);
        }
        acc = sign * reduce_max(lid, m);
    } else {
        var s = 0.0;
        for (var i = lid; i < d; i += WG) {
            s += x[base + strided_offset(i, red_rank, red_shape, red_strides)];
        }
        acc = reduce_sum(lid, s);
        if REDUCE_OP != 0u {
            // Mean (NaN for nothing: 0 / 0 is not portable WGSL, so say it).
            var mean = nan_f32();
            if d > 0u {
                mean = acc / f32(d);
            }
            acc = mean;
            if REDUCE_OP == 4u {
                var v = 0.0;
                for (var i = lid; i < d; i += WG) {
                    let c = x[base + strided_offset(i, red_rank, red_shape, red_strides)] - mean;
                    v += c * c;
                }
                acc = inverseSqrt(reduce_sum(lid, v) / f32(d) + eps);
            }
        }
    }
    return acc;
}

@compute @workgroup_size(64)
fn reduce_axes(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = workgroup_index(wid, nwg);
    if row >= ap.rows {
        return;
    }
    let base = ap.x_offset + strided_offset(row, ap.kept_rank, ap.kept_shape, ap.kept_strides);
    let acc = reduce_row(lid, base, ap.d, ap.red_rank, ap.red_shape, ap.red_strides, ap.eps);
    if lid == 0u {
        dst[ap.out_offset + row] = acc;
    }
}

// reduce_axes_input: the same with the axes read from binding 2 (i32, or the low words of
// i64; axes_words apart from axes_offset): AxesParams' kept_shape holds x's shape and
// kept_strides its strides (rank kept_rank), d the number of axes, flags bit 0
// noop_with_empty_axes.
@group(0) @binding(2) var<storage, read_write> axes_buf: array<i32>;

@compute @workgroup_size(64)
fn reduce_axes_input(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = workgroup_index(wid, nwg);
    if row >= ap.rows {
        return;
    }
    let rank = ap.kept_rank;
    // Which dimensions are reduced: the listed ones (negative from the end), every one when
    // none is listed, none when none is listed and noop_with_empty_axes.
    var reduced = array<bool, 8>();
    for (var k = 0u; k < ap.d; k++) {
        var a = axes_buf[ap.axes_offset + k * ap.axes_words];
        if a < 0 {
            a += i32(rank);
        }
        if a >= 0 && a < i32(rank) {
            reduced[a] = true;
        }
    }
    if ap.d == 0u && (ap.flags & 1u) == 0u {
        for (var k = 0u; k < rank; k++) {
            reduced[k] = true;
        }
    }
    var kept_shape = array<vec4<u32>, 2>();
    var kept_strides = array<vec4<u32>, 2>();
    var red_shape = array<vec4<u32>, 2>();
    var red_strides = array<vec4<u32>, 2>();
    var nk = 0u;
    var nr = 0u;
    var d = 1u;
    for (var k = 0u; k < rank; k++) {
        let ext = ap.kept_shape[k / 4u][k % 4u];
        let st = ap.kept_strides[k / 4u][k % 4u];
        if reduced[k] {
            red_shape[nr / 4u][nr % 4u] = ext;
            red_strides[nr / 4u][nr % 4u] = st;
            nr += 1u;
            d *= ext;
        } else {
            kept_shape[nk / 4u][nk % 4u] = ext;
            kept_strides[nk / 4u][nk % 4u] = st;
            nk += 1u;
        }
    }
    let base = ap.x_offset + strided_offset(row, nk, kept_shape, kept_strides);
    let acc = reduce_row(lid, base, d, nr, red_shape, red_strides, 0.0);
    if lid == 0u {
        dst[ap.out_offset + row] = acc;
    }
}

// Element j of a cumulative-sum line: its offset from the start of the tensor.
fn cum_at(line: u32, step: u32) -> u32 {
    var j = step;
    if (cp.flags & 2u) != 0u {
        j = cp.d - 1u - step;
    }
    return (line / cp.inner) * cp.d * cp.inner + line % cp.inner + j * cp.inner;
}

@compute @workgroup_size(64)
fn reduce_cumsum(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let line = workgroup_index(wid, nwg) * WG + lid;
    if line >= cp.lines {
        return;
    }
    let exclusive = (cp.flags & 1u) != 0u;
    var sum = 0.0;
    for (var step = 0u; step < cp.d; step++) {
        let at = cum_at(line, step);
        let before = sum;
        sum += x[cp.x_offset + at];
        dst[cp.out_offset + at] = select(sum, before, exclusive);
    }
}

// The i32 cumulative sum reads and writes integer views of the same bindings (the f32
// arrays above are never used by this entry point, so no float ever holds integer bits).
@group(0) @binding(1) var<storage, read_write> xi: array<i32>;
@group(0) @binding(4) var<storage, read_write> dsti: array<i32>;

@compute @workgroup_size(64)
fn reduce_cumsum_i32(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let line = workgroup_index(wid, nwg) * WG + lid;
    if line >= cp.lines {
        return;
    }
    let exclusive = (cp.flags & 1u) != 0u;
    var sum = 0i;
    for (var step = 0u; step < cp.d; step++) {
        let at = cum_at(line, step);
        let before = sum;
        sum += xi[cp.x_offset + at];
        dsti[cp.out_offset + at] = select(sum, before, exclusive);
    }
}
