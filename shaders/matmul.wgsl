// Batched matrix multiplication, tiled through workgroup shared memory.
//
// Entry points:
//   matmul_tiled  workgroup 8x8 invocations computes a 64x64 output tile; each invocation
//                 owns an 8x8 register block (rows ty*8.., columns tx*8..). The K axis is walked
//                 in steps of 16: the workgroup stages a 64x16 tile of A and a 16x64 tile of B in
//                 shared memory as vec4s (A row-major with 4 k per vec4, B k-major with 4 n per
//                 vec4; each invocation gathers 4 vec4s of each from memory, zero-filled outside
//                 the matrix), then every invocation does 4 x (8 + 8 vec4 shared loads,
//                 256 FMAs). Why vec4s and an 8x8 block: on llvmpipe/lavapipe and SwiftShader
//                 an invocation is one lane of a CPU vector and a shared-memory load with a
//                 per-invocation address is a loop over the lanes, so loads per FMA decide the
//                 speed, and one vec4 load costs about what one f32 load does: 16 vec4 loads per
//                 256 FMAs here against 16 f32 loads per 64 FMAs with f32 tiles (figures:
//                 docs/benchmarks/2026-11-23-matmul-vec4-tiles.md);
//                 8x8 halves them again against 4x4.
//                 Output tiles of all batches are linearised over a
//                 2-D grid (workgroup_index of the prelude) so that batch x tiles
//                 may exceed max_compute_workgroups_per_dimension.
//
//   matmul_tiled4 matmul_tiled for operands contiguous along K (A) and N (B) whose offsets,
//                 strides, K and N are multiples of 4 (src/gpu/kernels/matmul.rs checks): the
//                 tiles are staged with one vec4 load per vec4 instead of four f32 loads through
//                 strides (on SwiftShader, where wgpu clamps every storage index, f32 loads
//                 make the vec4 tiles slower than f32 tiles; on lavapipe the vec4 loads add
//                 GFLOP/s too: docs/benchmarks/2026-11-23-matmul-vec4-tiles.md).
//
//   matmul_small_m  for M <= 8 (decode: one new token per step), where a 64-row tile would
//                 waste most of its work: a workgroup of 64 invocations covers one output row
//                 and 256 columns, each invocation 4 adjacent columns, reading A's row (the
//                 same word in every invocation) and B straight from memory. Output tiles are
//                 (batch, row, 256-column block), linearised like matmul_tiled with
//                 tiles_m = M and tiles_n = ceil(N / 256).
//
//   matmul_conv   convolution as an implicit GEMM on the same tiles (why not im2col: the
//                 [C * kernel, out pixels] matrix would be a temporary kernel-volume times the
//                 input's size, and a second pass over it; here each B tile is gathered from
//                 the input while it is staged): per (image, group), A = the group's weights
//                 [OC / g, C / g * kernel] (contiguous rows), B[k, p] = the input element under
//                 kernel position k at output pixel p (0 in the padding), out = A B + bias.
//                 Up to 3 spatial dimensions (fewer: leading extents of 1). Each invocation
//                 gathers one pixel's column of B, carrying k's channel and kernel position
//                 from step to step instead of dividing them out of k (struct Gather).
//   matmul_conv4  matmul_conv with the weights staged as vec4s (b4) where K and the weights'
//                 offset are multiples of 4 (src/gpu/kernels/matmul.rs checks).
//   matmul_scale  gemm epilogue: out = alpha * out.
//   matmul_bias   gemm epilogue: out = alpha * out + beta * c[i * c_stride_m + j * c_stride_n]
//                 (c broadcast to [M, N] through zero strides).
//
// A and B are addressed through strides, so a transposed operand (`transpose_b`, gemm's
// transA / transB) is just swapped strides, and broadcast batch dimensions have batch stride
// 0. One pipeline per entry point serves every shape; no specialisation. The three tiled entry
// points share the register block (struct Acc, 8 rows of 2 named vec4 accumulators), its FMA
// step and its stores; only their tile loaders differ.
//
// Bindings (group 0):
//   0 uniform  MatMulParams | ConvParams | EpilogueParams (dynamic offset)
//   1 storage read_write  a    [..., M, K]          (conv: x [N, C, D, H, W]; matmul_tiled4: a4,
//                                                   the same bytes as vec4s)
//   2 storage read_write  b    [..., K, N] (or [..., N, K])   (conv: w [OC, C / g, kd, kh, kw];
//                                                   matmul_tiled4, matmul_conv4: b4)
//   3 storage read_write  out  [batch..., M, N], contiguous   (conv: [N, OC, OD, OH, OW])
//   4 storage read_write  bias (conv: [OC]) / c (matmul_bias)
//
// Rust mirror (src/gpu/kernels/matmul.rs, #[repr(C)], bytemuck::Pod), 112 bytes:
//   struct MatMulParams { m: u32, k: u32, n: u32, batch: u32,
//                         tiles_m: u32, tiles_n: u32, batch_rank: u32, _pad0: u32,
//                         a_offset: u32, b_offset: u32, out_offset: u32, _pad1: u32,
//                         a_stride_m: u32, a_stride_k: u32, b_stride_k: u32, b_stride_n: u32,
//                         batch_shape: [u32; 4], a_batch_strides: [u32; 4],
//                         b_batch_strides: [u32; 4] }
//   struct ConvParams { m: u32, k: u32, n: u32, batch: u32, tiles_m: u32, tiles_n: u32,
//                       group: u32, cg: u32, x_offset: u32, w_offset: u32, out_offset: u32,
//                       bias_offset: u32, in_dims: [u32; 4], out_dims: [u32; 4],
//                       kernel: [u32; 4], strides: [u32; 4], dilations: [u32; 4],
//                       pads: [u32; 4] }                                   // 144 bytes
//   struct EpilogueParams { numel: u32, n: u32, out_offset: u32, c_offset: u32,
//                           c_stride_m: u32, c_stride_n: u32, alpha: f32, beta: f32 } // 32 bytes
// Offsets and strides are in f32 elements from the start of each binding; conv's vec4s hold
// (d, h, w, unused).

struct MatMulParams {
    m: u32,
    k: u32,
    n: u32,
    batch: u32,
    tiles_m: u32,
    tiles_n: u32,
    batch_rank: u32,
    _pad0: u32,
    a_offset: u32,
    b_offset: u32,
    out_offset: u32,
    _pad1: u32,
    a_stride_m: u32,
    a_stride_k: u32,
    b_stride_k: u32,
    b_stride_n: u32,
    batch_shape: vec4<u32>,
    a_batch_strides: vec4<u32>,
    b_batch_strides: vec4<u32>,
}

struct ConvParams {
    m: u32,
    k: u32,
    n: u32,
    batch: u32,
    tiles_m: u32,
    tiles_n: u32,
    group: u32,
    cg: u32,
    x_offset: u32,
    w_offset: u32,
    out_offset: u32,
    bias_offset: u32,
    in_dims: vec4<u32>,
    out_dims: vec4<u32>,
    kernel: vec4<u32>,
    strides: vec4<u32>,
    dilations: vec4<u32>,
    pads: vec4<u32>,
}

struct EpilogueParams {
    numel: u32,
    n: u32,
    out_offset: u32,
    c_offset: u32,
    c_stride_m: u32,
    c_stride_n: u32,
    alpha: f32,
    beta: f32,
}

@group(0) @binding(0) var<uniform> p: MatMulParams;
@group(0) @binding(0) var<uniform> cv: ConvParams;
@group(0) @binding(0) var<uniform> ep: EpilogueParams;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
// The same bindings as vec4s, for matmul_tiled4 (both) and matmul_conv4 (b4) only.
@group(0) @binding(1) var<storage, read_write> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<storage, read_write> extra: array<f32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

const TK4: u32 = 4u; // TK / 4
const TN4: u32 = 16u; // TN / 4

// As[m * TK4 + k / 4] holds A[m, k..k + 4]; Bs[k * TN4 + n / 4] holds B[k, n..n + 4]. An
// invocation reads a vec4 of k for each of its rows and two vec4s of n per k.
var<workgroup> As: array<vec4<f32>, 256>;
var<workgroup> Bs: array<vec4<f32>, 256>;

// The 8x8 register block of one invocation: r{i} is row ty*8 + i, columns tx*8 .. tx*8+7.
// Named rows of named vec4s, not an array, so every backend keeps them in registers.
struct Acc {
    r0: Row, r1: Row, r2: Row, r3: Row, r4: Row, r5: Row, r6: Row, r7: Row,
}

// One row of the register block: columns tx*8 .. tx*8+3 and tx*8+4 .. tx*8+7.
struct Row {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// Row r of the register block plus a[q] * (row q of the B slice), q = 0..3.
fn fma_row(r: Row, a: vec4<f32>, b: BSlice) -> Row {
    var lo = fma(vec4<f32>(a.x), b.l0, r.lo);
    var hi = fma(vec4<f32>(a.x), b.h0, r.hi);
    lo = fma(vec4<f32>(a.y), b.l1, lo);
    hi = fma(vec4<f32>(a.y), b.h1, hi);
    lo = fma(vec4<f32>(a.z), b.l2, lo);
    hi = fma(vec4<f32>(a.z), b.h2, hi);
    lo = fma(vec4<f32>(a.w), b.l3, lo);
    hi = fma(vec4<f32>(a.w), b.h3, hi);
    return Row(lo, hi);
}

// Four k of an invocation's 8 B columns: row q is (l{q}, h{q}).
struct BSlice {
    l0: vec4<f32>, h0: vec4<f32>, l1: vec4<f32>, h1: vec4<f32>,
    l2: vec4<f32>, h2: vec4<f32>, l3: vec4<f32>, h3: vec4<f32>,
}

// One staged K tile into the register block: 4 x (8 + 8 vec4 shared loads, 256 FMAs).
fn mma_tile(acc: ptr<function, Acc>, tx: u32, ty: u32) {
    let ar = ty * 8u * TK4;
    for (var kk = 0u; kk < TK4; kk++) {
        let bj = kk * 4u * TN4 + tx * 2u;
        let b = BSlice(Bs[bj], Bs[bj + 1u], Bs[bj + TN4], Bs[bj + TN4 + 1u],
            Bs[bj + 2u * TN4], Bs[bj + 2u * TN4 + 1u], Bs[bj + 3u * TN4], Bs[bj + 3u * TN4 + 1u]);
        (*acc).r0 = fma_row((*acc).r0, As[ar + kk], b);
        (*acc).r1 = fma_row((*acc).r1, As[ar + TK4 + kk], b);
        (*acc).r2 = fma_row((*acc).r2, As[ar + 2u * TK4 + kk], b);
        (*acc).r3 = fma_row((*acc).r3, As[ar + 3u * TK4 + kk], b);
        (*acc).r4 = fma_row((*acc).r4, As[ar + 4u * TK4 + kk], b);
        (*acc).r5 = fma_row((*acc).r5, As[ar + 5u * TK4 + kk], b);
        (*acc).r6 = fma_row((*acc).r6, As[ar + 6u * TK4 + kk], b);
        (*acc).r7 = fma_row((*acc).r7, As[ar + 7u * TK4 + kk], b);
    }
}

// Stores one row of an 8x8 register block (plus a per-row bias), skipping what lies outside
// the m x n output at out_base.
fn store_row(out_base: u32, m: u32, n: u32, gm: u32, gn0: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if gm >= m {
        return;
    }
    let base = out_base + gm * n;
    for (var j = 0u; j < 4u; j++) {
        if gn0 + j < n {
            dst[base + gn0 + j] = lo[j];
        }
        if gn0 + 4u + j < n {
            dst[base + gn0 + 4u + j] = hi[j];
        }
    }
}

// Stores the register block whose first row is gm0 and first column gn0; bias[r] is added
// to row gm0 + r.
fn store_acc(acc: ptr<function, Acc>, out_base: u32, m: u32, n: u32, gm0: u32, gn0: u32, bias_lo: vec4<f32>, bias_hi: vec4<f32>) {
    store_row(out_base, m, n, gm0 + 0u, gn0, (*acc).r0.lo + bias_lo[0], (*acc).r0.hi + bias_lo[0]);
    store_row(out_base, m, n, gm0 + 1u, gn0, (*acc).r1.lo + bias_lo[1], (*acc).r1.hi + bias_lo[1]);
    store_row(out_base, m, n, gm0 + 2u, gn0, (*acc).r2.lo + bias_lo[2], (*acc).r2.hi + bias_lo[2]);
    store_row(out_base, m, n, gm0 + 3u, gn0, (*acc).r3.lo + bias_lo[3], (*acc).r3.hi + bias_lo[3]);
    store_row(out_base, m, n, gm0 + 4u, gn0, (*acc).r4.lo + bias_hi[0], (*acc).r4.hi + bias_hi[0]);
    store_row(out_base, m, n, gm0 + 5u, gn0, (*acc).r5.lo + bias_hi[1], (*acc).r5.hi + bias_hi[1]);
    store_row(out_base, m, n, gm0 + 6u, gn0, (*acc).r6.lo + bias_hi[2], (*acc).r6.hi + bias_hi[2]);
    store_row(out_base, m, n, gm0 + 7u, gn0, (*acc).r7.lo + bias_hi[3], (*acc).r7.hi + bias_hi[3]);
}

// Where a matmul_tiled / matmul_tiled4 workgroup works: its batch (bi >= p.batch: none, the
// grid's padding), the tile's first row and column, and the batch's A and B element offsets.
struct TileAt {
    bi: u32,
    row0: u32,
    col0: u32,
    a_base: u32,
    b_base: u32,
}

// Output tiles of all batches linearised over the 2-D grid (g: workgroup_index).
// Everything depends only on uniforms and workgroup ids, so control flow stays uniform as
// WGSL requires around workgroupBarrier.
fn tile_at(g: u32) -> TileAt {
    let tiles = p.tiles_m * p.tiles_n;
    let bi = g / tiles;
    let t = g % tiles;
    var a_base = p.a_offset;
    var b_base = p.b_offset;
    var rem = bi;
    for (var j = 0u; j < p.batch_rank; j++) {
        let d = p.batch_rank - 1u - j;
        let ext = p.batch_shape[d];
        let idx = rem % ext;
        rem = rem / ext;
        a_base += idx * p.a_batch_strides[d];
        b_base += idx * p.b_batch_strides[d];
    }
    return TileAt(bi, (t / p.tiles_n) * TM, (t % p.tiles_n) * TN, a_base, b_base);
}

// Stages K tile k0.. of A and B through strides: each invocation gathers 4 vec4s of each,
// one f32 at a time, zero outside the matrices.
fn stage_strided(at: TileAt, k0: u32, lidx: u32) {
    for (var r = 0u; r < 4u; r++) {
        let idx = lidx + 64u * r;
        // A: consecutive invocations walk k (contiguous in row-major A).
        let gm = at.row0 + idx / TK4;
        let gk = k0 + (idx % TK4) * 4u;
        var av = vec4<f32>(0.0);
        if gm < p.m {
            let ra = at.a_base + gm * p.a_stride_m;
            for (var j = 0u; j < 4u; j++) {
                if gk + j < p.k {
                    av[j] = a[ra + (gk + j) * p.a_stride_k];
                }
            }
        }
        As[idx] = av;
        // B: consecutive invocations walk n (contiguous in row-major B).
        let gk2 = k0 + idx / TN4;
        let gn = at.col0 + (idx % TN4) * 4u;
        var bv = vec4<f32>(0.0);
        if gk2 < p.k {
            let rb = at.b_base + gk2 * p.b_stride_k;
            for (var j = 0u; j < 4u; j++) {
                if gn + j < p.n {
                    bv[j] = b[rb + (gn + j) * p.b_stride_n];
                }
            }
        }
        Bs[idx] = bv;
    }
}

// stage_strided for operands read as vec4s: a_stride_k = b_stride_n = 1 and every other
// offset, stride, K and N a multiple of 4 (the encoder checks), so A[m, k..k + 4] and
// B[k, n..n + 4] are one aligned vec4 each, wholly inside or wholly outside the matrix.
fn stage_vec4(at: TileAt, k0: u32, lidx: u32) {
    for (var r = 0u; r < 4u; r++) {
        let idx = lidx + 64u * r;
        let gm = at.row0 + idx / TK4;
        let gk = k0 + (idx % TK4) * 4u;
        var av = vec4<f32>(0.0);
        if gm < p.m && gk < p.k {
            av = a4[(at.a_base + gm * p.a_stride_m + gk) / 4u];
        }
        As[idx] = av;
        let gk2 = k0 + idx / TN4;
        let gn = at.col0 + (idx % TN4) * 4u;
        var bv = vec4<f32>(0.0);
        if gk2 < p.k && gn < p.n {
            bv = b4[(at.b_base + gk2 * p.b_stride_k + gn) / 4u];
        }
        Bs[idx] = bv;
    }
}

@compute @workgroup_size(8, 8, 1)
fn matmul_tiled(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let at = tile_at(workgroup_index(wid, nwg));
    if at.bi >= p.batch {
        return;
    }
    var acc: Acc;
    let ktiles = (p.k + TK - 1u) / TK;
    for (var kt = 0u; kt < ktiles; kt++) {
        stage_strided(at, kt * TK, lidx);
        workgroupBarrier();
        mma_tile(&acc, lid.x, lid.y);
        workgroupBarrier();
    }
    let zero = vec4<f32>(0.0);
    store_acc(&acc, p.out_offset + at.bi * p.m * p.n, p.m, p.n, at.row0 + lid.y * 8u, at.col0 + lid.x * 8u, zero, zero);
}

// matmul_tiled with stage_vec4. Written out rather than shared with matmul_tiled through a
// flag: an entry point whose call tree reaches both `a` and `a4` (one binding, two types) is
// invalid (naga: "Bindings ... conflict"), so each entry point calls only its own loader.
@compute @workgroup_size(8, 8, 1)
fn matmul_tiled4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let at = tile_at(workgroup_index(wid, nwg));
    if at.bi >= p.batch {
        return;
    }
    var acc: Acc;
    let ktiles = (p.k + TK - 1u) / TK;
    for (var kt = 0u; kt < ktiles; kt++) {
        stage_vec4(at, kt * TK, lidx);
        workgroupBarrier();
        mma_tile(&acc, lid.x, lid.y);
        workgroupBarrier();
    }
    let zero = vec4<f32>(0.0);
    store_acc(&acc, p.out_offset + at.bi * p.m * p.n, p.m, p.n, at.row0 + lid.y * 8u, at.col0 + lid.x * 8u, zero, zero);
}

// Where a matmul_conv / matmul_conv4 workgroup works: its (image, group) index bi
// (>= cv.batch: none, the grid's padding), image and group, the tile's first row and column,
// and the group's weights, rows g * m .. (g + 1) * m of [OC, k] from element w_base.
struct ConvAt {
    bi: u32,
    n_img: u32,
    g: u32,
    row0: u32,
    col0: u32,
    w_base: u32,
}

// Tiles of all (image, group) pairs linearised over the 2-D grid like tile_at.
fn conv_at(t_all: u32) -> ConvAt {
    let tiles = cv.tiles_m * cv.tiles_n;
    let bi = t_all / tiles;
    let g = bi % cv.group;
    let t = t_all % tiles;
    return ConvAt(bi, bi / cv.group, g, (t / cv.tiles_n) * TM, (t % cv.tiles_n) * TN, cv.w_offset + g * cv.m * cv.k);
}

// An invocation's walk down its column of the B tiles: in step r of every K tile it gathers
// row k0 + r at column lidx, so its output pixel is fixed (org: the pixel's first input
// position, stride times the pixel minus the padding; x_img: the image and group's first
// input element) and k only advances by one, the same k in every invocation: its channel c
// and kernel position kpos are carried along instead of divided out of k for every element
// (integer division is a loop over the lanes on the CPU adapters).
struct Gather {
    org: vec3<i32>,
    pix_ok: bool,
    x_img: u32,
    c: u32,
    kpos: vec3<u32>,
}

fn conv_gather(at: ConvAt, lidx: u32) -> Gather {
    let q = at.col0 + lidx;
    let od = q / (cv.out_dims.y * cv.out_dims.z);
    let oh = (q / cv.out_dims.z) % cv.out_dims.y;
    let ow = q % cv.out_dims.z;
    let org = vec3<i32>(vec3<u32>(od, oh, ow) * cv.strides.xyz) - vec3<i32>(cv.pads.xyz);
    let x_img = cv.x_offset + (at.n_img * cv.group + at.g) * cv.cg * cv.in_dims.x * cv.in_dims.y * cv.in_dims.z;
    return Gather(org, q < cv.n, x_img, 0u, vec3<u32>(0u));
}

// Stages the B tile of K tile k0..: the input element under each k at the invocation's
// pixel (0 in the padding and outside the matrix), one f32 per step into its vec4's
// component (on SwiftShader a vec4 built from four guarded gathers cost a fifth more).
fn stage_conv_input(gt: ptr<function, Gather>, k0: u32, lidx: u32) {
    for (var r = 0u; r < TK; r++) {
        let pos = (*gt).org + vec3<i32>((*gt).kpos * cv.dilations.xyz);
        var bv = 0.0;
        if k0 + r < cv.k && (*gt).pix_ok && all(pos >= vec3<i32>(0)) && all(pos < vec3<i32>(cv.in_dims.xyz)) {
            let p3 = vec3<u32>(pos);
            bv = a[(*gt).x_img + (((*gt).c * cv.in_dims.x + p3.x) * cv.in_dims.y + p3.y) * cv.in_dims.z + p3.z];
        }
        Bs[r * TN4 + lidx / 4u][lidx % 4u] = bv;
        // k + 1: the next kernel position, or the next channel's first.
        var kp = (*gt).kpos + vec3<u32>(0u, 0u, 1u);
        if kp.z == cv.kernel.z {
            kp = vec3<u32>(kp.x, kp.y + 1u, 0u);
            if kp.y == cv.kernel.y {
                kp = vec3<u32>(kp.x + 1u, 0u, 0u);
                if kp.x == cv.kernel.x {
                    kp = vec3<u32>(0u);
                    (*gt).c += 1u;
                }
            }
        }
        (*gt).kpos = kp;
    }
}

// Adds the bias of the invocation's 8 rows and stores its register block.
fn store_conv(acc: ptr<function, Acc>, at: ConvAt, lid: vec3<u32>) {
    let gm0 = at.row0 + lid.y * 8u;
    var bias = array<f32, 8>();
    for (var r = 0u; r < 8u; r++) {
        if gm0 + r < cv.m {
            bias[r] = extra[cv.bias_offset + at.g * cv.m + gm0 + r];
        }
    }
    let out_base = cv.out_offset + at.bi * cv.m * cv.n;
    store_acc(acc, out_base, cv.m, cv.n, gm0, at.col0 + lid.x * 8u,
        vec4<f32>(bias[0], bias[1], bias[2], bias[3]), vec4<f32>(bias[4], bias[5], bias[6], bias[7]));
}

@compute @workgroup_size(8, 8, 1)
fn matmul_conv(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let at = conv_at(workgroup_index(wid, nwg));
    if at.bi >= cv.batch {
        return;
    }
    var acc: Acc;
    var gt = conv_gather(at, lidx);
    let ktiles = (cv.k + TK - 1u) / TK;
    for (var kt = 0u; kt < ktiles; kt++) {
        let k0 = kt * TK;
        // A, one f32 per step like B: consecutive invocations walk k (contiguous weight rows).
        for (var r = 0u; r < 16u; r++) {
            let idx = lidx + 64u * r;
            let am = idx / TK;
            let ak = idx % TK;
            let gm = at.row0 + am;
            let gk = k0 + ak;
            var av = 0.0;
            if gm < cv.m && gk < cv.k {
                av = b[at.w_base + gm * cv.k + gk];
            }
            As[am * TK4 + ak / 4u][ak % 4u] = av;
        }
        stage_conv_input(&gt, k0, lidx);
        workgroupBarrier();
        mma_tile(&acc, lid.x, lid.y);
        workgroupBarrier();
    }
    store_conv(&acc, at, lid);
}

// matmul_conv for weights read as vec4s: K and the weights' offset multiples of 4 (the
// encoder checks; the weights are contiguous), so W[m, k..k + 4] is one aligned vec4 wholly
// inside or wholly outside the matrix, and the A tile takes 4 vec4 loads per invocation
// instead of 16 f32 loads (on SwiftShader, where wgpu clamps every storage index, f32 loads
// make the convolution slower on the vec4 tiles than on f32 tiles). Written out
// beside matmul_conv for the reason matmul_tiled4 is.
@compute @workgroup_size(8, 8, 1)
fn matmul_conv4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let at = conv_at(workgroup_index(wid, nwg));
    if at.bi >= cv.batch {
        return;
    }
    var acc: Acc;
    var gt = conv_gather(at, lidx);
    let ktiles = (cv.k + TK - 1u) / TK;
    for (var kt = 0u; kt < ktiles; kt++) {
        let k0 = kt * TK;
        for (var r = 0u; r < 4u; r++) {
            let idx = lidx + 64u * r;
            let gm = at.row0 + idx / TK4;
            let gk = k0 + (idx % TK4) * 4u;
            var av = vec4<f32>(0.0);
            if gm < cv.m && gk < cv.k {
                av = b4[(at.w_base + gm * cv.k + gk) / 4u];
            }
            As[idx] = av;
        }
        stage_conv_input(&gt, k0, lidx);
        workgroupBarrier();
        mma_tile(&acc, lid.x, lid.y);
        workgroupBarrier();
    }
    store_conv(&acc, at, lid);
}

@compute @workgroup_size(256)
fn matmul_scale(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_index(wid, nwg, lidx);
    if i >= ep.numel {
        return;
    }
    dst[ep.out_offset + i] = ep.alpha * dst[ep.out_offset + i];
}

@compute @workgroup_size(256)
fn matmul_bias(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_index(wid, nwg, lidx);
    if i >= ep.numel {
        return;
    }
    let c = extra[ep.c_offset + (i / ep.n) * ep.c_stride_m + (i % ep.n) * ep.c_stride_n];
    dst[ep.out_offset + i] = ep.alpha * dst[ep.out_offset + i] + ep.beta * c;
}

@compute @workgroup_size(64, 1, 1)
fn matmul_small_m(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let g = workgroup_index(wid, nwg);
    let tiles = p.tiles_m * p.tiles_n;
    let bi = g / tiles;
    if bi >= p.batch {
        return;
    }
    let t = g % tiles;
    let row = t / p.tiles_n;
    let col0 = (t % p.tiles_n) * 256u + lidx * 4u;
    if col0 >= p.n {
        return;
    }
    var a_base = p.a_offset;
    var b_base = p.b_offset;
    var rem = bi;
    for (var j = 0u; j < p.batch_rank; j++) {
        let d = p.batch_rank - 1u - j;
        let ext = p.batch_shape[d];
        let idx = rem % ext;
        rem = rem / ext;
        a_base += idx * p.a_batch_strides[d];
        b_base += idx * p.b_batch_strides[d];
    }
    // Columns past N are clamped on load (and not stored), keeping the loop free of branches.
    let c = min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u));
    let cb = vec4<u32>(b_base) + c * p.b_stride_n;
    let ra = a_base + row * p.a_stride_m;
    var acc = vec4<f32>(0.0);
    for (var kk = 0u; kk < p.k; kk++) {
        let kb = kk * p.b_stride_k;
        let bv = vec4<f32>(b[cb.x + kb], b[cb.y + kb], b[cb.z + kb], b[cb.w + kb]);
        acc += a[ra + kk * p.a_stride_k] * bv;
    }
    let out_base = p.out_offset + bi * p.m * p.n + row * p.n;
    for (var j = 0u; j < 4u; j++) {
        if col0 + j < p.n {
            dst[out_base + col0 + j] = acc[j];
        }
    }
}
