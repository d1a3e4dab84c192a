// F32's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
fn f32_element(wo: u32, e: u32) -> f32 {
    return bitcast<f32>(w[wo + e]);
}

fn f32_run(wo: u32, e: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    let wi = wo + e;
    for (var i = 0u; i < 8u; i++) {
        let j = wi + 4u * i;
        v[i] = bitcast<vec4<f32>>(vec4<u32>(w[j], w[j + 1u], w[j + 2u], w[j + 3u]));
    }
    return v;
}
