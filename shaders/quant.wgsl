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
// Entry points (linear):
//   quant_matvec_wg8  decode on software adapters (a few rows of x): each invocation owns
//       `rows` consecutive output rows (uniform, <= 64) of one x row and walks K one block at
//       a time: the 32 values of x are loaded once per block into registers and used for all
//       its rows, each weight word is loaded once. 8 invocations per workgroup (one SIMD group
//       each), the host picks `rows` to give every CPU thread a full group.
//   quant_matvec_coop  decode on hardware GPUs: a workgroup of 64 owns `rows` output rows
//       (a power of two, 2..32) of one x row; the 64 / rows invocations of each row (its
//       lanes) take every (64 / rows)-th block of K, so neighbouring lanes read neighbouring
//       blocks of the row, and their sums meet in workgroup memory (a tree). Every output
//       row gets 64 / rows invocations instead of a quarter of one, which is what a GPU
//       needs to hide the latency of its loads.
//   quant_regtile  prefill on software adapters: each invocation computes an 8 x `rows`
//       block of the output (8 rows of x held in registers, `rows` <= 64 weight rows walked
//       one at a time), reading x and the packed weights straight from storage: per 32-element
//       block, 256 loads of x and 5 (q4_1) per weight row feed 256 FMAs per weight row.
//       8 invocations per workgroup.
//   quant_tiled  prefill on hardware GPUs: a workgroup of 8x8 invocations computes a 64x64
//       output tile (64 rows of x, 64 output columns), each invocation an 8x8 register block.
//       K is walked one 32-element block at a time: the workgroup stages the 64x32 tile of x
//       and dequantizes the 64 weight blocks (one per invocation) into workgroup memory, then
//       every invocation does 32 x (8 + 8 loads, 64 FMAs). On llvmpipe those workgroup loads
//       cost as much as storage loads, which is why quant_regtile exists (about 5x faster
//       there; `dynrt bench kernels --only-linear`).
//   quant_gather  embedding rows from an f16 or block-quantized table (below).
//
// Fused projections (the `fused_linear` op, made by the graph rewrite of src/graph/fuse.rs):
// the same three linear kernels, specialised by the EPILOGUE constant (0 for a plain linear):
//   bit 0  RMSNorm of x folded in: x is multiplied by gamma as it is loaded and every
//          accumulator by 1 / sqrt(mean(x^2) + eps) at the end (the matvec and register-tiled
//          kernels sum the squares of the x values they load anyway, gamma loaded once per
//          block for all their rows; in quant_tiled each invocation first walks one of the
//          tile's 64 rows of x for its scale, shared through workgroup memory);
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
// x the other kernels store the product and bias only, and `quant_segment_finish` then
// finishes each segment in place.
//
// Entry points (segment norms):
//   quant_segment_wg8 / quant_segment_wg64  one workgroup of 8 (software adapters) or 64
//       invocations per x row and segment of seg_len outputs: each invocation computes its
//       seg_len / wg consecutive rows as quant_matvec_wg8 does, into `seg`.
//   quant_segment_finish  one workgroup of 64 per x row and segment to finish, in place (the
//       values read back from where the product was stored; without `seg` when seg_len is
//       above SEG_MAX, which only a post-norm can be: it has no RoPE).
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

// ---- Segment norms (EPILOGUE bits 8, 9): a head or a row of outputs per workgroup.

// Most outputs a segment holds in workgroup memory (with `red`, 16 KiB in all).
const SEG_MAX: u32 = 4000u;
var<workgroup> seg: array<f32, SEG_MAX>;

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
    red[lidx] = ss;
    workgroupBarrier();
    for (var st = wg / 2u; st > 0u; st >>= 1u) {
        if lidx < st {
            red[lidx] += red[lidx + st];
        }
        workgroupBarrier();
    }
    let head = (EPILOGUE & 256u) != 0u;
    let normed = !head || s0 < rope_rows();
    var scale = 1.0;
    var g0 = p.post_offset;
    if head {
        scale = inverseSqrt(red[0] / f32(p.seg_len) + p.hn_eps);
        // The keys' weights follow the queries' with a KV split.
        g0 = p.hn_offset + select(0u, p.seg_len, has_kv() && s0 >= p.n_q);
    } else {
        scale = inverseSqrt(red[0] / f32(p.seg_len) + p.post_eps);
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

// Prefill without workgroup memory: invocation gi computes rows m0 .. m0 + 8 of x against
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
                    av *= params[p.gamma_offset + gk];
                }
            }
            Xs[ak * TM + am] = av;
        }
        // w: invocation i dequantizes block kt of weight row col0 + i (zeros past N).
        let gn = col0 + lidx;
        if gn < p.n && kt < p.blocks {
            let wr = wrow(gn);
            let wv = weight_values_row(wr, kt);
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

// Embedding rows from an f16 or block-quantized table [rows, row]: one invocation per
// 32-element block of the output for block formats (row % 32 == 0), per element for f16.
// Negative i32 ids in [-rows, 0) count from the end (ONNX Gather); other ids outside the
// table give zeros.
@compute @workgroup_size(64, 1, 1)
fn quant_gather(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = workgroup_index(wid, nwg) * 64u + lidx;
    if weight_is_block() {
        let per_row = gp.row / 32u;
        if i >= gp.num_ids * per_row {
            return;
        }
        let which = i / per_row;
        let c = i % per_row;
        let id = table_row(ids[gp.ids_offset + which]);
        let o = gp.out_offset + which * gp.row + c * 32u;
        var v: array<vec4<f32>, 8>;
        if id < gp.rows {
            v = block_values(gp.table_offset, id * per_row + c, 0u);
        }
        for (var j = 0u; j < 8u; j++) {
            dst[o + 4u * j] = v[j].x;
            dst[o + 4u * j + 1u] = v[j].y;
            dst[o + 4u * j + 2u] = v[j].z;
            dst[o + 4u * j + 3u] = v[j].w;
        }
    } else {
        if i >= gp.num_ids * gp.row {
            return;
        }
        let which = i / gp.row;
        let c = i % gp.row;
        let id = table_row(ids[gp.ids_offset + which]);
        var v = 0.0;
        if id < gp.rows {
            v = element_at(gp.table_offset, id * gp.row + c);
        }
        dst[gp.out_offset + i] = v;
    }
}

// Reorders a weight from its file layout (w, from word gp.table_offset) into the grouped
// planes of its format (ids, from word gp.out_offset): one invocation per word of the result,
// gp.num_ids words in all (whole groups), each gathered byte by byte from its place in the
// same group of the file. Run once per weight (the runtime's weight layouts), so simple.
@compute @workgroup_size(64, 1, 1)
fn quant_regroup(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = workgroup_index(wid, nwg) * 64u + lidx;
    if i >= gp.num_ids {
        return;
    }
    let gb = group_bytes();
    let group = (i * 4u) / gb;
    let within = (i * 4u) % gb;
    var word = 0u;
    for (var b = 0u; b < 4u; b++) {
        word |= byte_at(gp.table_offset, group * gb + grouped_source(within + b)) << (8u * b);
    }
    ids[gp.out_offset + i] = word;
}
