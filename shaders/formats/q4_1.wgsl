// Q4_1's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// Blocks are word aligned (5 words): word 0 = f16 d | f16 m << 16, words 1..4 the nibbles.
fn q4_1_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let wi = wo + blk * 5u;
    *dm = unpack2x16float(w[wi]);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = w[wi + 1u + i];
        v[i] = nibbles(q, 0u);
        v[i + 4u] = nibbles(q, 4u);
    }
    return v;
}
