// Q2_K's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// Two 16-element groups per chunk, each with its own scale: values returned dequantized.
fn q2_k_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let j = blk % 8u;
    let b = (blk / 8u) * 84u;
    let dd = unpack2x16float(w[wo + (b + 80u) / 4u]);
    *dm = vec2<f32>(1.0, 0.0);
    let sh = (j % 4u) * 2u;
    let qw = wo + (b + 16u + (j / 4u) * 32u) / 4u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let q = (vec4<u32>(w[qw + i]) >> vec4<u32>(sh, sh + 8u, sh + 16u, sh + 24u)) & vec4<u32>(3u);
        let sc = byte_at(wo, b + 2u * j + i / 4u);
        v[i] = (dd.x * f32(sc & 15u)) * vec4<f32>(q) - dd.y * f32(sc >> 4u);
    }
    return v;
}
