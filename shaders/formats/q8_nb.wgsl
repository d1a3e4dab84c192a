// Q8_NB's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// Blocks are word aligned (9 words): word 0 the f32 scale, words 1..8 the 32 signed bytes.
fn q8_nb_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let wi = wo + blk * 9u;
    *dm = vec2<f32>(bitcast<f32>(w[wi]), 0.0);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = bytes_i8(w[wi + 1u + i]);
    }
    return v;
}
