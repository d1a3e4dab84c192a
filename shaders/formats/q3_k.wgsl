// Q3_K's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// Scale k of the Q3_K super-block at byte b, minus its offset of 32.
fn q3_k_scale(wo: u32, b: u32, k: u32) -> f32 {
    let lo = (byte_at(wo, b + 96u + k % 8u) >> (4u * (k / 8u))) & 15u;
    let hi = (byte_at(wo, b + 104u + k % 4u) >> (2u * (k / 4u))) & 3u;
    return f32(i32(lo | (hi << 4u)) - 32);
}

// Super-blocks start 2 bytes apart mod 4: reads go through word_at.
fn q3_k_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let j = blk % 8u;
    let b = (blk / 8u) * 110u;
    let d = f16_at(wo, b + 108u);
    *dm = vec2<f32>(1.0, 0.0);
    let d0 = d * q3_k_scale(wo, b, 2u * j);
    let d1 = d * q3_k_scale(wo, b, 2u * j + 1u);
    let sh = (j % 4u) * 2u;
    let qb = b + 32u + (j / 4u) * 32u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let ql = (vec4<u32>(word_at(wo, qb + 4u * i)) >> vec4<u32>(sh, sh + 8u, sh + 16u, sh + 24u)) & vec4<u32>(3u);
        let hb = (vec4<u32>(word_at(wo, b + 4u * i)) >> vec4<u32>(j, j + 8u, j + 16u, j + 24u)) & vec4<u32>(1u);
        let q = vec4<f32>(vec4<i32>(ql) - 4 * vec4<i32>(vec4<u32>(1u) - hb));
        v[i] = select(d1, d0, i < 4u) * q;
    }
    return v;
}
