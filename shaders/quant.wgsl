// Kernels that read weights in their stored format and dequantize as they read: the `linear`
// op, y[m, n] = sum_k x[m, k] * w[n, k], and the embedding gather from f16 / block tables.
//
// Weights w [N, K] are read as 32-bit words in the GGUF row layout. The format is a
// pipeline-overridable constant (WEIGHT_FORMAT: the index of its row in the table of
// src/formats, which also holds each format's WGSL decoder, composed into this module by
// src/gpu/kernels/quant.rs), so each format gets its own pipeline with the switches folded
// away. Rows are walked in 32-element chunks: a block format's decoder returns chunk `blk`
// (a k-quant's 256-element super-block is 8 chunks). Block formats need K to be a multiple of
// their block (checked on the host); plain formats (f32, f16, bf16) take any K (the last
// partial chunk is read element by element).
//
// What bounds these kernels on llvmpipe/lavapipe
// (docs/benchmarks/2026-11-21-kernels-lavapipe.md): every storage
// or workgroup-memory load costs a few ns per invocation and component, while FMAs and values
// held in registers (constant-indexed, so the compiler keeps them out of memory) are cheap.
// So the linear kernels load each weight word once per call, reuse every loaded x value
// across many weight rows, and keep x and the accumulators in registers; dot products of a
// block use the raw quantized values, d * dot(x, q) + m * sum(x), so a q4_1 block costs 5
// loads and no dequantization multiply per element (formats whose chunk has more than one
// scale return dequantized values with d = 1, m = 0).
//
// Entry points (linear; each in its file under shaders/quant/, which src/gpu/kernels/quant.rs
// composes after this one: this file holds what they share):
//   quant_matvec_wg8  decode on software adapters (a few rows of x): each invocation owns
//       `rows` consecutive output rows (uniform, <= 64) of one x row and walks K one block at
//       a time: the 32 values of x are loaded once per block into registers and used for all
//       its rows, each weight word is loaded once. 8 invocations per workgroup (one SIMD group
//       each), the host picks `rows` to give every CPU thread a full group.
//   quant_matvec_coop  decode on hardware GPUs without subgroups: a workgroup of 64 owns
//       `rows` output rows (a power of two, 2..32) of one x row; the 64 / rows invocations of
//       each row (its lanes) take every (64 / rows)-th block of K, so neighbouring lanes read
//       neighbouring blocks of the row, and their sums meet in workgroup memory (a tree).
//   quantsg_matvec  decode on hardware GPUs with subgroups (family quantsg, a module of its
//       own): the lanes of a subgroup share each output row and meet by shuffles, and every
//       weight block serves up to 8 rows of x (shaders/quant/matvec_sg.wgsl).
//   quant_regtile  prefill on software adapters: each invocation computes an 8 x `rows`
//       block of the output (8 rows of x held in registers, `rows` <= 64 weight rows walked
//       one at a time), reading x and the packed weights straight from storage: per 32-element
//       block, 256 loads of x and 5 (q4_1) per weight row feed 256 FMAs per weight row.
//       8 invocations per workgroup. (On llvmpipe a workgroup-memory load costs as much as a
//       storage load, so the GPUs' tiles would only add loads there.)
//   quant_mm  prefill on hardware GPUs: 64 x 64 output tiles of 128 invocations, each an
//       8 x 4 register block; x and the dequantized weight blocks staged in workgroup memory
//       one 32-element block of K at a time (shaders/quant/mm.wgsl).
//   quant_segment_wg8 / quant_segment_wg64 / quant_segment_finish  the norms of the product
//       (EPILOGUE bits 8 and 9, below; shaders/quant/segment.wgsl).
//   quant_gather  embedding rows from an f16 or block-quantized table (shaders/quant/gather.wgsl).
//
// Fused projections (the `fused_linear` op, made by the graph rewrite of src/graph/fuse.rs):
// every linear kernel, specialised by the EPILOGUE constant (0 for a plain linear):
//   bit 0  RMSNorm of x folded in: x is multiplied by gamma as it is loaded and every
//          accumulator by 1 / sqrt(mean(x^2) + eps) at the end (every kernel sums the
//          squares of the x values it loads anyway, gamma loaded once per block for all its
//          rows; the lanes or invocations that share a row of x add their sums at the end);
//   bit 1  a residual (binding 6, the output's shape) added as the result is stored;
//   bits 2-3  a gate activation (1 silu, 2 gelu-tanh): the weight holds gate rows 0..N then
//          up rows N..2N, the kernels walk 2N "virtual" rows with gate and up rows alternating
//          (wrow), so one invocation holds the gate and up sums of an output side by side and
//          stores act(g) * u;
//   bit 4  RoPE of the product (the `rope` op: positions at binding 7, the two-level cos/sin
//          table at binding 8), bit 5 on halves of the rotated part (else adjacent pairs):
//          with halves, virtual rows put each pair (j, j + rope_dim / 2) of a head side by
//          side, so the invocation holding both rotates them;
//   bit 6  a bias per weight row (binding 5 from bias_offset) added to the product;
//   bit 7  a KV split: the weight is three side by side in binding 2 (queries from w_offset,
//          keys from w_k_offset, values from w_v_offset, each in its own format:
//          WEIGHT_FORMAT and KV_FORMATS); rows n_q .. n_q + n_k (keys) are
//          stored into binding 6 and the value rows into binding 9, at the step's row m of
//          each, or with bit 10 at the row slots[m] (binding 7 from slots_offset; a slot
//          outside the kv_rows rows is skipped): the projection writes the KV cache. RoPE
//          applies to the queries and the keys (rope_rows);
//   bit 8  an RMSNorm of each head (head_dim outputs) of the queries and keys, weights in
//          binding 5 from hn_offset (the queries', then with bit 7 the keys');
//   bit 9  an RMSNorm of the output row (n outputs), weights in binding 5 from post_offset.
// Bits 8 and 9 need a whole segment of outputs (a head, the row) before anything is stored:
// the `quant_segment_*` kernels compute one segment per workgroup into workgroup memory and
// finish it there (the norm, RoPE, the residual, the stores: finish_segment); for many rows of
// x (or a segment longer than the segment kernels hold) the other kernels store the product
// and bias only, and `quant_segment_finish` then finishes each segment in place
// (shaders/quant/segment.wgsl).
//
// Bindings (group 0):
//   0 uniform  LinearParams | GatherParams (dynamic offset)
//   1 storage read_write  x    f32 [M, K]                    (linear; vec4s in `quantx4`)
//   2 storage read_write  w    u32 words of the weight/table (linear: all three with bit 7)
//   3 storage read_write  out  f32
//   4 storage read_write  ids  i32/u32                        (gather)
//   5 storage read_write  params f32: gamma [K], bias, head-norm and post-norm weights
//   6 storage read_write  res_k f32: the residual (the output's shape, bit 1), or with bit 7
//                         the key rows' destination
//   7 storage read_write  ints i32: positions [M] (bit 4), then slots [M] (bit 10)
//   8 storage read_write  table f32 [block + blocks, rope_dim] (linear, EPILOGUE bit 4)
//   9 storage read_write  vdst f32: the value rows' destination (bit 7)
//
// Rust mirrors (src/gpu/kernels/quant.rs, #[repr(C)], bytemuck::Pod):
//   struct LinearParams { m: u32, k: u32, n: u32, blocks: u32,
//                         x_offset: u32, w_offset: u32, out_offset: u32, tiles_n: u32,
//                         rows: u32, gamma_offset: u32, res_offset: u32, eps: f32,
//                         head_dim: u32, rope_dim: u32, rope_block: u32, table_rows: u32,
//                         pos_offset: u32, table_offset: u32, bias_offset: u32,
//                         hn_offset: u32, n_q: u32, n_k: u32, w_k_offset: u32,
//                         w_v_offset: u32, k_dst_offset: u32, v_dst_offset: u32,
//                         slots_offset: u32, kv_rows: u32, post_offset: u32, hn_eps: f32,
//                         post_eps: f32, seg_len: u32 } // 128 bytes
//   struct GatherParams { num_ids: u32, row: u32, rows: u32, table_offset: u32,
//                         ids_offset: u32, out_offset: u32, _pad: [u32; 2] } // 32 bytes
// x_offset and out_offset are in f32 elements, w_offset and table_offset in words, from each
// binding's start. n counts every weight row (all three with bit 7), n_q the rows stored to
// `out` (n_out). Workgroups are linearised over a 2-D grid (workgroup_index of the prelude).

override WEIGHT_FORMAT: u32 = 0u;
// 0: the weight in its file layout; 1: in the grouped planes of its format (src/formats,
// `Grouped`), which the runtime reorders it into once (quant_regroup).
override WEIGHT_LAYOUT: u32 = 0u;
// The formats and layouts of the keys' and the values' weights of a KV split (bit 7), a byte
// each: format_k | layout_k << 8 | format_v << 16 | layout_v << 24.
override KV_FORMATS: u32 = 0u;
override EPILOGUE: u32 = 0u;

fn kv_format(shift: u32) -> u32 {
    return (KV_FORMATS >> shift) & 255u;
}

struct LinearParams {
    m: u32,
    k: u32,
    n: u32,
    blocks: u32,
    x_offset: u32,
    w_offset: u32,
    out_offset: u32,
    tiles_n: u32,
    rows: u32,
    gamma_offset: u32,
    res_offset: u32,
    eps: f32,
    head_dim: u32,
    rope_dim: u32,
    rope_block: u32,
    table_rows: u32,
    pos_offset: u32,
    table_offset: u32,
    bias_offset: u32,
    hn_offset: u32,
    n_q: u32,
    n_k: u32,
    w_k_offset: u32,
    w_v_offset: u32,
    k_dst_offset: u32,
    v_dst_offset: u32,
    slots_offset: u32,
    kv_rows: u32,
    post_offset: u32,
    hn_eps: f32,
    post_eps: f32,
    seg_len: u32,
}

@group(0) @binding(0) var<uniform> p: LinearParams;
// Binding 1, x, is declared by src/gpu/kernels/quant.rs with x_elem and x_block, the only
// functions that read it: as f32s (family `quant`) or as vec4s (family `quantx4`).
@group(0) @binding(2) var<storage, read_write> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(5) var<storage, read_write> params: array<f32>;
@group(0) @binding(6) var<storage, read_write> res_k: array<f32>;
@group(0) @binding(7) var<storage, read_write> ints: array<i32>;
@group(0) @binding(8) var<storage, read_write> table: array<f32>;
@group(0) @binding(9) var<storage, read_write> vdst: array<f32>;

// Most output rows per invocation of quant_matvec_*, quant_regtile and quant_segment_*.
const ROWS_MAX: u32 = 64u;

fn has_norm() -> bool {
    return (EPILOGUE & 1u) != 0u;
}

fn has_gate() -> bool {
    return (EPILOGUE & 12u) != 0u;
}

fn has_bias() -> bool {
    return (EPILOGUE & 64u) != 0u;
}

fn has_kv() -> bool {
    return (EPILOGUE & 128u) != 0u;
}

// A norm of the product (bits 8, 9): the segment kernels finish what follows the product.
fn segment_norm() -> bool {
    return (EPILOGUE & 768u) != 0u;
}

// RoPE in the epilogue of the kernels that finish each output on its own.
fn has_rope() -> bool {
    return (EPILOGUE & 16u) != 0u && !segment_norm();
}

// A residual added by the kernels that finish each output on its own.
fn has_res() -> bool {
    return (EPILOGUE & 2u) != 0u && !segment_norm();
}

// Rows RoPE and the head norms see: the queries and keys of a KV split, else all.
fn rope_rows() -> u32 {
    if has_kv() {
        return p.n_q + p.n_k;
    }
    return p.n;
}

// The weight row of virtual row v: itself; with a gate, gate and up rows alternating; with
// RoPE on halves, each rotated pair (j, j + rope_dim / 2) of a head side by side.
fn wrow(v: u32) -> u32 {
    if has_gate() {
        return (v & 1u) * (p.n / 2u) + v / 2u;
    }
    if has_rope() && (EPILOGUE & 32u) != 0u && v < rope_rows() {
        let i = v % p.head_dim;
        if i < p.rope_dim {
            return v - i + i / 2u + (i & 1u) * (p.rope_dim / 2u);
        }
    }
    return v;
}

// Output columns: the weight rows, half of them with a gate, the queries of a KV split.
fn n_out() -> u32 {
    if has_gate() {
        return p.n / 2u;
    }
    if has_kv() {
        return p.n_q;
    }
    return p.n;
}

// tanh through exp with the argument clamped (as the elementwise family computes it).
fn tanh_c(x: f32) -> f32 {
    let c = clamp(x, -15.0, 15.0);
    let e = exp(2.0 * c);
    return (e - 1.0) / (e + 1.0);
}

// Where output (m, column col) of a KV split's keys or values lives: binding 6 (keys) or 9
// (values) and the element, or -1 for a slot outside the cache.
fn kv_at(m: u32, col: u32) -> i32 {
    var row = m;
    if (EPILOGUE & 1024u) != 0u {
        let s = ints[p.slots_offset + m];
        if s < 0 || u32(s) >= p.kv_rows {
            return -1;
        }
        row = u32(s);
    }
    let c = col - p.n_q;
    if c < p.n_k {
        return i32(p.k_dst_offset + row * p.n_k + c);
    }
    return i32(p.v_dst_offset + row * p.n_k + c - p.n_k);
}

// Stores y at output (m, weight row col): the queries (or every output) to `out`, the
// residual added when `res`; a KV split's keys and values to their cache rows.
fn store(m: u32, col: u32, y: f32, res: bool) {
    if has_kv() && col >= p.n_q {
        let at = kv_at(m, col);
        if at < 0 {
            return;
        }
        if col < p.n_q + p.n_k {
            res_k[at] = y;
        } else {
            vdst[at] = y;
        }
        return;
    }
    let o = m * n_out() + col;
    var r = y;
    if res {
        r = res_k[p.res_offset + o] + y;
    }
    dst[p.out_offset + o] = r;
}

// What store wrote at output (m, weight row col) (the finishing pass reads it back).
fn stored(m: u32, col: u32) -> f32 {
    if has_kv() && col >= p.n_q {
        let at = kv_at(m, col);
        if at < 0 {
            return 0.0;
        }
        if col < p.n_q + p.n_k {
            return res_k[at];
        }
        return vdst[at];
    }
    return dst[p.out_offset + m * n_out() + col];
}

fn put(m: u32, col: u32, y: f32) {
    store(m, col, y, has_res());
}

// The product of weight row n from its sum a scaled by sc (the RMSNorm factor of x): the
// bias added.
fn product(n: u32, a: f32, sc: f32) -> f32 {
    if has_bias() {
        return a * sc + params[p.bias_offset + n];
    }
    return a * sc;
}

// Whether position pos of x row m is outside the RoPE table (the `rope` op gives zeros).
fn rope_outside(pos: i32) -> bool {
    return pos < 0 || u32(pos) / p.rope_block >= p.table_rows - p.rope_block;
}

// (cos, sin) of rotation pair j at position pos (inside the table): the two levels' angles
// added.
fn rope_cs(pos: u32, j: u32) -> vec2<f32> {
    let lo = p.table_offset + (pos % p.rope_block) * p.rope_dim + 2u * j;
    let hi = p.table_offset + (p.rope_block + pos / p.rope_block) * p.rope_dim + 2u * j;
    let c = table[lo] * table[hi] - table[lo + 1u] * table[hi + 1u];
    let sn = table[lo + 1u] * table[hi] + table[lo] * table[hi + 1u];
    return vec2<f32>(c, sn);
}

// Stores the rotated pair of virtual rows v, v + 1 (a, b, the first rope_dim elements of a
// head) or virtual row v alone (past them), as the `rope` op does: a position outside the
// table gives zeros.
fn finish_rope(m: u32, v: u32, a: f32, b: f32) {
    let pos = ints[p.pos_offset + m];
    let i = v % p.head_dim;
    let outside = rope_outside(pos);
    if i >= p.rope_dim {
        put(m, wrow(v), select(a, 0.0, outside));
        return;
    }
    if outside {
        put(m, wrow(v), 0.0);
        put(m, wrow(v + 1u), 0.0);
        return;
    }
    let cs = rope_cs(u32(pos), i / 2u);
    put(m, wrow(v), a * cs.x - b * cs.y);
    put(m, wrow(v + 1u), a * cs.y + b * cs.x);
}

// Stores output (m, virtual row v) from its sum a (and, with a gate or RoPE, the sum b of the
// next virtual row), both scaled by sc (the RMSNorm factor): the bias, the activation or
// rotation, and the residual.
fn finish(m: u32, v: u32, a: f32, b: f32, sc: f32) {
    if has_rope() && v < rope_rows() {
        finish_rope(m, v, product(wrow(v), a, sc), product(wrow(v + 1u), b, sc));
        return;
    }
    var y = product(wrow(v), a, sc);
    var col = v;
    let act = (EPILOGUE >> 2u) & 3u;
    if act == 1u {
        y = y / (1.0 + exp(-y)) * (b * sc);
        col = v / 2u;
    } else if act == 2u {
        y = 0.5 * y * (1.0 + tanh_c(0.7978845608028654 * (y + 0.044715 * y * y * y))) * (b * sc);
        col = v / 2u;
    }
    put(m, col, y);
}

// Whether virtual row v is stored (below N; with a gate, or within the rotated part of a
// head, the even row of a pair).
fn stores(v: u32) -> bool {
    if v >= p.n {
        return false;
    }
    if has_gate() || (has_rope() && v < rope_rows() && v % p.head_dim < p.rope_dim) {
        return (v & 1u) == 0u;
    }
    return true;
}

// 1 / sqrt(mean(x[row]^2) + eps) for a fused RMSNorm (1 without, or for an empty row), given
// the sum of squares ss of the row's first k0 values: the rest are summed here.
fn row_scale_from(row: u32, k0: u32, ss_before: f32) -> f32 {
    if !has_norm() || p.k == 0u {
        return 1.0;
    }
    let j = p.x_offset + min(row, p.m - 1u) * p.k;
    var ss = ss_before;
    for (var k = k0; k < p.k; k++) {
        let v = x_elem(j + k);
        ss = fma(v, v, ss);
    }
    return inverseSqrt(ss / f32(p.k) + p.eps);
}

// Multiplies the x block *xs by gamma block g; returns the sum of squares of its raw values.
fn fold_norm(xs: ptr<function, array<vec4<f32>, 8>>, g: array<vec4<f32>, 8>) -> f32 {
    let ss = dot8(*xs, *xs);
    *xs = mul8(*xs, g);
    return ss;
}

// Block b of gamma.
fn load_gamma(b: u32) -> array<vec4<f32>, 8> {
    let j = p.gamma_offset + b * 32u;
    var g: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let at = j + 4u * i;
        g[i] = vec4<f32>(params[at], params[at + 1u], params[at + 2u], params[at + 3u]);
    }
    return g;
}

fn mul8(a: array<vec4<f32>, 8>, b: array<vec4<f32>, 8>) -> array<vec4<f32>, 8> {
    var r = a;
    for (var i = 0u; i < 8u; i++) {
        r[i] = a[i] * b[i];
    }
    return r;
}

// x[row, k] times gamma[k] with a fused RMSNorm (x_at without).
fn xg_at(row: u32, k: u32) -> f32 {
    if has_norm() {
        return x_at(row, k) * params[p.gamma_offset + k];
    }
    return x_at(row, k);
}

// Element k of weight row n: of the queries', keys' or values' weight with a KV split.
fn weight_elem_row(n: u32, k: u32) -> f32 {
    if has_kv() && n >= p.n_q {
        if n >= p.n_q + p.n_k {
            return element_at_as(kv_format(16u), p.w_v_offset, (n - p.n_q - p.n_k) * p.k + k);
        }
        return element_at_as(kv_format(0u), p.w_k_offset, (n - p.n_q) * p.k + k);
    }
    return element_at(p.w_offset, n * p.k + k);
}

// Element k of virtual weight row v (wrow).
fn weight_at(v: u32, k: u32) -> f32 {
    return weight_elem_row(wrow(v), k);
}

// Helpers of the format decoders (src/formats). Byte offsets `at` count from word wo.
// Byte at.
fn byte_at(wo: u32, at: u32) -> u32 {
    return (w[wo + at / 4u] >> ((at & 3u) * 8u)) & 255u;
}

// The 4 bytes at .. at + 3, at any alignment (the second word is read only when needed).
fn word_at(wo: u32, at: u32) -> u32 {
    let i = wo + at / 4u;
    let s = (at & 3u) * 8u;
    if s == 0u {
        return w[i];
    }
    return (w[i] >> s) | (w[i + 1u] << (32u - s));
}

// The f16 at the even byte offset at.
fn f16_at(wo: u32, at: u32) -> f32 {
    return unpack2x16float(w[wo + at / 4u] >> ((at & 2u) * 8u)).x;
}

// The 4 nibbles at bits shift, shift + 8, shift + 16, shift + 24 of q.
fn nibbles(q: u32, shift: u32) -> vec4<f32> {
    let v = (vec4<u32>(q) >> vec4<u32>(shift, shift + 8u, shift + 16u, shift + 24u)) & vec4<u32>(15u);
    return vec4<f32>(v);
}

// Bits shift .. shift + 3 of q, as 0 or 1.
fn bits4(q: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(shift, shift + 1u, shift + 2u, shift + 3u)) & vec4<u32>(1u));
}

// The 4 signed bytes of q, lowest first.
fn bytes_i8(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<i32>(bitcast<i32>(q)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

// Composed after this file (src/gpu/kernels/quant.rs, from the table of src/formats):
//   fn element_at_as(format: u32, wo: u32, e: u32) -> f32
//       element e of a plain-format (f32, f16, bf16) tensor starting at word wo (the partial
//       last block of a row, f16 tables);
//   fn raw_block_as(format: u32, grouped: u32, wo: u32, blk: u32, e: u32,
//                   dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8>
//       the 32 stored values of one block of a tensor starting at word wo, as 8 vec4s in
//       element order, and (scale, offset) in dm so that value = dm.x * q + dm.y: 32-element
//       chunk blk for the block formats, elements e .. e + 31 for plain ones (dm = (1, 0));
//   element_at and raw_block, the same for WEIGHT_FORMAT and WEIGHT_LAYOUT;
//   fn weight_is_block() -> bool
//       whether WEIGHT_FORMAT is a block format;
// and every format's decoder, which those call by format (an override constant wherever
// they are called, so each pipeline keeps one decoder per weight).

// The dequantized values of a block (see raw_block).
fn block_values(wo: u32, blk: u32, e: u32) -> array<vec4<f32>, 8> {
    var dm: vec2<f32>;
    var v = raw_block(wo, blk, e, &dm);
    for (var i = 0u; i < 8u; i++) {
        v[i] = dm.x * v[i] + dm.y;
    }
    return v;
}

// Block b of weight row n, raw: of the queries', keys' or values' weight with a KV split.
fn weight_raw_row(n: u32, b: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    if has_kv() && n >= p.n_q {
        if n >= p.n_q + p.n_k {
            let r = n - p.n_q - p.n_k;
            return raw_block_as(kv_format(16u), kv_format(24u), p.w_v_offset, r * p.blocks + b,
                r * p.k + b * 32u, dm);
        }
        let r = n - p.n_q;
        return raw_block_as(kv_format(0u), kv_format(8u), p.w_k_offset, r * p.blocks + b,
            r * p.k + b * 32u, dm);
    }
    return raw_block(p.w_offset, n * p.blocks + b, n * p.k + b * 32u, dm);
}

// Block b of virtual weight row v (wrow), raw.
fn weight_raw(v: u32, b: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    return weight_raw_row(wrow(v), b, dm);
}

// Block b of weight row n, dequantized.
fn weight_values_row(n: u32, b: u32) -> array<vec4<f32>, 8> {
    var dm: vec2<f32>;
    var v = weight_raw_row(n, b, &dm);
    for (var i = 0u; i < 8u; i++) {
        v[i] = dm.x * v[i] + dm.y;
    }
    return v;
}

// sum(a * b) over 32 values: vec4 FMAs, one horizontal sum.
fn dot8(a: array<vec4<f32>, 8>, b: array<vec4<f32>, 8>) -> f32 {
    let t = fma(a[7], b[7], fma(a[6], b[6], fma(a[5], b[5], fma(a[4], b[4],
        fma(a[3], b[3], fma(a[2], b[2], fma(a[1], b[1], a[0] * b[0])))))));
    return (t.x + t.y) + (t.z + t.w);
}

fn sum8(a: array<vec4<f32>, 8>) -> f32 {
    let t = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    return (t.x + t.y) + (t.z + t.w);
}

// Block b of x row `row` (clamped to the last row: rows past M compute a copy, never stored).
fn load_x(row: u32, b: u32) -> array<vec4<f32>, 8> {
    return x_block(p.x_offset + min(row, p.m - 1u) * p.k + b * 32u);
}

// x[row, k], clamped like load_x.
fn x_at(row: u32, k: u32) -> f32 {
    return x_elem(p.x_offset + min(row, p.m - 1u) * p.k + k);
}

struct GatherParams {
    num_ids: u32,
    row: u32,
    rows: u32,
    table_offset: u32,
    ids_offset: u32,
    out_offset: u32,
    ids_signed: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> gp: GatherParams;
@group(0) @binding(4) var<storage, read_write> ids: array<u32>;

// The table row of an id: a negative i32 id counts from the end (wrapping to a value >= rows,
// which gives zeros, when it is below -rows).
fn table_row(raw: u32) -> u32 {
    let signed = bitcast<i32>(raw);
    if gp.ids_signed != 0u && signed < 0 {
        return u32(signed + i32(gp.rows));
    }
    return raw;
}
