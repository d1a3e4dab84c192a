// BF16's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
fn bf16_element(wo: u32, e: u32) -> f32 {
    let u = w[wo + e / 2u];
    return bitcast<f32>(select(u << 16u, u & 0xffff0000u, (e & 1u) == 1u));
}

fn bf16_run(wo: u32, e: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let j = e + 4u * i;
        v[i] = vec4<f32>(bf16_element(wo, j), bf16_element(wo, j + 1u), bf16_element(wo, j + 2u), bf16_element(wo, j + 3u));
    }
    return v;
}
