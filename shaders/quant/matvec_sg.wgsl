// The subgroup matrix-vector kernel (family quantsg: the helpers of shaders/quant.wgsl, x read
// as vec4s, this file and the formats' decoders; compiled only on devices with subgroups).
//
//   quantsg_matvec  decode on hardware GPUs with subgroup operations: a workgroup of 64
//       invocations owns `tiles_n` consecutive virtual weight rows and XROWS (a pipeline
//       constant: 1, 2, 4 or 8) rows of x. Each subgroup works on `rows` weight rows at a
//       time, its lanes split into `rows` groups of lanes_per_row = lanes / rows
//       lanes: lane j of a row takes blocks j, j + lanes_per_row, ... of K, so neighbouring
//       lanes read neighbouring blocks, loads x as vec4s and dots every block with the
//       XROWS rows of x (the weight is read once for all of them). The sums of a row's lanes
//       meet through subgroupShuffleXor (a butterfly within the row's lanes: no workgroup
//       memory, no barrier), and the row's first lane stores it through `finish` (every
//       EPILOGUE bit: the next row's sum, for gate and RoPE pairs, comes by
//       subgroupShuffleDown). The subgroups of a workgroup take its rows in turn and its
//       lanes are counted as they run (subgroupAdd(1)), so the kernel is right for any
//       number of lanes a subgroup really has (a device may run fewer than the size it
//       reports); the host picks `rows` and `tiles_n` from the adapter's smallest subgroup
//       (src/gpu/kernels/quant.rs, `SubgroupPlan`).
//
// Uniform (LinearParams of shaders/quant.wgsl): rows = weight rows a subgroup takes at once
// (a power of two, even with a gate or RoPE), tiles_n = virtual rows per workgroup (a multiple
// of rows). Workgroups: ceil(M / XROWS) x ceil(N / tiles_n), the row groups fastest.

override XROWS: u32 = 1u;

@compute @workgroup_size(64, 1, 1)
fn quantsg_matvec(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) num_sg: u32,
) {
    // The lanes the subgroup really has (every invocation is active here): a device may run
    // fewer than the subgroup size it reports (lavapipe's widest vectors do), and a subgroup
    // larger than the workgroup has only its 64 invocations. Rows take whole groups of a
    // power of two of them; lanes past those idle.
    let running = subgroupAdd(1u);
    let lanes = 1u << (31u - countLeadingZeros(running));
    let rw = p.tiles_n;
    let groups = (p.n + rw - 1u) / rw;
    let g = workgroup_index(wid, nwg);
    let m0 = (g / groups) * XROWS;
    if m0 >= p.m {
        return;
    }
    let v_wg = (g % groups) * rw;
    let rr = min(p.rows, lanes);
    let per_row = lanes / rr;
    let r = lane / per_row;
    let li = lane % per_row;
    // Lanes past the rows' groups take no blocks.
    let busy = r < rr;
    for (var base = sg_id * rr; base < rw; base += num_sg * rr) {
        let v = v_wg + base + r;
        // Rows past N repeat the last row (not stored).
        let vr = min(v, p.n - 1u);
        var acc: array<f32, 8>;
        var ss: array<f32, 8>;
        for (var b = select(p.blocks, li, busy); b < p.blocks; b += per_row) {
            var dm: vec2<f32>;
            let wv = weight_raw(vr, b, &dm);
            var gb: array<vec4<f32>, 8>;
            if has_norm() {
                gb = load_gamma(b);
            }
            for (var i = 0u; i < XROWS; i++) {
                var xs = load_x(m0 + i, b);
                if has_norm() {
                    ss[i] += fold_norm(&xs, gb);
                }
                acc[i] += dm.x * dot8(xs, wv) + dm.y * sum8(xs);
            }
        }
        // f32 / f16 rows whose K is not a multiple of 32: the rest element by element.
        for (var k = select(p.k, p.blocks * 32u + li, busy); k < p.k; k += per_row) {
            let wk = weight_at(vr, k);
            for (var i = 0u; i < XROWS; i++) {
                let raw = x_at(m0 + i, k);
                acc[i] += xg_at(m0 + i, k) * wk;
                ss[i] += raw * raw;
            }
        }
        for (var o = per_row / 2u; o > 0u; o >>= 1u) {
            for (var i = 0u; i < XROWS; i++) {
                acc[i] += subgroupShuffleXor(acc[i], o);
                if has_norm() {
                    ss[i] += subgroupShuffleXor(ss[i], o);
                }
            }
        }
        var next: array<f32, 8>;
        for (var i = 0u; i < XROWS; i++) {
            next[i] = subgroupShuffleDown(acc[i], per_row);
        }
        if li == 0u && busy && stores(v) {
            for (var i = 0u; i < XROWS; i++) {
                if m0 + i < p.m {
                    // The sum of squares covers all of K: nothing is left for row_scale_from.
                    let sc = row_scale_from(m0 + i, p.k, ss[i]);
                    finish(m0 + i, v, acc[i], next[i], sc);
                }
            }
        }
    }
}
