// The workgroup-memory tiled prefill kernel of the quant family (quant_tiled; see
// shaders/quant.wgsl).

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 32u;

// Xs[k * TM + m], Ws[k * TN + n]: k-major so the inner loop reads 4 consecutive words.
var<workgroup> Xs: array<f32, 2048>;
var<workgroup> Ws: array<f32, 2048>;

@compute @workgroup_size(8, 8, 1)
fn quant_tiled(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // Uniform control flow up to the barriers: everything depends on uniforms and ids only.
    let t = workgroup_index(wid, nwg);
    let row0 = (t / p.tiles_n) * TM;
    let col0 = (t % p.tiles_n) * TN;
    if row0 >= p.m {
        return;
    }
    let tx = lid.x;
    let ty = lid.y;
    // A fused RMSNorm: each invocation walks one of the tile's 64 rows of x for its scale
    // (lidx = ty * 8 + tx), passed through Xs (16 KiB of workgroup memory are all there is)
    // to the invocations that store the row.
    Xs[lidx] = row_scale_from(row0 + lidx, 0u, 0.0);
    workgroupBarrier();
    var sc: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        sc[i] = Xs[ty * 8u + i];
    }
    workgroupBarrier();
    var c00 = vec4<f32>(0.0);
    var c01 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0);
    var c11 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0);
    var c21 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0);
    var c31 = vec4<f32>(0.0);
    var c40 = vec4<f32>(0.0);
    var c41 = vec4<f32>(0.0);
    var c50 = vec4<f32>(0.0);
    var c51 = vec4<f32>(0.0);
    var c60 = vec4<f32>(0.0);
    var c61 = vec4<f32>(0.0);
    var c70 = vec4<f32>(0.0);
    var c71 = vec4<f32>(0.0);

    let ktiles = (p.k + TK - 1u) / TK;
    for (var kt = 0u; kt < ktiles; kt++) {
        let k0 = kt * TK;
        // x: consecutive invocations walk k (contiguous in row-major x).
        for (var r = 0u; r < 32u; r++) {
            let idx = lidx + 64u * r;
            let am = idx / TK;
            let ak = idx % TK;
            let gm = row0 + am;
            let gk = k0 + ak;
            var av = 0.0;
            if gm < p.m && gk < p.k {
                av = x_elem(p.x_offset + gm * p.k + gk);
                if has_norm() {
                    av *= gamma[p.gamma_offset + gk];
                }
            }
            Xs[ak * TM + am] = av;
        }
        // w: invocation i dequantizes block kt of weight row col0 + i (zeros past N).
        let gn = col0 + lidx;
        if gn < p.n && kt < p.blocks {
            let wr = wrow(gn);
            let wv = block_values(p.w_offset, wr * p.blocks + kt, wr * p.k + k0);
            for (var i = 0u; i < 8u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    Ws[(4u * i + j) * TN + lidx] = wv[i][j];
                }
            }
        } else {
            for (var kk = 0u; kk < TK; kk++) {
                var v = 0.0;
                if gn < p.n && k0 + kk < p.k {
                    v = weight_at(gn, k0 + kk);
                }
                Ws[kk * TN + lidx] = v;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let ai = kk * TM + ty * 8u;
            let bj = kk * TN + tx * 8u;
            let a0 = vec4<f32>(Xs[ai], Xs[ai + 1u], Xs[ai + 2u], Xs[ai + 3u]);
            let a1 = vec4<f32>(Xs[ai + 4u], Xs[ai + 5u], Xs[ai + 6u], Xs[ai + 7u]);
            let b0 = vec4<f32>(Ws[bj], Ws[bj + 1u], Ws[bj + 2u], Ws[bj + 3u]);
            let b1 = vec4<f32>(Ws[bj + 4u], Ws[bj + 5u], Ws[bj + 6u], Ws[bj + 7u]);
            c00 += a0[0] * b0;
            c01 += a0[0] * b1;
            c10 += a0[1] * b0;
            c11 += a0[1] * b1;
            c20 += a0[2] * b0;
            c21 += a0[2] * b1;
            c30 += a0[3] * b0;
            c31 += a0[3] * b1;
            c40 += a1[0] * b0;
            c41 += a1[0] * b1;
            c50 += a1[1] * b0;
            c51 += a1[1] * b1;
            c60 += a1[2] * b0;
            c61 += a1[2] * b1;
            c70 += a1[3] * b0;
            c71 += a1[3] * b1;
        }
        workgroupBarrier();
    }

    let gn0 = col0 + tx * 8u;
    store_tile_row(row0 + ty * 8u + 0u, gn0, c00, c01, sc[0]);
    store_tile_row(row0 + ty * 8u + 1u, gn0, c10, c11, sc[1]);
    store_tile_row(row0 + ty * 8u + 2u, gn0, c20, c21, sc[2]);
    store_tile_row(row0 + ty * 8u + 3u, gn0, c30, c31, sc[3]);
    store_tile_row(row0 + ty * 8u + 4u, gn0, c40, c41, sc[4]);
    store_tile_row(row0 + ty * 8u + 5u, gn0, c50, c51, sc[5]);
    store_tile_row(row0 + ty * 8u + 6u, gn0, c60, c61, sc[6]);
    store_tile_row(row0 + ty * 8u + 7u, gn0, c70, c71, sc[7]);
}

// Stores one row of an 8x8 register block (virtual rows gn0 .. gn0 + 8, gn0 even) scaled by
// sc, skipping what lies outside the output.
fn store_tile_row(gm: u32, gn0: u32, lo: vec4<f32>, hi: vec4<f32>, sc: f32) {
    if gm >= p.m {
        return;
    }
    var v = array<f32, 9>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w, 0.0);
    for (var j = 0u; j < 8u; j++) {
        if stores(gn0 + j) {
            finish(gm, gn0 + j, v[j], v[j + 1u], sc);
        }
    }
}
