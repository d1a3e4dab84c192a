// Masks: the causal attention mask over a growing past, and `where`.
//
// Entry points (workgroup size 256, linear_index of the prelude):
//   mask_causal  scores [..., S, T] with T = P + S (P = past length, taken from the shape):
//                query i sees key j iff j <= P + i; hidden entries become the lowest finite
//                f32 (F32_LOWEST), so softmax gives them exp(-huge) = 0 without NaN.
//   mask_where   dst = cond != 0 ? a : b with three-way NumPy broadcasting through strides.
//                cond is read as 32-bit words: nonzero integer, or for an f32 condition
//                (flags bit 0) any value other than +-0.0.
//
// Bindings (group 0):
//   0 uniform  CausalParams | BroadcastParams (the prelude's; dynamic offset)
//   1 storage read_write  x (causal) / cond (where)
//   2 storage read_write  a (where)
//   3 storage read_write  b (where)
//   4 storage read_write  dst
//
// Rust mirror (src/gpu/kernels/mask.rs, #[repr(C)], bytemuck::Pod):
//   struct CausalParams { numel: u32, s: u32, t: u32, past: u32,
//                         x_offset: u32, out_offset: u32, _pad: [u32; 2] }    // 32 bytes
// Offsets are in 32-bit words from the start of each binding; BroadcastParams' offsets.x/y/z
// are cond's, a's and b's.

struct CausalParams {
    numel: u32,
    s: u32,
    t: u32,
    past: u32,
    x_offset: u32,
    out_offset: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> cm: CausalParams;
@group(0) @binding(0) var<uniform> bp: BroadcastParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> cond: array<u32>;
@group(0) @binding(2) var<storage, read_write> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn mask_causal(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= cm.numel {
        return;
    }
    let j = i % cm.t;
    let q = (i / cm.t) % cm.s;
    var v = x[cm.x_offset + i];
    if j > cm.past + q {
        v = F32_LOWEST;
    }
    dst[cm.out_offset + i] = v;
}

@compute @workgroup_size(256)
fn mask_where(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= bp.numel {
        return;
    }
    var rem = i;
    var ic = bp.offsets.x;
    var ia = bp.offsets.y;
    var ib = bp.offsets.z;
    for (var k = 0u; k < bp.rank; k++) {
        let d = bp.rank - 1u - k;
        let ext = bp.shape[d / 4u][d % 4u];
        let idx = rem % ext;
        rem = rem / ext;
        ic += idx * bp.strides0[d / 4u][d % 4u];
        ia += idx * bp.strides1[d / 4u][d % 4u];
        ib += idx * bp.strides2[d / 4u][d % 4u];
    }
    var c = cond[ic];
    if (bp.flags & 1u) != 0u {
        c = c & 0x7fffffffu;
    }
    var v = b[ib];
    if c != 0u {
        v = a[ia];
    }
    dst[bp.out_offset + i] = v;
}
