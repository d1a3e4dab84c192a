// The prelude: what the kernel families share. Every shader file (shaders/<family>.wgsl and
// shaders/fill.wgsl) is compiled with this text in front of it (with_prelude! in
// src/gpu/pipeline.rs), on every backend and in the browser alike; the tests validate that
// concatenation, not the files alone. Names defined here are taken in every shader.
//
// Rust mirror (src/gpu/kernels/elementwise.rs, #[repr(C)], bytemuck::Pod):
//   struct BroadcastParams { numel: u32, rank: u32, out_offset: u32, flags: u32,
//                            offsets: [u32; 4], shape: [[u32; 4]; 2],
//                            strides0: [[u32; 4]; 2], strides1: [[u32; 4]; 2],
//                            strides2: [[u32; 4]; 2] }            // 160 bytes

// The uniform of the broadcasting entry points (elementwise_binary, mask_where, logic_main):
// up to three inputs read through per-input strides over the output shape (0 on broadcast
// dimensions). numel counts output elements, rank <= 8; offsets (inputs) and out_offset are
// in elements of each binding's array type; flags are the entry point's own.
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

// The index of a workgroup in its dispatch. More workgroups than
// max_compute_workgroups_per_dimension are spread over a 2-D grid (Encoder::dispatch in
// src/gpu/kernels/encoder.rs), so the index is wid.x + wid.y * num_workgroups.x.
fn workgroup_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// The index of an invocation of a 256-invocation workgroup in its dispatch.
fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return workgroup_index(wid, nwg) * 256u + lid;
}

// NaN and infinity as runtime values: Tint (Chromium, Dawn) refuses a constant expression
// that evaluates to either ("value nan cannot be represented as 'f32'"), so their bits are
// loaded from private variables. tests/host/wgsl_portable.rs keeps such literals out of every
// shader.
var<private> NAN_BITS: u32 = 0x7fc00000u;
var<private> INF_BITS: u32 = 0x7f800000u;

fn nan_f32() -> f32 {
    return bitcast<f32>(NAN_BITS);
}

// +infinity; negate it for -infinity.
fn inf_f32() -> f32 {
    return bitcast<f32>(INF_BITS);
}

// The lowest finite f32: a masked score, and the start of a running maximum that must stay
// finite (exp of it minus any finite maximum is exactly 0, never NaN).
const F32_LOWEST: f32 = -3.4028234663852886e38;

// An integer of `words` 32-bit words as i32: 1, the i32 `lo`; 2, the i64 (lo, hi) saturated
// to the i32 range.
fn i32_saturated(lo: u32, hi: u32, words: u32) -> i32 {
    if words == 2u {
        let neg = (hi & 0x80000000u) != 0u;
        let fits = (!neg && hi == 0u && lo <= 0x7fffffffu) || (neg && hi == 0xffffffffu && lo >= 0x80000000u);
        if !fits {
            return select(2147483647i, -2147483647i - 1i, neg);
        }
    }
    return bitcast<i32>(lo);
}

// ---- the shader file follows
