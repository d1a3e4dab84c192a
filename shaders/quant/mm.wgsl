// The prefill GEMM of the quant family for hardware GPUs (quant_mm; quantx4_mm reads x as
// vec4s). See shaders/quant.wgsl for the uniform, the bindings and the helpers it calls.
//
//   quant_mm  a workgroup of 128 invocations computes a 64 x 64 tile of the output (64 rows
//       of x, 64 virtual weight rows), each invocation an 8 x 4 register block (8 rows of x,
//       4 adjacent virtual rows, so gate and RoPE pairs stay in one invocation). K is walked
//       one 32-element block at a time: the tile of x (64 x 32, loaded as quads of 4 values
//       along K: 4 per invocation) and the 64 weight blocks (each decoded by 2 invocations,
//       16 values each) go through workgroup memory k-major, so the inner loop reads 3 vec4s
//       (8 x values, 4 weight values) per 32 FMAs, and every weight value is dequantized once
//       per workgroup, every x value loaded once. Accumulation in f32. 16 KiB of workgroup
//       memory (WebGPU's default limit). A fused RMSNorm sums the squares of the x values the
//       invocations load anyway and meets them in workgroup memory once, after the last block.
//
// Uniform (LinearParams): tiles_n = ceil(N / 64) (virtual rows); workgroups ceil(M / 64) x
// tiles_n, the column tiles fastest.

const MM_TILE: u32 = 64u;

// x tile, k-major: mm_x[k * 16 + m / 4][m % 4]; weight tile: mm_w[k * 16 + n / 4][n % 4].
var<workgroup> mm_x: array<vec4<f32>, 512>;
var<workgroup> mm_w: array<vec4<f32>, 512>;

@compute @workgroup_size(128, 1, 1)
fn quant_mm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // Uniform control flow up to the barriers: everything depends on uniforms and ids only.
    let t = workgroup_index(wid, nwg);
    let row0 = (t / p.tiles_n) * MM_TILE;
    let col0 = (t % p.tiles_n) * MM_TILE;
    if row0 >= p.m {
        return;
    }
    // The register block: rows row0 + 8 ty .. + 8, virtual rows col0 + 4 tx .. + 4.
    let tx = lidx % 16u;
    let ty = lidx / 16u;
    // The weight block this invocation decodes half of: virtual row col0 + wn, half wh.
    let wn = lidx / 2u;
    let wh = lidx % 2u;
    let gn = col0 + wn;
    var c: array<vec4<f32>, 8>;
    // Sums of squares of the x rows this invocation loads (rows lidx / 8 + 16 r).
    var ssq = vec4<f32>(0.0);
    let ktiles = (p.k + 31u) / 32u;
    for (var kt = 0u; kt < ktiles; kt++) {
        let k0 = kt * 32u;
        // x: quad (idx % 8) of row idx / 8, for idx = lidx + 128 r: 8 invocations per row.
        for (var r = 0u; r < 4u; r++) {
            let idx = lidx + 128u * r;
            let am = idx / 8u;
            let ak = (idx % 8u) * 4u;
            let gm = row0 + am;
            let gk = k0 + ak;
            var xv = vec4<f32>(0.0);
            if gm < p.m && gk < p.k {
                let at = p.x_offset + gm * p.k;
                xv = x_quad(at + gk, at + p.k);
                if has_norm() {
                    ssq[r] += dot(xv, xv);
                    xv *= gamma_quad(gk);
                }
            }
            for (var j = 0u; j < 4u; j++) {
                mm_x[(ak + j) * 16u + am / 4u][am % 4u] = xv[j];
            }
        }
        // w: half wh (elements 16 wh .. 16 wh + 16) of block kt of virtual row gn.
        var h0 = vec4<f32>(0.0);
        var h1 = vec4<f32>(0.0);
        var h2 = vec4<f32>(0.0);
        var h3 = vec4<f32>(0.0);
        if gn < p.n && kt < p.blocks {
            let wr = wrow(gn);
            var dm: vec2<f32>;
            let wv = weight_raw_row(wr, kt, &dm);
            let lo = wh == 0u;
            h0 = dm.x * select(wv[4], wv[0], lo) + dm.y;
            h1 = dm.x * select(wv[5], wv[1], lo) + dm.y;
            h2 = dm.x * select(wv[6], wv[2], lo) + dm.y;
            h3 = dm.x * select(wv[7], wv[3], lo) + dm.y;
        } else if gn < p.n {
            // The partial last block of an f32 / f16 row: element by element.
            let e = k0 + 16u * wh;
            h0 = vec4<f32>(w_at(gn, e), w_at(gn, e + 1u), w_at(gn, e + 2u), w_at(gn, e + 3u));
            h1 = vec4<f32>(w_at(gn, e + 4u), w_at(gn, e + 5u), w_at(gn, e + 6u), w_at(gn, e + 7u));
            h2 = vec4<f32>(w_at(gn, e + 8u), w_at(gn, e + 9u), w_at(gn, e + 10u), w_at(gn, e + 11u));
            h3 = vec4<f32>(w_at(gn, e + 12u), w_at(gn, e + 13u), w_at(gn, e + 14u), w_at(gn, e + 15u));
        }
        let wq = wn / 4u;
        let wc = wn % 4u;
        let k16 = 16u * wh;
        for (var j = 0u; j < 4u; j++) {
            mm_w[(k16 + j) * 16u + wq][wc] = h0[j];
            mm_w[(k16 + 4u + j) * 16u + wq][wc] = h1[j];
            mm_w[(k16 + 8u + j) * 16u + wq][wc] = h2[j];
            mm_w[(k16 + 12u + j) * 16u + wq][wc] = h3[j];
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk++) {
            let a0 = mm_x[kk * 16u + 2u * ty];
            let a1 = mm_x[kk * 16u + 2u * ty + 1u];
            let b = mm_w[kk * 16u + tx];
            c[0] = fma(vec4<f32>(a0.x), b, c[0]);
            c[1] = fma(vec4<f32>(a0.y), b, c[1]);
            c[2] = fma(vec4<f32>(a0.z), b, c[2]);
            c[3] = fma(vec4<f32>(a0.w), b, c[3]);
            c[4] = fma(vec4<f32>(a1.x), b, c[4]);
            c[5] = fma(vec4<f32>(a1.y), b, c[5]);
            c[6] = fma(vec4<f32>(a1.z), b, c[6]);
            c[7] = fma(vec4<f32>(a1.w), b, c[7]);
        }
        workgroupBarrier();
    }
    // A fused RMSNorm: row am's squares are in the 8 invocations 8 (am % 16) .. + 8, at
    // component am / 16; each invocation sums its 8 rows' (mm_x is free after the last block).
    var sc = array<f32, 8>(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0);
    if has_norm() {
        mm_x[lidx] = ssq;
        workgroupBarrier();
        for (var i = 0u; i < 8u; i++) {
            let am = 8u * ty + i;
            var s = 0.0;
            for (var j = 0u; j < 8u; j++) {
                s += mm_x[8u * (am % 16u) + j][am / 16u];
            }
            sc[i] = row_scale_from(row0 + am, p.k, s);
        }
    }
    let gn0 = col0 + 4u * tx;
    for (var i = 0u; i < 8u; i++) {
        let gm = row0 + 8u * ty + i;
        if gm < p.m {
            let v = c[i];
            for (var j = 0u; j < 4u; j++) {
                if stores(gn0 + j) {
                    finish(gm, gn0 + j, v[j], v[min(j + 1u, 3u)], sc[i]);
                }
            }
        }
    }
}

// Element k of virtual weight row v, 0 past K.
fn w_at(v: u32, k: u32) -> f32 {
    if k >= p.k {
        return 0.0;
    }
    return weight_at(v, k);
}

// gamma[k .. k + 4] (a fused RMSNorm), 0 past K.
fn gamma_quad(k: u32) -> vec4<f32> {
    var g = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < p.k {
            g[j] = params[p.gamma_offset + k + j];
        }
    }
    return g;
}
