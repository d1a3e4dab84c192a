// Q8_0's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// A block starts at a byte offset that is 0 or 2 mod 4; both cases read 9 words.
fn q8_0_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let byte = wo * 4u + blk * 34u;
    let wi = byte / 4u;
    let odd = (byte & 2u) != 0u;
    var u = w[wi];
    *dm = vec2<f32>(unpack2x16float(select(u, u >> 16u, odd)).x, 0.0);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let next = w[wi + 1u + i];
        let q = select((u >> 16u) | (next << 16u), next, odd);
        u = next;
        v[i] = bytes_i8(q);
    }
    return v;
}
