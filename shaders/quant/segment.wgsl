// The segment kernels of the quant family (EPILOGUE bits 8 and 9: a norm of the product,
// which needs a whole head or row of outputs before anything is stored; see
// shaders/quant.wgsl for the epilogue and the helpers they call).
//
//   quant_segment_wg8 / quant_segment_wg64  decode: a workgroup of 8 (software adapters) or
//       64 (hardware GPUs) per x row and segment of seg_len outputs computes the segment's
//       products into workgroup memory and finishes it there (finish_segment).
//   quant_segment_finish  after a kernel of the other kinds stored the products (and
//       biases): a workgroup of 64 per x row and segment finishes it in place.

// Most outputs a segment holds in workgroup memory (with `seg_red`, 16 KiB in all).
const SEG_MAX: u32 = 4000u;
var<workgroup> seg: array<f32, SEG_MAX>;
// The workgroup's partial sums of squares of a segment.
var<workgroup> seg_red: array<f32, 64>;

// Segments of seg_len outputs of x row m's workgroup g (there are n / seg_len per row): its
// row and its first weight row.
fn segment_of(g: u32, per_m: u32) -> vec2<u32> {
    return vec2<u32>(g / per_m, (g % per_m) * p.seg_len);
}

// The workgroup of x row m and the segment of weight rows s0 .. s0 + seg_len, wg invocations:
// invocation lidx computes rows r0 .. r1 of the segment into `seg` (the product, its bias)
// as quant_matvec_wg8 computes its rows, then the workgroup finishes the segment.
fn segment(g: u32, lidx: u32, wg: u32) {
    let at = segment_of(g, p.n / p.seg_len);
    let m = at.x;
    let s0 = at.y;
    // Uniform for the workgroup: every invocation returns or none does.
    if m >= p.m {
        return;
    }
    let chunk = (p.seg_len + wg - 1u) / wg;
    let r0 = min(lidx * chunk, p.seg_len);
    let r1 = min(r0 + chunk, p.seg_len);
    let sc = row_scale_from(m, 0u, 0.0);
    for (var base = r0; base < r1; base += ROWS_MAX) {
        let rows = min(ROWS_MAX, r1 - base);
        var acc: array<f32, ROWS_MAX>;
        for (var b = 0u; b < p.blocks; b++) {
            var xs = load_x(m, b);
            if has_norm() {
                xs = mul8(xs, load_gamma(b));
            }
            let s = sum8(xs);
            for (var r = 0u; r < rows; r++) {
                var dm: vec2<f32>;
                let wv = weight_raw_row(s0 + base + r, b, &dm);
                acc[r] += dm.x * dot8(xs, wv) + dm.y * s;
            }
        }
        // f32 / f16 rows whose K is not a multiple of 32: the rest element by element.
        for (var k = p.blocks * 32u; k < p.k; k++) {
            let xv = xg_at(m, k);
            for (var r = 0u; r < rows; r++) {
                acc[r] += xv * weight_elem_row(s0 + base + r, k);
            }
        }
        for (var r = 0u; r < rows; r++) {
            seg[base + r] = product(s0 + base + r, acc[r], sc);
        }
    }
    workgroupBarrier();
    finish_segment(m, s0, r0, r1, lidx, wg, true);
}

@compute @workgroup_size(8, 1, 1)
fn quant_segment_wg8(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    segment(workgroup_index(wid, nwg), lidx, 8u);
}

@compute @workgroup_size(64, 1, 1)
fn quant_segment_wg64(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    segment(workgroup_index(wid, nwg), lidx, 64u);
}

// The segments of an x row that have a norm: the queries' and keys' heads (bit 8), the row
// (bit 9). The values' heads of a KV split were stored finished.
fn normed_segments() -> u32 {
    if (EPILOGUE & 256u) != 0u {
        return rope_rows() / p.seg_len;
    }
    return 1u;
}

// Finishes the segments a kernel of the other kinds stored as products (and biases): one
// workgroup per x row and segment with a norm, the values read back and rewritten in place.
@compute @workgroup_size(64, 1, 1)
fn quant_segment_finish(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let at = segment_of(workgroup_index(wid, nwg), normed_segments());
    let m = at.x;
    let s0 = at.y;
    if m >= p.m {
        return;
    }
    let chunk = (p.seg_len + 63u) / 64u;
    let r0 = min(lidx * chunk, p.seg_len);
    let r1 = min(r0 + chunk, p.seg_len);
    let in_seg = p.seg_len <= SEG_MAX;
    if in_seg {
        for (var j = r0; j < r1; j++) {
            seg[j] = stored(m, s0 + j);
        }
    }
    workgroupBarrier();
    finish_segment(m, s0, r0, r1, lidx, 64u, in_seg);
}

// Output j of the segment at weight row s0 for x row m: from `seg`, or read back.
fn seg_value(m: u32, s0: u32, j: u32, in_seg: bool) -> f32 {
    if in_seg {
        return seg[j];
    }
    return stored(m, s0 + j);
}

// Finishes the segment of weight rows s0 .. s0 + seg_len of x row m, invocation lidx of wg
// owning its rows r0 .. r1 (the values in `seg` when in_seg, else where they were stored,
// which only a post-norm without RoPE leaves there): the segment's RMSNorm (a head of the
// queries or keys with its weights, or the row with the post-norm's; none for the values'
// heads), RoPE within the head, the residual, and the stores.
fn finish_segment(m: u32, s0: u32, r0: u32, r1: u32, lidx: u32, wg: u32, in_seg: bool) {
    var ss = 0.0;
    for (var j = r0; j < r1; j++) {
        let v = seg_value(m, s0, j, in_seg);
        ss = fma(v, v, ss);
    }
    seg_red[lidx] = ss;
    workgroupBarrier();
    for (var st = wg / 2u; st > 0u; st >>= 1u) {
        if lidx < st {
            seg_red[lidx] += seg_red[lidx + st];
        }
        workgroupBarrier();
    }
    let head = (EPILOGUE & 256u) != 0u;
    let normed = !head || s0 < rope_rows();
    var scale = 1.0;
    var g0 = p.post_offset;
    if head {
        scale = inverseSqrt(seg_red[0] / f32(p.seg_len) + p.hn_eps);
        // The keys' weights follow the queries' with a KV split.
        g0 = p.hn_offset + select(0u, p.seg_len, has_kv() && s0 >= p.n_q);
    } else {
        scale = inverseSqrt(seg_red[0] / f32(p.seg_len) + p.post_eps);
    }
    let rope = (EPILOGUE & 16u) != 0u && head && normed;
    var pos = 0i;
    if rope {
        pos = ints[p.pos_offset + m];
    }
    for (var j = r0; j < r1; j++) {
        var y = seg_value(m, s0, j, in_seg);
        if normed {
            y *= scale * params[g0 + j];
        }
        if rope && j < p.rope_dim {
            // The pair of j: its partner and the rotation, as finish_rope.
            let halves = (EPILOGUE & 32u) != 0u;
            let half = p.rope_dim / 2u;
            var lo = j;
            var pair = j / 2u;
            if halves {
                lo = j % half;
                pair = lo;
            } else {
                lo = j & ~1u;
            }
            let hi = select(lo + 1u, lo + half, halves);
            let a = seg_value(m, s0, lo, in_seg) * scale * params[g0 + lo];
            let b = seg_value(m, s0, hi, in_seg) * scale * params[g0 + hi];
            if rope_outside(pos) {
                y = 0.0;
            } else {
                let cs = rope_cs(u32(pos), pair);
                y = select(a * cs.y + b * cs.x, a * cs.x - b * cs.y, j == lo);
            }
        } else if rope && rope_outside(pos) {
            y = 0.0;
        }
        store(m, s0 + j, y, (EPILOGUE & 2u) != 0u);
    }
}
