// Q4_0 in the grouped-planes layout (`Grouped`), appended to the `quant` family's
// source after the file layout's decoder; the contract is in `src/formats/mod.rs`.
// A group of 8 blocks is 36 words, the 8 scales as f16 pairs (words 0..4), then each block's 16
// bytes of nibbles (4 aligned words).
fn q4_0_block_g8(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let g = wo + (blk / 8u) * 36u;
    let j = blk % 8u;
    *dm = vec2<f32>(f16_at(g, 2u * j), 0.0);
    let qw = g + 4u + j * 4u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = w[qw + i];
        v[i] = nibbles(q, 0u) - 8.0;
        v[i + 4u] = nibbles(q, 4u) - 8.0;
    }
    return v;
}
