// Pooling and batch normalisation on [N, C, spatial...] tensors (up to 3 spatial dimensions;
// fewer are leading extents of 1). Convolution lives in matmul.wgsl (an implicit GEMM on the
// matmul tiles).
//
// Entry points (workgroup size 256, linear_index of the prelude; one invocation per output
// element):
//   cnn_pool        POOL_MAX (a pipeline-overridable constant) true: the maximum of the
//                   input elements under the window (padding skipped); false: their mean,
//                   with count_include_pad the divisor also counting window positions inside
//                   the explicit padding (not the ceil-mode overhang)
//   cnn_batch_norm  (x - mean[c]) * inverseSqrt(var[c] + eps) * scale[c] + bias[c]
//
// Bindings (group 0):
//   0 uniform  PoolParams | BnParams (dynamic offset)
//   1 storage read_write  x
//   2 storage read_write  scale (batch_norm)
//   3 storage read_write  bias (batch_norm)
//   4 storage read_write  mean (batch_norm)
//   5 storage read_write  var (batch_norm)
//   6 storage read_write  dst
//
// Rust mirrors (src/gpu/kernels/cnn.rs, #[repr(C)], bytemuck::Pod):
//   struct PoolParams { numel: u32, x_offset: u32, out_offset: u32, count_include_pad: u32,
//                       in_dims: [u32; 4], out_dims: [u32; 4], kernel: [u32; 4],
//                       strides: [u32; 4], dilations: [u32; 4], pads_begin: [u32; 4],
//                       pads_end: [u32; 4] }                                   // 128 bytes
//   struct BnParams { numel: u32, channels: u32, inner: u32, x_offset: u32,
//                     scale_offset: u32, bias_offset: u32, mean_offset: u32,
//                     var_offset: u32, out_offset: u32, eps: f32, _pad: [u32; 2] } // 48 bytes
// Offsets are in f32 elements from the start of each binding; vec4s hold (d, h, w, unused).

struct PoolParams {
    numel: u32,
    x_offset: u32,
    out_offset: u32,
    count_include_pad: u32,
    in_dims: vec4<u32>,
    out_dims: vec4<u32>,
    kernel: vec4<u32>,
    strides: vec4<u32>,
    dilations: vec4<u32>,
    pads_begin: vec4<u32>,
    pads_end: vec4<u32>,
}

struct BnParams {
    numel: u32,
    channels: u32,
    inner: u32,
    x_offset: u32,
    scale_offset: u32,
    bias_offset: u32,
    mean_offset: u32,
    var_offset: u32,
    out_offset: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
}

override POOL_MAX: bool = false;

@group(0) @binding(0) var<uniform> pp: PoolParams;
@group(0) @binding(0) var<uniform> bp: BnParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> scale: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> mean: array<f32>;
@group(0) @binding(5) var<storage, read_write> var_: array<f32>;
@group(0) @binding(6) var<storage, read_write> dst: array<f32>;

// Max (POOL_MAX) or sum and count of the window of output element e: vec2(value, count).
fn pool_window(e: u32) -> vec2<f32> {
    let outs = pp.out_dims.x * pp.out_dims.y * pp.out_dims.z;
    let plane = e / outs;
    let q = e % outs;
    let o = vec3<u32>(q / (pp.out_dims.y * pp.out_dims.z), (q / pp.out_dims.z) % pp.out_dims.y, q % pp.out_dims.z);
    let start = vec3<i32>(o * pp.strides.xyz) - vec3<i32>(pp.pads_begin.xyz);
    let limit = vec3<i32>(pp.in_dims.xyz + pp.pads_end.xyz);
    let base = pp.x_offset + plane * pp.in_dims.x * pp.in_dims.y * pp.in_dims.z;
    var acc = select(0.0, -inf_f32(), POOL_MAX);
    var count = 0.0;
    for (var kd = 0u; kd < pp.kernel.x; kd++) {
        for (var kh = 0u; kh < pp.kernel.y; kh++) {
            for (var kw = 0u; kw < pp.kernel.z; kw++) {
                let pos = start + vec3<i32>(vec3<u32>(kd, kh, kw) * pp.dilations.xyz);
                let inside = all(pos >= vec3<i32>(0)) && all(pos < vec3<i32>(pp.in_dims.xyz));
                if inside {
                    let p3 = vec3<u32>(pos);
                    let v = x[base + (p3.x * pp.in_dims.y + p3.y) * pp.in_dims.z + p3.z];
                    acc = select(acc + v, max(acc, v), POOL_MAX);
                    count += 1.0;
                } else if pp.count_include_pad != 0u && all(pos < limit) {
                    count += 1.0;
                }
            }
        }
    }
    return vec2<f32>(acc, count);
}

@compute @workgroup_size(256)
fn cnn_pool(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let e = linear_index(wid, nwg, lid);
    if e >= pp.numel {
        return;
    }
    let w = pool_window(e);
    dst[pp.out_offset + e] = select(w.x / w.y, w.x, POOL_MAX);
}

@compute @workgroup_size(256)
fn cnn_batch_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let e = linear_index(wid, nwg, lid);
    if e >= bp.numel {
        return;
    }
    let c = (e / bp.inner) % bp.channels;
    let inv = inverseSqrt(var_[bp.var_offset + c] + bp.eps);
    dst[bp.out_offset + e] = (x[bp.x_offset + e] - mean[bp.mean_offset + c]) * inv * scale[bp.scale_offset + c]
        + bias[bp.bias_offset + c];
}
