// The register-tiled prefill kernel of the quant family (quant_regtile; see
// shaders/quant.wgsl).

// weight rows n0 .. n0 + rows. The 8 x blocks are named values (constant indices only), so
// they stay in registers; the accumulators are indexed by the weight row.
@compute @workgroup_size(8, 1, 1)
fn quant_regtile(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let rows = p.rows;
    let gi = workgroup_index(wid, nwg) * 8u + lidx;
    let per_m = (p.n + rows - 1u) / rows;
    let m0 = (gi / per_m) * 8u;
    if m0 >= p.m {
        return;
    }
    let n0 = (gi % per_m) * rows;
    var a0: array<f32, ROWS_MAX>;
    var a1: array<f32, ROWS_MAX>;
    var a2: array<f32, ROWS_MAX>;
    var a3: array<f32, ROWS_MAX>;
    var a4: array<f32, ROWS_MAX>;
    var a5: array<f32, ROWS_MAX>;
    var a6: array<f32, ROWS_MAX>;
    var a7: array<f32, ROWS_MAX>;
    var q0 = 0.0;
    var q1 = 0.0;
    var q2 = 0.0;
    var q3 = 0.0;
    var q4 = 0.0;
    var q5 = 0.0;
    var q6 = 0.0;
    var q7 = 0.0;
    for (var b = 0u; b < p.blocks; b++) {
        var x0 = load_x(m0, b);
        var x1 = load_x(m0 + 1u, b);
        var x2 = load_x(m0 + 2u, b);
        var x3 = load_x(m0 + 3u, b);
        var x4 = load_x(m0 + 4u, b);
        var x5 = load_x(m0 + 5u, b);
        var x6 = load_x(m0 + 6u, b);
        var x7 = load_x(m0 + 7u, b);
        // A fused RMSNorm: gamma loaded once for the 8 rows, their squares summed here.
        if has_norm() {
            let g = load_gamma(b);
            q0 += fold_norm(&x0, g);
            q1 += fold_norm(&x1, g);
            q2 += fold_norm(&x2, g);
            q3 += fold_norm(&x3, g);
            q4 += fold_norm(&x4, g);
            q5 += fold_norm(&x5, g);
            q6 += fold_norm(&x6, g);
            q7 += fold_norm(&x7, g);
        }
        let s0 = sum8(x0);
        let s1 = sum8(x1);
        let s2 = sum8(x2);
        let s3 = sum8(x3);
        let s4 = sum8(x4);
        let s5 = sum8(x5);
        let s6 = sum8(x6);
        let s7 = sum8(x7);
        for (var j = 0u; j < rows; j++) {
            var dm: vec2<f32>;
            let wv = weight_raw(min(n0 + j, p.n - 1u), b, &dm);
            a0[j] += dm.x * dot8(x0, wv) + dm.y * s0;
            a1[j] += dm.x * dot8(x1, wv) + dm.y * s1;
            a2[j] += dm.x * dot8(x2, wv) + dm.y * s2;
            a3[j] += dm.x * dot8(x3, wv) + dm.y * s3;
            a4[j] += dm.x * dot8(x4, wv) + dm.y * s4;
            a5[j] += dm.x * dot8(x5, wv) + dm.y * s5;
            a6[j] += dm.x * dot8(x6, wv) + dm.y * s6;
            a7[j] += dm.x * dot8(x7, wv) + dm.y * s7;
        }
    }
    for (var k = p.blocks * 32u; k < p.k; k++) {
        let x0 = xg_at(m0, k);
        let x1 = xg_at(m0 + 1u, k);
        let x2 = xg_at(m0 + 2u, k);
        let x3 = xg_at(m0 + 3u, k);
        let x4 = xg_at(m0 + 4u, k);
        let x5 = xg_at(m0 + 5u, k);
        let x6 = xg_at(m0 + 6u, k);
        let x7 = xg_at(m0 + 7u, k);
        for (var j = 0u; j < rows; j++) {
            let wv = weight_at(min(n0 + j, p.n - 1u), k);
            a0[j] += x0 * wv;
            a1[j] += x1 * wv;
            a2[j] += x2 * wv;
            a3[j] += x3 * wv;
            a4[j] += x4 * wv;
            a5[j] += x5 * wv;
            a6[j] += x6 * wv;
            a7[j] += x7 * wv;
        }
    }
    let s0 = row_scale_from(m0, p.blocks * 32u, q0);
    let s1 = row_scale_from(m0 + 1u, p.blocks * 32u, q1);
    let s2 = row_scale_from(m0 + 2u, p.blocks * 32u, q2);
    let s3 = row_scale_from(m0 + 3u, p.blocks * 32u, q3);
    let s4 = row_scale_from(m0 + 4u, p.blocks * 32u, q4);
    let s5 = row_scale_from(m0 + 5u, p.blocks * 32u, q5);
    let s6 = row_scale_from(m0 + 6u, p.blocks * 32u, q6);
    let s7 = row_scale_from(m0 + 7u, p.blocks * 32u, q7);
    for (var j = 0u; j < rows; j++) {
        if stores(n0 + j) {
            let v = n0 + j;
            let u = min(j + 1u, ROWS_MAX - 1u);
            store_if(m0, v, a0[j], a0[u], s0);
            store_if(m0 + 1u, v, a1[j], a1[u], s1);
            store_if(m0 + 2u, v, a2[j], a2[u], s2);
            store_if(m0 + 3u, v, a3[j], a3[u], s3);
            store_if(m0 + 4u, v, a4[j], a4[u], s4);
            store_if(m0 + 5u, v, a5[j], a5[u], s5);
            store_if(m0 + 6u, v, a6[j], a6[u], s6);
            store_if(m0 + 7u, v, a7[j], a7[u], s7);
        }
    }
}

fn store_if(row: u32, v: u32, a: f32, b: f32, sc: f32) {
    if row < p.m {
        finish(row, v, a, b, sc);
    }
}
