// Q4_0's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// Blocks start 2 bytes apart mod 4: the nibbles are read through word_at.
fn q4_0_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let b = blk * 18u;
    *dm = vec2<f32>(f16_at(wo, b), 0.0);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = word_at(wo, b + 2u + 4u * i);
        v[i] = nibbles(q, 0u) - 8.0;
        v[i + 4u] = nibbles(q, 4u) - 8.0;
    }
    return v;
}
