// Batched matrix multiplication, tiled through workgroup shared memory.
//
// Entry point:
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
// A and B are addressed through strides, so a transposed right side (`transpose_b`) is just
// b_stride_k = 1, b_stride_n = K, and broadcast batch dimensions have batch stride 0. One
// pipeline serves every shape; no specialisation.
//
// Bindings (group 0):
//   0 uniform  MatMulParams (dynamic offset)
//   1 storage read_write  a    [..., M, K]
//   2 storage read_write  b    [..., K, N] (or [..., N, K])
//   3 storage read_write  out  [batch..., M, N], contiguous
//
// Rust mirror (src/gpu/kernels/matmul.rs, #[repr(C)], bytemuck::Pod), 112 bytes:
//   struct MatMulParams { m: u32, k: u32, n: u32, batch: u32,
//                         tiles_m: u32, tiles_n: u32, batch_rank: u32, _pad0: u32,
//                         a_offset: u32, b_offset: u32, out_offset: u32, _pad1: u32,
//                         a_stride_m: u32, a_stride_k: u32, b_stride_k: u32, b_stride_n: u32,
//                         batch_shape: [u32; 4], a_batch_strides: [u32; 4],
//                         b_batch_strides: [u32; 4] }
// Offsets and strides are in f32 elements from the start of each binding.

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

@group(0) @binding(0) var<uniform> p: MatMulParams;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

// As[k * TM + m], Bs[k * TN + n]: both k-major so the inner loop reads 4 consecutive words.
var<workgroup> As: array<f32, 1024>;
var<workgroup> Bs: array<f32, 1024>;

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

    let tx = lid.x;
    let ty = lid.y;
    // 8x8 register block: row r of the block is (c{r}0, c{r}1), columns tx*8 .. tx*8+7.
    // Named accumulators, not an array, so every backend keeps them in registers.
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
        for (var kk = 0u; kk < TK; kk++) {
            let ai = kk * TM + ty * 8u;
            let bj = kk * TN + tx * 8u;
            let a0 = vec4<f32>(As[ai], As[ai + 1u], As[ai + 2u], As[ai + 3u]);
            let a1 = vec4<f32>(As[ai + 4u], As[ai + 5u], As[ai + 6u], As[ai + 7u]);
            let b0 = vec4<f32>(Bs[bj], Bs[bj + 1u], Bs[bj + 2u], Bs[bj + 3u]);
            let b1 = vec4<f32>(Bs[bj + 4u], Bs[bj + 5u], Bs[bj + 6u], Bs[bj + 7u]);
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

    let out_base = p.out_offset + bi * p.m * p.n;
    let gn0 = col0 + tx * 8u;
    store_row(out_base, row0 + ty * 8u + 0u, gn0, c00, c01);
    store_row(out_base, row0 + ty * 8u + 1u, gn0, c10, c11);
    store_row(out_base, row0 + ty * 8u + 2u, gn0, c20, c21);
    store_row(out_base, row0 + ty * 8u + 3u, gn0, c30, c31);
    store_row(out_base, row0 + ty * 8u + 4u, gn0, c40, c41);
    store_row(out_base, row0 + ty * 8u + 5u, gn0, c50, c51);
    store_row(out_base, row0 + ty * 8u + 6u, gn0, c60, c61);
    store_row(out_base, row0 + ty * 8u + 7u, gn0, c70, c71);
}

// Stores one row of an 8x8 register block, skipping what lies outside the output.
fn store_row(out_base: u32, gm: u32, gn0: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if gm >= p.m {
        return;
    }
    let base = out_base + gm * p.n;
    for (var j = 0u; j < 4u; j++) {
        if gn0 + j < p.n {
            dst[base + gn0 + j] = lo[j];
        }
        if gn0 + 4u + j < p.n {
            dst[base + gn0 + 4u + j] = hi[j];
        }
    }
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
