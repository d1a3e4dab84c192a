// Values made from element indices: ranges and triangle masks. Integer values are handled as
// integers throughout (u32 / i32 views of the words), never as float bits.
//
// Entry points (workgroup size 256, linear_index of the prelude):
//   generate_range    out[i] = start + i * delta, start and delta read from their buffers (so a
//                     recorded dispatch stays right when their values change). kind 0: f32
//                     (f32 maths); 1: i32; 2: i64 as (low, high) word pairs, computed on the
//                     low words in i32 (the values must fit i32) with the high word the sign.
//   generate_trilu    keep element (.., i, j) when j - i >= k (upper) or j - i <= k (lower),
//                     else 0; words per element 1 or 2 (64-bit types); k from the uniform.
//   generate_trilu_k  the same with k read from its buffer (i32, or the low word of an i64
//                     clamped by its high word).
//
// Bindings (group 0):
//   0 uniform  RangeParams | TriluParams (dynamic offset)
//   1 storage read_write  start (range) / x (trilu)
//   2 storage read_write  delta (range) / k (trilu_k)
//   3 storage read_write  dst
//
// Rust mirrors (src/gpu/kernels/generate.rs, #[repr(C)], bytemuck::Pod):
//   struct RangeParams { n: u32, kind: u32, start_offset: u32, delta_offset: u32,
//                        out_offset: u32, _pad: [u32; 3] }                     // 32 bytes
//   struct TriluParams { numel: u32, rows: u32, cols: u32, words: u32, x_offset: u32,
//                        out_offset: u32, k_offset: u32, k: i32, upper: u32, k_words: u32,
//                        _pad: [u32; 2] }                                      // 48 bytes
// Offsets are in 32-bit words from the start of each binding; numel counts elements.

struct RangeParams {
    n: u32,
    kind: u32,
    start_offset: u32,
    delta_offset: u32,
    out_offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct TriluParams {
    numel: u32,
    rows: u32,
    cols: u32,
    words: u32,
    x_offset: u32,
    out_offset: u32,
    k_offset: u32,
    k: i32,
    upper: u32,
    k_words: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> rp: RangeParams;
@group(0) @binding(0) var<uniform> tp: TriluParams;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> aux: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

// An integer index value at word `at` (i64: low word, saturated by the high word).
fn index_at(buf_is_aux: bool, at: u32, words: u32) -> i32 {
    var lo = 0u;
    var hi = 0u;
    if buf_is_aux {
        lo = aux[at];
        if words == 2u {
            hi = aux[at + 1u];
        }
    } else {
        lo = src[at];
        if words == 2u {
            hi = src[at + 1u];
        }
    }
    return i32_saturated(lo, hi, words);
}

@compute @workgroup_size(256)
fn generate_range(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = linear_index(wid, nwg, lid);
    if i >= rp.n {
        return;
    }
    if rp.kind == 0u {
        let v = bitcast<f32>(src[rp.start_offset]) + f32(i) * bitcast<f32>(aux[rp.delta_offset]);
        dst[rp.out_offset + i] = bitcast<u32>(v);
        return;
    }
    let words = select(1u, 2u, rp.kind == 2u);
    let v = index_at(false, rp.start_offset, words) + i32(i) * index_at(true, rp.delta_offset, words);
    if words == 1u {
        dst[rp.out_offset + i] = bitcast<u32>(v);
    } else {
        dst[rp.out_offset + 2u * i] = bitcast<u32>(v);
        dst[rp.out_offset + 2u * i + 1u] = select(0u, 0xffffffffu, v < 0i);
    }
}

// Element e of a trilu with diagonal offset k.
fn trilu_at(e: u32, k: i32) {
    let j = i32(e % tp.cols);
    let i = i32((e / tp.cols) % tp.rows);
    let keep = select(j - i <= k, j - i >= k, tp.upper != 0u);
    for (var w = 0u; w < tp.words; w++) {
        let at = e * tp.words + w;
        dst[tp.out_offset + at] = select(0u, src[tp.x_offset + at], keep);
    }
}

@compute @workgroup_size(256)
fn generate_trilu(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let e = linear_index(wid, nwg, lid);
    if e >= tp.numel {
        return;
    }
    trilu_at(e, tp.k);
}

@compute @workgroup_size(256)
fn generate_trilu_k(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let e = linear_index(wid, nwg, lid);
    if e >= tp.numel {
        return;
    }
    trilu_at(e, index_at(true, tp.k_offset, tp.k_words));
}
