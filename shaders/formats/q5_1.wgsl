// Q5_1's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// Blocks are word aligned (6 words): d | m << 16, qh, 4 words of nibbles.
fn q5_1_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let wi = wo + blk * 6u;
    *dm = unpack2x16float(w[wi]);
    let qh = w[wi + 1u];
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = w[wi + 2u + i];
        v[i] = nibbles(q, 0u) + 16.0 * bits4(qh, 4u * i);
        v[i + 4u] = nibbles(q, 4u) + 16.0 * bits4(qh, 16u + 4u * i);
    }
    return v;
}
