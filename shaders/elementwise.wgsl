// Elementwise kernels: binary ops with NumPy broadcasting, unary activations.
//
// Entry points (workgroup size 256; linear_index and the 2-D grid of the prelude):
//   elementwise_binary        broadcast through per-input strides (0 on broadcast dimensions)
//   elementwise_binary_flat   same-shape contiguous operands, one f32 per invocation
//   elementwise_binary_flat4  same as flat, one vec4<f32> per invocation (numel % 4 == 0 and
//                             element offsets % 4 == 0)
//   elementwise_unary         one f32 per invocation
//   elementwise_unary4        one vec4<f32> per invocation (same conditions as flat4)
//
// The flat and unary entry points (not elementwise_binary) are compiled without wgpu's bounds
// checks: every index they form is in bounds by construction (src/gpu/kernels/elementwise.rs
// says why). Keep it so: an index that is not `offset + i` with `i < numel` needs the checks.
//
// Specialisation: the operator is a pipeline-overridable constant (BINARY_OP: 0 add, 1 sub,
// 2 mul, 3 div, 4 pow, 5 min, 6 max, 7 silu_mul = a / (1 + exp(-a)) * b, the SwiGLU gate;
// UNARY_OP: 0 relu, 1 gelu-tanh, 2 silu, 3 exp, 4 sqrt,
// 5 reciprocal, 6 neg, 7 log, 8 tanh, 9 erf, 10 sigmoid, 11 gelu-erf, 12 abs, 13 floor,
// 14 ceil, 15 round, 16 sin, 17 cos, 18 sign), so each op gets its own
// pipeline with the switch folded away; every shape-dependent value is in the uniform, so one
// pipeline serves all shapes. The flat and unary entry points are specialised by ALIGNED too:
// true when every operand starts at its binding, so the element offsets are 0 and the
// uniform's are not read. f32 only: integer and bool elementwise ops are logic.wgsl's.
//
// Bindings (group 0):
//   0 uniform  BroadcastParams (elementwise_binary; the prelude's) or FlatParams (the
//              others), dynamic offset
//   1 storage read_write  input a / x   (tensors are sub-ranges of arena buffers, all bound
//   2 storage read_write  input b        read_write: docs/design.md)
//   3 storage read_write  output         (unary: binding 2 is the output, binding 3 unused)
//
// Rust mirror (src/gpu/kernels/elementwise.rs, #[repr(C)], bytemuck::Pod):
//   struct FlatParams { numel: u32, in0_offset: u32, in1_offset: u32, out_offset: u32 }
// Offsets are in elements (vec4 elements for the *4 variants) from the start of the binding.

struct FlatParams {
    numel: u32,
    in0_offset: u32,
    in1_offset: u32,
    out_offset: u32,
}

override BINARY_OP: u32 = 0u;
override UNARY_OP: u32 = 0u;
override ALIGNED: bool = false;

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

// x^y as NumPy computes it: an integral exponent of at most 64 in magnitude by repeated
// squaring (exact where the result is, and defined for a negative base, where WGSL's pow is
// not); otherwise pow(|x|, y), NaN for a negative base, and 1 for y = 0 (WGSL's pow(0, 0) is
// exp2(0 * -inf) = NaN).
fn pow_f32(x: f32, y: f32) -> f32 {
    if y == 0.0 {
        return 1.0;
    }
    if y == round(y) && abs(y) <= 64.0 {
        var e = u32(abs(y));
        var base = x;
        var acc = 1.0;
        loop {
            if (e & 1u) != 0u {
                acc = acc * base;
            }
            e = e >> 1u;
            if e == 0u {
                break;
            }
            base = base * base;
        }
        return select(acc, 1.0 / acc, y < 0.0);
    }
    if x < 0.0 {
        return nan_f32();
    }
    if x == 0.0 {
        return select(0.0, inf_f32(), y < 0.0);
    }
    return pow(x, y);
}

fn binary_op(a: f32, b: f32) -> f32 {
    switch BINARY_OP {
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 3u: { return a / b; }
        case 4u: { return pow_f32(a, b); }
        case 5u: { return min(a, b); }
        case 6u: { return max(a, b); }
        case 7u: { return a / (1.0 + exp(-a)) * b; }
        default: { return a + b; }
    }
}

fn binary_op4(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    switch BINARY_OP {
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 3u: { return a / b; }
        case 4u: { return vec4<f32>(pow_f32(a.x, b.x), pow_f32(a.y, b.y), pow_f32(a.z, b.z), pow_f32(a.w, b.w)); }
        case 5u: { return min(a, b); }
        case 6u: { return max(a, b); }
        case 7u: { return a / (1.0 + exp(-a)) * b; }
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

// erf(x): the Maclaurin series below |x| = 0.5 (relative error under 1e-8 there, where an
// absolute bound would not do), Abramowitz & Stegun 7.1.26 above (absolute error 1.5e-7),
// exactly +-1 beyond |x| = 4 (erfc(4) = 1.5e-8 is below half an f32 ulp of 1).
fn erf_f32(x: f32) -> f32 {
    let a = abs(x);
    if a < 0.5 {
        let x2 = x * x;
        return x * 1.1283791670955126 * (1.0 + x2 * (-1.0 / 3.0 + x2 * (0.1 + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0 + x2 * (-1.0 / 1320.0))))));
    }
    if a > 4.0 {
        return sign(x);
    }
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - poly * exp(-a * a));
}

fn unary_op(x: f32) -> f32 {
    switch UNARY_OP {
        case 1u: {
            // GELU, tanh form (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            return 0.5 * x * (1.0 + tanh_clamped(0.7978845608028654 * (x + 0.044715 * x * x * x)));
        }
        case 2u: { return x / (1.0 + exp(-x)); }
        case 3u: { return exp(x); }
        case 4u: { return sqrt(x); }
        case 5u: { return 1.0 / x; }
        case 6u: { return -x; }
        case 7u: { return log(x); }
        // tanh(x) ~ x (1 - x^2 / 3) below 1e-3 (error under 1e-13 there), where the ratio of
        // exps loses relative precision.
        case 8u: { return select(tanh_clamped(x), x * (1.0 - x * x / 3.0), abs(x) < 1e-3); }
        case 9u: { return erf_f32(x); }
        case 10u: { return 1.0 / (1.0 + exp(-x)); }
        case 11u: { return 0.5 * x * (1.0 + erf_f32(x * 0.7071067811865476)); }
        case 12u: { return abs(x); }
        case 13u: { return floor(x); }
        case 14u: { return ceil(x); }
        // WGSL's round breaks ties to even, as ONNX's Round does.
        case 15u: { return round(x); }
        case 16u: { return sin(x); }
        case 17u: { return cos(x); }
        case 18u: { return sign(x); }
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

// Element offsets of inputs 0 and 1 and of the output: 0 when ALIGNED, so those pipelines
// read no offsets from the uniform (on SwiftShader the three offsets cost about a fifth of a
// streaming add's time, docs/benchmarks/2026-11-22-elementwise-swiftshader.md).
fn flat_offsets() -> vec3<u32> {
    if ALIGNED {
        return vec3<u32>(0u);
    }
    return vec3<u32>(fp.in0_offset, fp.in1_offset, fp.out_offset);
}

@compute @workgroup_size(256)
fn elementwise_binary_flat(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= fp.numel {
        return;
    }
    let o = flat_offsets();
    dst[o.z + i] = binary_op(in0[o.x + i], in1[o.y + i]);
}

@compute @workgroup_size(256)
fn elementwise_binary_flat4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= fp.numel {
        return;
    }
    let o = flat_offsets();
    dst4[o.z + i] = binary_op4(in0_4[o.x + i], in1_4[o.y + i]);
}

@compute @workgroup_size(256)
fn elementwise_unary(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= fp.numel {
        return;
    }
    let o = flat_offsets();
    udst[o.z + i] = unary_op(in0[o.x + i]);
}

@compute @workgroup_size(256)
fn elementwise_unary4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= fp.numel {
        return;
    }
    let o = flat_offsets();
    let x = in0_4[o.x + i];
    udst4[o.z + i] = vec4<f32>(unary_op(x.x), unary_op(x.y), unary_op(x.z), unary_op(x.w));
}
