// Q4_K's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// (scale, minimum) of group j of the Q4_K/Q5_K super-block at byte b (scales at b + 4).
fn k_scale_min(wo: u32, b: u32, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(byte_at(wo, b + 4u + j) & 63u), f32(byte_at(wo, b + 8u + j) & 63u));
    }
    let md = byte_at(wo, b + 8u + j);
    let sc = (md & 15u) | ((byte_at(wo, b + j) >> 6u) << 4u);
    let m = (md >> 4u) | ((byte_at(wo, b + 4u + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

// One scale and minimum per 32-element group: raw nibbles, (d * sc, -dmin * m) in dm.
fn q4_k_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let j = blk % 8u;
    let b = (blk / 8u) * 144u;
    let dd = unpack2x16float(w[wo + b / 4u]);
    let sm = k_scale_min(wo, b, j);
    *dm = vec2<f32>(dd.x * sm.x, -(dd.y * sm.y));
    let qw = wo + (b + 16u + (j / 2u) * 32u) / 4u;
    let sh = (j % 2u) * 4u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = nibbles(w[qw + i], sh);
    }
    return v;
}
