// Batched matrix multiplication, tiled through workgroup shared memory.
//
// Entry points:
//   matmul_tiled  workgroup 8x8 invocations computes a 64x64 output tile; each invocation
//                 owns an 8x8 register block. The K axis is walked in steps of 16: the workgroup
//                 stages a 64x16 tile of A and a 16x64 tile of B in shared memory (16 loads per
//                 invocation each, zero-filled outside the matrix), then every invocation does
//                 16 x (8 + 8 loads, 64 FMAs). Why 8x8 and not 4x4 on 16x16 invocations: on
//                 llvmpipe/lavapipe every shared- or storage-memory load costs about the same
//                 per invocation and per component (about 7 ns measured with
//                 `dynrt bench kernels --probe`) while FMAs are cheap, so loads per FMA decide
//                 the speed; 8x8 halves them (16 loads per 64 FMAs instead of 8 per 16). Output tiles of all batches are linearised over a
//                 2-D grid (linear index wid.x + wid.y * num_workgroups.x) so that batch x tiles
//                 may exceed max_compute_workgroups_per_dimension.
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
//                 Up to 3 spatial dimensions (fewer: leading extents of 1).
//   matmul_scale  gemm epilogue: out = alpha * out.
//   matmul_bias   gemm epilogue: out = alpha * out + beta * c[i * c_stride_m + j * c_stride_n]
//                 (c broadcast to [M, N] through zero strides).
//
// A and B are addressed through strides, so a transposed operand (`transpose_b`, gemm's
// transA / transB) is just swapped strides, and broadcast batch dimensions have batch stride
// 0. One pipeline per entry point serves every shape; no specialisation. The two tiled entry
// points share the register block (struct Acc, 16 named vec4 accumulators) and its FMA step
// and stores; only their tile loaders differ.
//
// Bindings (group 0):
//   0 uniform  MatMulParams | ConvParams | EpilogueParams (dynamic offset)
//   1 storage read_write  a    [..., M, K]          (conv: x [N, C, D, H, W])
//   2 storage read_write  b    [..., K, N] (or [..., N, K])   (conv: w [OC, C / g, kd, kh, kw])
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
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<storage, read_write> extra: array<f32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

// As[k * TM + m], Bs[k * TN + n]: both k-major so the inner loop reads 4 consecutive words.
var<workgroup> As: array<f32, 1024>;
var<workgroup> Bs: array<f32, 1024>;

// The 8x8 register block of one invocation: row r is (c{r}0, c{r}1), columns tx*8 .. tx*8+7.
// Named accumulators, not an array, so every backend keeps them in registers.
struct Acc {
    c00: vec4<f32>, c01: vec4<f32>, c10: vec4<f32>, c11: vec4<f32>,
    c20: vec4<f32>, c21: vec4<f32>, c30: vec4<f32>, c31: vec4<f32>,
    c40: vec4<f32>, c41: vec4<f32>, c50: vec4<f32>, c51: vec4<f32>,
    c60: vec4<f32>, c61: vec4<f32>, c70: vec4<f32>, c71: vec4<f32>,
}

// One staged K tile into the register block: 16 x (8 + 8 shared loads, 64 FMAs).
fn mma_tile(acc: ptr<function, Acc>, tx: u32, ty: u32) {
    for (var kk = 0u; kk < TK; kk++) {
        let ai = kk * TM + ty * 8u;
        let bj = kk * TN + tx * 8u;
        let a0 = vec4<f32>(As[ai], As[ai + 1u], As[ai + 2u], As[ai + 3u]);
        let a1 = vec4<f32>(As[ai + 4u], As[ai + 5u], As[ai + 6u], As[ai + 7u]);
        let b0 = vec4<f32>(Bs[bj], Bs[bj + 1u], Bs[bj + 2u], Bs[bj + 3u]);
        let b1 = vec4<f32>(Bs[bj + 4u], Bs[bj + 5u], Bs[bj + 6u], Bs[bj + 7u]);
        (*acc).c00 += a0[0] * b0;
        (*acc).c01 += a0[0] * b1;
        (*acc).c10 += a0[1] * b0;
        (*acc).c11 += a0[1] * b1;
        (*acc).c20 += a0[2] * b0;
        (*acc).c21 += a0[2] * b1;
        (*acc).c30 += a0[3] * b0;
        (*acc).c31 += a0[3] * b1;
        (*acc).c40 += a1[0] * b0;
        (*acc).c41 += a1[0] * b1;
        (*acc).c50 += a1[1] * b0;
        (*acc).c51 += a1[1] * b1;
        (*acc).c60 += a1[2] * b0;
        (*acc).c61 += a1[2] * b1;
        (*acc).c70 += a1[3] * b0;
        (*acc).c71 += a1[3] * b1;
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
    store_row(out_base, m, n, gm0 + 0u, gn0, (*acc).c00 + bias_lo[0], (*acc).c01 + bias_lo[0]);
    store_row(out_base, m, n, gm0 + 1u, gn0, (*acc).c10 + bias_lo[1], (*acc).c11 + bias_lo[1]);
    store_row(out_base, m, n, gm0 + 2u, gn0, (*acc).c20 + bias_lo[2], (*acc).c21 + bias_lo[2]);
    store_row(out_base, m, n, gm0 + 3u, gn0, (*acc).c30 + bias_lo[3], (*acc).c31 + bias_lo[3]);
    store_row(out_base, m, n, gm0 + 4u, gn0, (*acc).c40 + bias_hi[0], (*acc).c41 + bias_hi[0]);
    store_row(out_base, m, n, gm0 + 5u, gn0, (*acc).c50 + bias_hi[1], (*acc).c51 + bias_hi[1]);
    store_row(out_base, m, n, gm0 + 6u, gn0, (*acc).c60 + bias_hi[2], (*acc).c61 + bias_hi[2]);
    store_row(out_base, m, n, gm0 + 7u, gn0, (*acc).c70 + bias_hi[3], (*acc).c71 + bias_hi[3]);
}

@compute @workgroup_size(8, 8, 1)
fn matmul_tiled(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // Everything up to the barriers depends only on uniforms and workgroup ids, so control
    // flow stays uniform as WGSL requires around workgroupBarrier.
    let g = wid.x + wid.y * nwg.x;
    let tiles = p.tiles_m * p.tiles_n;
    let bi = g / tiles;
    if bi >= p.batch {
        return;
    }
    let t = g % tiles;
    let row0 = (t / p.tiles_n) * TM;
    let col0 = (t % p.tiles_n) * TN;

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

    var acc: Acc;
    let ktiles = (p.k + TK - 1u) / TK;
    for (var kt = 0u; kt < ktiles; kt++) {
        let k0 = kt * TK;
        for (var r = 0u; r < 16u; r++) {
            let idx = lidx + 64u * r;
            // A: consecutive invocations walk k (contiguous in row-major A).
            let am = idx / TK;
            let ak = idx % TK;
            let gm = row0 + am;
            let gk = k0 + ak;
            var av = 0.0;
            if gm < p.m && gk < p.k {
                av = a[a_base + gm * p.a_stride_m + gk * p.a_stride_k];
            }
            As[ak * TM + am] = av;
            // B: consecutive invocations walk n (contiguous in row-major B).
            let bk = idx / TN;
            let bn = idx % TN;
            let gk2 = k0 + bk;
            let gn = col0 + bn;
            var bv = 0.0;
            if gk2 < p.k && gn < p.n {
                bv = b[b_base + gk2 * p.b_stride_k + gn * p.b_stride_n];
            }
            Bs[bk * TN + bn] = bv;
        }
        workgroupBarrier();
        mma_tile(&acc, lid.x, lid.y);
        workgroupBarrier();
    }
    let zero = vec4<f32>(0.0);
    store_acc(&acc, p.out_offset + bi * p.m * p.n, p.m, p.n, row0 + lid.y * 8u, col0 + lid.x * 8u, zero, zero);
}

// The input element under kernel position k at output pixel q of image n, channel group g
// (0 in the padding).
fn conv_input(n: u32, g: u32, k: u32, q: u32) -> f32 {
    let ksz = cv.kernel.x * cv.kernel.y * cv.kernel.z;
    let c = k / ksz;
    let r = k % ksz;
    let kd = r / (cv.kernel.y * cv.kernel.z);
    let kh = (r / cv.kernel.z) % cv.kernel.y;
    let kw = r % cv.kernel.z;
    let od = q / (cv.out_dims.y * cv.out_dims.z);
    let oh = (q / cv.out_dims.z) % cv.out_dims.y;
    let ow = q % cv.out_dims.z;
    let pos = vec3<i32>(vec3<u32>(od, oh, ow) * cv.strides.xyz + vec3<u32>(kd, kh, kw) * cv.dilations.xyz)
        - vec3<i32>(cv.pads.xyz);
    if any(pos < vec3<i32>(0)) || any(pos >= vec3<i32>(cv.in_dims.xyz)) {
        return 0.0;
    }
    let p3 = vec3<u32>(pos);
    let plane = ((n * cv.group + g) * cv.cg + c) * cv.in_dims.x;
    return a[cv.x_offset + ((plane + p3.x) * cv.in_dims.y + p3.y) * cv.in_dims.z + p3.z];
}

@compute @workgroup_size(8, 8, 1)
fn matmul_conv(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t_all = wid.x + wid.y * nwg.x;
    let tiles = cv.tiles_m * cv.tiles_n;
    let bi = t_all / tiles;
    if bi >= cv.batch {
        return;
    }
    let n_img = bi / cv.group;
    let g = bi % cv.group;
    let t = t_all % tiles;
    let row0 = (t / cv.tiles_n) * TM;
    let col0 = (t % cv.tiles_n) * TN;
    // The group's weights: rows g * m .. (g + 1) * m of [OC, k].
    let w_base = cv.w_offset + g * cv.m * cv.k;

    var acc: Acc;
    let ktiles = (cv.k + TK - 1u) / TK;
    for (var kt = 0u; kt < ktiles; kt++) {
        let k0 = kt * TK;
        for (var r = 0u; r < 16u; r++) {
            let idx = lidx + 64u * r;
            let am = idx / TK;
            let ak = idx % TK;
            let gm = row0 + am;
            let gk = k0 + ak;
            var av = 0.0;
            if gm < cv.m && gk < cv.k {
                av = b[w_base + gm * cv.k + gk];
            }
            As[ak * TM + am] = av;
            let bk = idx / TN;
            let bn = idx % TN;
            let gk2 = k0 + bk;
            let gn = col0 + bn;
            var bv = 0.0;
            if gk2 < cv.k && gn < cv.n {
                bv = conv_input(n_img, g, gk2, gn);
            }
            Bs[bk * TN + bn] = bv;
        }
        workgroupBarrier();
        mma_tile(&acc, lid.x, lid.y);
        workgroupBarrier();
    }
    let gm0 = row0 + lid.y * 8u;
    var bias = array<f32, 8>();
    for (var r = 0u; r < 8u; r++) {
        if gm0 + r < cv.m {
            bias[r] = extra[cv.bias_offset + g * cv.m + gm0 + r];
        }
    }
    let out_base = cv.out_offset + bi * cv.m * cv.n;
    store_acc(&acc, out_base, cv.m, cv.n, gm0, col0 + lid.x * 8u,
        vec4<f32>(bias[0], bias[1], bias[2], bias[3]), vec4<f32>(bias[4], bias[5], bias[6], bias[7]));
}

@compute @workgroup_size(256)
fn matmul_scale(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lidx;
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
    let i = (wid.x + wid.y * nwg.x) * 256u + lidx;
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
    let g = wid.x + wid.y * nwg.x;
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
