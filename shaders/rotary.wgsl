// Rotary position embedding (ONNX opset 23 RotaryEmbedding), one invocation per output
// element (workgroup size 256, linear_index of the prelude).
//
// Element (b, h, s, d) of x, laid out [B, H, S, D] or, packed, [B, S, H * D]: features
// d >= rotary_dim pass through; the others pair with a partner (d ^ 1 when interleaved, else
// d +- rotary_dim / 2) at pair index j (d / 2, or d mod rotary_dim / 2) and become
//   first of the pair:  x_d cos_j - x_partner sin_j
//   second of the pair: x_partner sin_j + x_d cos_j
// with cos_j, sin_j from row r of the caches [*, rotary_dim / 2]: r = position_ids[b, s]
// (rotary_pos; i32 or the low word of an i64) or r = b * S + s (rotary_seq).
//
// Entry points: rotary_seq (x, cos, sin, dst), rotary_pos (x, cos, sin, positions, dst).
//
// Bindings (group 0):
//   0 uniform  RotaryParams (dynamic offset)
//   1 storage read_write  x
//   2 storage read_write  cos
//   3 storage read_write  sin
//   4 storage read_write  positions (rotary_pos)
//   5 storage read_write  dst
//
// Rust mirror (src/gpu/kernels/rotary.rs, #[repr(C)], bytemuck::Pod), 64 bytes:
//   struct RotaryParams { numel: u32, heads: u32, seq: u32, head_dim: u32, rotary_dim: u32,
//                         interleaved: u32, packed: u32, pos_words: u32, x_offset: u32,
//                         cos_offset: u32, sin_offset: u32, pos_offset: u32,
//                         out_offset: u32, rows: u32, _pad: [u32; 2] }
// Offsets are in 32-bit words from the start of each binding.

struct RotaryParams {
    numel: u32,
    heads: u32,
    seq: u32,
    head_dim: u32,
    rotary_dim: u32,
    interleaved: u32,
    packed: u32,
    pos_words: u32,
    x_offset: u32,
    cos_offset: u32,
    sin_offset: u32,
    pos_offset: u32,
    out_offset: u32,
    rows: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> rp: RotaryParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> cos_cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> sin_cache: array<f32>;
@group(0) @binding(4) var<storage, read_write> positions: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<f32>;

// (b, s) of element e.
fn batch_seq(e: u32) -> vec2<u32> {
    let row = e / rp.head_dim;
    if rp.packed != 0u {
        let bs = row / rp.heads;
        return vec2<u32>(bs / rp.seq, bs % rp.seq);
    }
    return vec2<u32>(row / (rp.heads * rp.seq), row % rp.seq);
}

// Output element e with its cache row r (rows: the caches' row count; out of range reads 0).
fn rotate(e: u32, r: u32) {
    let d = e % rp.head_dim;
    let v = x[rp.x_offset + e];
    if d >= rp.rotary_dim {
        dst[rp.out_offset + e] = v;
        return;
    }
    let half = rp.rotary_dim / 2u;
    var j = 0u;
    var first = true;
    var partner = e;
    if rp.interleaved != 0u {
        j = d / 2u;
        first = (d & 1u) == 0u;
        partner = select(e - 1u, e + 1u, first);
    } else {
        j = d % half;
        first = d < half;
        partner = select(e - half, e + half, first);
    }
    var c = 0.0;
    var s = 0.0;
    if r < rp.rows {
        c = cos_cache[rp.cos_offset + r * half + j];
        s = sin_cache[rp.sin_offset + r * half + j];
    }
    let w = x[rp.x_offset + partner];
    dst[rp.out_offset + e] = select(w * s + v * c, v * c - w * s, first);
}

@compute @workgroup_size(256)
fn rotary_seq(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let e = linear_index(wid, nwg, lid);
    if e >= rp.numel {
        return;
    }
    let bs = batch_seq(e);
    rotate(e, bs.x * rp.seq + bs.y);
}

@compute @workgroup_size(256)
fn rotary_pos(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let e = linear_index(wid, nwg, lid);
    if e >= rp.numel {
        return;
    }
    let bs = batch_seq(e);
    let at = rp.pos_offset + (bs.x * rp.seq + bs.y) * rp.pos_words;
    var r = positions[at];
    // An i64 id outside u32 (negative, or a high word) is out of range.
    if rp.pos_words == 2u && positions[at + 1u] != 0u {
        r = rp.rows;
    }
    rotate(e, r);
}
