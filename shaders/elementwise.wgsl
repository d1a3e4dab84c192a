// Elementwise kernels: binary ops with NumPy broadcasting, unary activations.
//
// Entry points (workgroup size 256; the dispatch grid is 2-D when the workgroup count exceeds
// max_compute_workgroups_per_dimension, and the linear workgroup index is
// wid.x + wid.y * num_workgroups.x):
//   elementwise_binary        broadcast through per-input strides (0 on broadcast dimensions)
//   elementwise_binary_flat   same-shape contiguous operands, one f32 per invocation
//   elementwise_binary_flat4  same as flat, one vec4<f32> per invocation (numel % 4 == 0 and
//                             element offsets % 4 == 0)
//   elementwise_unary         one f32 per invocation
//   elementwise_unary4        one vec4<f32> per invocation (same conditions as flat4)
//   *_aligned                 each flat / unary entry point again for operands that all start
//                             at their binding (element offsets 0): no offsets read
//
// The flat and unary entry points (not elementwise_binary) are compiled without wgpu's bounds
// checks: every index they form is in bounds by construction (src/gpu/kernels/elementwise.rs
// says why). Keep it so: an index that is not `offset + i` with `i < numel` needs the checks.
//
// Specialisation: the operator is a pipeline-overridable constant (BINARY_OP: 0 add, 1 sub,
// 2 mul, 3 div; UNARY_OP: 0 relu, 1 gelu-tanh, 2 silu, 3 exp), so each op gets its own
// pipeline with the switch folded away; every shape-dependent value is in the uniform, so one
// pipeline serves all shapes.
//
// Bindings (group 0):
//   0 uniform  BroadcastParams (elementwise_binary) or FlatParams (the others), dynamic offset
//   1 storage read_write  input a / x   (tensors are sub-ranges of arena buffers, all bound
//   2 storage read_write  input b        read_write: DESIGN.md §6)
//   3 storage read_write  output         (unary: binding 2 is the output, binding 3 unused)
//
// Rust mirrors (src/gpu/kernels/elementwise.rs, #[repr(C)], bytemuck::Pod):
//   struct BroadcastParams { numel: u32, rank: u32, out_offset: u32, flags: u32,
//                            offsets: [u32; 4], shape: [[u32; 4]; 2],
//                            strides0: [[u32; 4]; 2], strides1: [[u32; 4]; 2],
//                            strides2: [[u32; 4]; 2] }            // 160 bytes
//   struct FlatParams { numel: u32, in0_offset: u32, in1_offset: u32, out_offset: u32 }
// Offsets are in elements (vec4 elements for the *4 variants) from the start of the binding.

struct BroadcastParams {
    numel: u32,
    rank: u32,
    out_offset: u32,
    flags: u32,
    offsets: vec4<u32>,
    shape: array<vec4<u32>, 2>,
    strides0: array<vec4<u32>, 2>,
    strides1: array<vec4<u32>, 2>,
    strides2: array<vec4<u32>, 2>,
}

struct FlatParams {
    numel: u32,
    in0_offset: u32,
    in1_offset: u32,
    out_offset: u32,
}

override BINARY_OP: u32 = 0u;
override UNARY_OP: u32 = 0u;

@group(0) @binding(0) var<uniform> bp: BroadcastParams;
@group(0) @binding(0) var<uniform> fp: FlatParams;

@group(0) @binding(1) var<storage, read_write> in0: array<f32>;
@group(0) @binding(2) var<storage, read_write> in1: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

@group(0) @binding(1) var<storage, read_write> in0_4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> in1_4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dst4: array<vec4<f32>>;

// Unary: x at binding 1, output at binding 2.
@group(0) @binding(2) var<storage, read_write> udst: array<f32>;
@group(0) @binding(2) var<storage, read_write> udst4: array<vec4<f32>>;

fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * 256u + lid;
}

fn binary_op(a: f32, b: f32) -> f32 {
    switch BINARY_OP {
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 3u: { return a / b; }
        default: { return a + b; }
    }
}

fn binary_op4(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    switch BINARY_OP {
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 3u: { return a / b; }
        default: { return a + b; }
    }
}

// tanh through exp with the argument clamped: tanh(±15) is ±1 in f32, and the clamp keeps
// exp finite on every backend (some evaluate tanh as a ratio of exps that overflows to NaN).
fn tanh_clamped(x: f32) -> f32 {
    let c = clamp(x, -15.0, 15.0);
    let e = exp(2.0 * c);
    return (e - 1.0) / (e + 1.0);
}

fn unary_op(x: f32) -> f32 {
    switch UNARY_OP {
        case 1u: {
            // GELU, tanh form (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            return 0.5 * x * (1.0 + tanh_clamped(0.7978845608028654 * (x + 0.044715 * x * x * x)));
        }
        case 2u: { return x / (1.0 + exp(-x)); }
        case 3u: { return exp(x); }
        default: { return max(x, 0.0); }
    }
}

@compute @workgroup_size(256)
fn elementwise_binary(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= bp.numel {
        return;
    }
    var rem = i;
    var ia = bp.offsets.x;
    var ib = bp.offsets.y;
    for (var k = 0u; k < bp.rank; k++) {
        let d = bp.rank - 1u - k;
        let ext = bp.shape[d / 4u][d % 4u];
        let idx = rem % ext;
        rem = rem / ext;
        ia += idx * bp.strides0[d / 4u][d % 4u];
        ib += idx * bp.strides1[d / 4u][d % 4u];
    }
    dst[bp.out_offset + i] = binary_op(in0[ia], in1[ib]);
}

// The flat bodies, shared by the entry points with element offsets from the uniform and the
// `_aligned` ones that pass 0 (every operand starts at its binding): on SwiftShader the three
// uniform offsets cost about a fifth of a streaming add's time (README, "Side by side with
// ONNX Runtime").
fn binary_flat(i: u32, o0: u32, o1: u32, oo: u32) {
    if i >= fp.numel {
        return;
    }
    dst[oo + i] = binary_op(in0[o0 + i], in1[o1 + i]);
}

fn binary_flat4(i: u32, o0: u32, o1: u32, oo: u32) {
    if i >= fp.numel {
        return;
    }
    dst4[oo + i] = binary_op4(in0_4[o0 + i], in1_4[o1 + i]);
}

fn unary_flat(i: u32, o0: u32, oo: u32) {
    if i >= fp.numel {
        return;
    }
    udst[oo + i] = unary_op(in0[o0 + i]);
}

fn unary_flat4(i: u32, o0: u32, oo: u32) {
    if i >= fp.numel {
        return;
    }
    let x = in0_4[o0 + i];
    udst4[oo + i] = vec4<f32>(unary_op(x.x), unary_op(x.y), unary_op(x.z), unary_op(x.w));
}

@compute @workgroup_size(256)
fn elementwise_binary_flat(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    binary_flat(linear_index(wid, nwg, lid), fp.in0_offset, fp.in1_offset, fp.out_offset);
}

@compute @workgroup_size(256)
fn elementwise_binary_flat_aligned(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    binary_flat(linear_index(wid, nwg, lid), 0u, 0u, 0u);
}

@compute @workgroup_size(256)
fn elementwise_binary_flat4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    binary_flat4(linear_index(wid, nwg, lid), fp.in0_offset, fp.in1_offset, fp.out_offset);
}

@compute @workgroup_size(256)
fn elementwise_binary_flat4_aligned(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    binary_flat4(linear_index(wid, nwg, lid), 0u, 0u, 0u);
}

@compute @workgroup_size(256)
fn elementwise_unary(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    unary_flat(linear_index(wid, nwg, lid), fp.in0_offset, fp.out_offset);
}

@compute @workgroup_size(256)
fn elementwise_unary_aligned(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    unary_flat(linear_index(wid, nwg, lid), 0u, 0u);
}

@compute @workgroup_size(256)
fn elementwise_unary4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    unary_flat4(linear_index(wid, nwg, lid), fp.in0_offset, fp.out_offset);
}

@compute @workgroup_size(256)
fn elementwise_unary4_aligned(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    unary_flat4(linear_index(wid, nwg, lid), 0u, 0u);
}
