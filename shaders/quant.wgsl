// quant: kernels reading weights in their stored format. linear: y[m, n] = sum_k x[m, k] * w[n, k], the weight in its stored format.
//
// The weight w [N, K] is read as 32-bit words in the GGUF row layout and dequantized as it is
// read; the format is a pipeline-overridable constant (WEIGHT_FORMAT), so each format gets its
// own pipeline with the switch folded away:
//   0 f32   K words per row
//   1 f16   element e = n * K + k is half (e & 1) of word e / 2
//   2 q4_1  blocks of 32 elements in 20 bytes (5 words): word 0 = f16 d | f16 m << 16, words
//           1..4 = 16 bytes of nibbles; byte j holds element j (low nibble) and j + 16 (high);
//           value = d * q + m. Blocks are word aligned.
//   3 q8_0  blocks of 32 elements in 34 bytes: f16 d, 32 i8 q; value = d * q. A block starts
//           at a byte offset that is 0 or 2 mod 4; both cases read 9 words.
// Block formats need K % 32 == 0 (checked on the host); f32 and f16 take any K (the last
// partial block is read element by element).
//
// Entry points:
//   quant_matvec  decode (M <= 8): each invocation owns ROWS consecutive output rows of one
//                  x row and walks K one block at a time: the 32 values of x are loaded once
//                  per block and used for all ROWS weight rows, each weight word is loaded
//                  once. 64 invocations per workgroup; groups linearised over a 2-D grid.
//   quant_tiled   prefill: a workgroup of 8x8 invocations computes a 64x64 output tile (64
//                  rows of x, 64 output columns), each invocation an 8x8 register block. K is
//                  walked one 32-element block at a time: the workgroup stages the 64x32 tile
//                  of x and dequantizes the 64 weight blocks (one per invocation) into
//                  workgroup memory, then every invocation does 32 x (8 + 8 loads, 64 FMAs).
//
// Bindings (group 0):
//   0 uniform  LinearParams (dynamic offset)
//   1 storage read_write  x    f32 [M, K]
//   2 storage read_write  w    u32 words of the weight
//   3 storage read_write  out  f32 [M, N]
//
// Rust mirror (src/gpu/kernels/quant.rs, #[repr(C)], bytemuck::Pod), 32 bytes:
//   struct LinearParams { m: u32, k: u32, n: u32, blocks: u32,
//                         x_offset: u32, w_offset: u32, out_offset: u32, tiles_n: u32 }
// x_offset and out_offset are in f32 elements, w_offset in words, from each binding's start.

override WEIGHT_FORMAT: u32 = 2u;

struct LinearParams {
    m: u32,
    k: u32,
    n: u32,
    blocks: u32,
    x_offset: u32,
    w_offset: u32,
    out_offset: u32,
    tiles_n: u32,
}

@group(0) @binding(0) var<uniform> p: LinearParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// Element e of an f32 or f16 tensor starting at word wo (the partial last block of a row,
// unaligned f16 rows, f16 tables).
fn element_at(wo: u32, e: u32) -> f32 {
    if WEIGHT_FORMAT == 0u {
        return bitcast<f32>(w[wo + e]);
    }
    let h = unpack2x16float(w[wo + e / 2u]);
    return select(h.x, h.y, (e & 1u) == 1u);
}

fn weight_at(n: u32, k: u32) -> f32 {
    return element_at(p.w_offset, n * p.k + k);
}

fn nibbles(q: u32, shift: u32) -> vec4<f32> {
    let v = (vec4<u32>(q) >> vec4<u32>(shift, shift + 8u, shift + 16u, shift + 24u)) & vec4<u32>(15u);
    return vec4<f32>(v);
}

fn bytes_i8(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<i32>(bitcast<i32>(q)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

// The 32 values of one block of a tensor starting at word wo, as 8 vec4s in element order:
// block number blk for the block formats, elements e .. e + 31 for f32 and f16.
fn block_values(wo: u32, blk: u32, e: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    switch WEIGHT_FORMAT {
        case 2u: {
            let wi = wo + blk * 5u;
            let dm = unpack2x16float(w[wi]);
            for (var i = 0u; i < 4u; i++) {
                let q = w[wi + 1u + i];
                v[i] = dm.x * nibbles(q, 0u) + dm.y;
                v[i + 4u] = dm.x * nibbles(q, 4u) + dm.y;
            }
        }
        case 3u: {
            let byte = wo * 4u + blk * 34u;
            let wi = byte / 4u;
            let odd = (byte & 2u) != 0u;
            var u = w[wi];
            let d = unpack2x16float(select(u, u >> 16u, odd)).x;
            for (var i = 0u; i < 8u; i++) {
                let next = w[wi + 1u + i];
                let q = select((u >> 16u) | (next << 16u), next, odd);
                u = next;
                v[i] = d * bytes_i8(q);
            }
        }
        case 1u: {
            if (e & 1u) == 0u {
                let wi = wo + e / 2u;
                for (var i = 0u; i < 8u; i++) {
                    v[i] = vec4<f32>(unpack2x16float(w[wi + 2u * i]), unpack2x16float(w[wi + 2u * i + 1u]));
                }
            } else {
                for (var i = 0u; i < 8u; i++) {
                    let j = e + 4u * i;
                    v[i] = vec4<f32>(element_at(wo, j), element_at(wo, j + 1u), element_at(wo, j + 2u), element_at(wo, j + 3u));
                }
            }
        }
        default: {
            let wi = wo + e;
            for (var i = 0u; i < 8u; i++) {
                let j = wi + 4u * i;
                v[i] = bitcast<vec4<f32>>(vec4<u32>(w[j], w[j + 1u], w[j + 2u], w[j + 3u]));
            }
        }
    }
    return v;
}

// Block b of weight row n.
fn weight_block(n: u32, b: u32) -> array<vec4<f32>, 8> {
    return block_values(p.w_offset, n * p.blocks + b, n * p.k + b * 32u);
}

const ROWS: u32 = 4u;

@compute @workgroup_size(64, 1, 1)
fn quant_matvec(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let gi = (wid.x + wid.y * nwg.x) * 64u + lidx;
    let per_row = (p.n + ROWS - 1u) / ROWS;
    let m = gi / per_row;
    if m >= p.m {
        return;
    }
    let n0 = (gi % per_row) * ROWS;
    let xb = p.x_offset + m * p.k;
    var acc: array<f32, ROWS>;
    for (var b = 0u; b < p.blocks; b++) {
        var xs: array<vec4<f32>, 8>;
        let k0 = xb + b * 32u;
        for (var i = 0u; i < 8u; i++) {
            let j = k0 + 4u * i;
            xs[i] = vec4<f32>(x[j], x[j + 1u], x[j + 2u], x[j + 3u]);
        }
        for (var r = 0u; r < ROWS; r++) {
            // Rows past N repeat the last row (not stored), keeping the loop free of branches.
            let wv = weight_block(min(n0 + r, p.n - 1u), b);
            var s = 0.0;
            for (var i = 0u; i < 8u; i++) {
                s += dot(xs[i], wv[i]);
            }
            acc[r] += s;
        }
    }
    // f32 / f16 rows whose K is not a multiple of 32: the rest element by element.
    for (var k = p.blocks * 32u; k < p.k; k++) {
        let xv = x[xb + k];
        for (var r = 0u; r < ROWS; r++) {
            acc[r] += xv * weight_at(min(n0 + r, p.n - 1u), k);
        }
    }
    let ob = p.out_offset + m * p.n;
    for (var r = 0u; r < ROWS; r++) {
        if n0 + r < p.n {
            dst[ob + n0 + r] = acc[r];
        }
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
    let t = wid.x + wid.y * nwg.x;
    let row0 = (t / p.tiles_n) * TM;
    let col0 = (t % p.tiles_n) * TN;
    if row0 >= p.m {
        return;
    }
    let tx = lid.x;
    let ty = lid.y;
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
                av = x[p.x_offset + gm * p.k + gk];
            }
            Xs[ak * TM + am] = av;
        }
        // w: invocation i dequantizes block kt of weight row col0 + i (zeros past N).
        let gn = col0 + lidx;
        if gn < p.n && kt < p.blocks {
            let wv = weight_block(gn, kt);
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
    store_row(row0 + ty * 8u + 0u, gn0, c00, c01);
    store_row(row0 + ty * 8u + 1u, gn0, c10, c11);
    store_row(row0 + ty * 8u + 2u, gn0, c20, c21);
    store_row(row0 + ty * 8u + 3u, gn0, c30, c31);
    store_row(row0 + ty * 8u + 4u, gn0, c40, c41);
    store_row(row0 + ty * 8u + 5u, gn0, c50, c51);
    store_row(row0 + ty * 8u + 6u, gn0, c60, c61);
    store_row(row0 + ty * 8u + 7u, gn0, c70, c71);
}

// Stores one row of an 8x8 register block, skipping what lies outside the output.
fn store_row(gm: u32, gn0: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if gm >= p.m {
        return;
    }
    let base = p.out_offset + gm * p.n;
    for (var j = 0u; j < 4u; j++) {
        if gn0 + j < p.n {
            dst[base + gn0 + j] = lo[j];
        }
        if gn0 + 4u + j < p.n {
            dst[base + gn0 + 4u + j] = hi[j];
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
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> gp: GatherParams;
@group(0) @binding(4) var<storage, read_write> ids: array<u32>;

// Embedding rows from an f16 or block-quantized table: one invocation per 32-element block of
// the output for block formats (row % 32 == 0), per element for f16. Ids >= rows (negative
// i32 included) give zeros.
@compute @workgroup_size(64, 1, 1)
fn quant_gather(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * 64u + lidx;
    if WEIGHT_FORMAT >= 2u {
        let per_row = gp.row / 32u;
        if i >= gp.num_ids * per_row {
            return;
        }
        let which = i / per_row;
        let c = i % per_row;
        let id = ids[gp.ids_offset + which];
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
        let id = ids[gp.ids_offset + which];
        var v = 0.0;
        if id < gp.rows {
            v = element_at(gp.table_offset, id * gp.row + c);
        }
        dst[gp.out_offset + i] = v;
    }
}
