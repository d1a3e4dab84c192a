// Q4_NB's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// Blocks are word aligned (6 words): word 0 the f32 scale, word 1 the f32 zero point, words
// 2..5 the nibbles, element 2j in the low nibble of byte j.
fn q4_nb_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let wi = wo + blk * 6u;
    *dm = vec2<f32>(bitcast<f32>(w[wi]), 0.0);
    let z = bitcast<f32>(w[wi + 1u]);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = vec4<u32>(w[wi + 2u + i]);
        v[2u * i] = vec4<f32>((q >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - z;
        v[2u * i + 1u] = vec4<f32>((q >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - z;
    }
    return v;
}
