// The matrix-vector kernels of the quant family (quant_matvec_wg8, quant_matvec_coop; see
// shaders/quant.wgsl for what they compute and the helpers they call).

// The matrix-vector kernel's invocation gi: output rows n0 .. n0 + rows of x row m.
fn matvec(gi: u32) {
    let rows = p.rows;
    let per_m = (p.n + rows - 1u) / rows;
    let m = gi / per_m;
    if m >= p.m {
        return;
    }
    let n0 = (gi % per_m) * rows;
    var acc: array<f32, ROWS_MAX>;
    // Sum of squares of the raw x values, for a fused RMSNorm.
    var ss = 0.0;
    for (var b = 0u; b < p.blocks; b++) {
        var xs = load_x(m, b);
        if has_norm() {
            ss += fold_norm(&xs, load_gamma(b));
        }
        let s = sum8(xs);
        for (var r = 0u; r < rows; r++) {
            // Rows past N repeat the last row (not stored), keeping the loop free of branches.
            var dm: vec2<f32>;
            let wv = weight_raw(min(n0 + r, p.n - 1u), b, &dm);
            acc[r] += dm.x * dot8(xs, wv) + dm.y * s;
        }
    }
    // f32 / f16 rows whose K is not a multiple of 32: the rest element by element.
    for (var k = p.blocks * 32u; k < p.k; k++) {
        let xv = xg_at(m, k);
        for (var r = 0u; r < rows; r++) {
            acc[r] += xv * weight_at(min(n0 + r, p.n - 1u), k);
        }
    }
    let sc = row_scale_from(m, p.blocks * 32u, ss);
    for (var r = 0u; r < rows; r++) {
        if stores(n0 + r) {
            finish(m, n0 + r, acc[r], acc[min(r + 1u, ROWS_MAX - 1u)], sc);
        }
    }
}

@compute @workgroup_size(8, 1, 1)
fn quant_matvec_wg8(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    matvec(workgroup_index(wid, nwg) * 8u + lidx);
}

// Partial sums of quant_matvec_coop: the product (red) and, with a fused RMSNorm, the sum of
// squares of x (red_ss), one per invocation.
var<workgroup> red: array<f32, 64>;
var<workgroup> red_ss: array<f32, 64>;

@compute @workgroup_size(64, 1, 1)
fn quant_matvec_coop(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let rows = p.rows;
    let lanes = 64u / rows;
    let per_m = (p.n + rows - 1u) / rows;
    let g = workgroup_index(wid, nwg);
    let m = g / per_m;
    if m >= p.m {
        return;
    }
    let r = lidx / lanes;
    let lane = lidx % lanes;
    let v = (g % per_m) * rows + r;
    // Rows past N repeat the last row (not stored).
    let vr = min(v, p.n - 1u);
    var acc = 0.0;
    var ss = 0.0;
    for (var b = lane; b < p.blocks; b += lanes) {
        var xs = load_x(m, b);
        if has_norm() {
            ss += fold_norm(&xs, load_gamma(b));
        }
        var dm: vec2<f32>;
        let wv = weight_raw(vr, b, &dm);
        acc += dm.x * dot8(xs, wv) + dm.y * sum8(xs);
    }
    // f32 / f16 rows whose K is not a multiple of 32: the rest element by element.
    for (var k = p.blocks * 32u + lane; k < p.k; k += lanes) {
        let xv = xg_at(m, k);
        acc += xv * weight_at(vr, k);
        if has_norm() {
            let raw = x_at(m, k);
            ss += raw * raw;
        }
    }
    red[lidx] = acc;
    red_ss[lidx] = ss;
    workgroupBarrier();
    for (var s = lanes / 2u; s > 0u; s >>= 1u) {
        if lane < s {
            red[lidx] += red[lidx + s];
            red_ss[lidx] += red_ss[lidx + s];
        }
        workgroupBarrier();
    }
    if lane == 0u && stores(v) {
        // The sum of squares covers all of K already: nothing is left for row_scale_from.
        let sc = row_scale_from(m, p.k, red_ss[lidx]);
        finish(m, v, red[lidx], red[min(lidx + lanes, 63u)], sc);
    }
}
