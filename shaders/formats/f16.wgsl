// F16's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
fn f16_element(wo: u32, e: u32) -> f32 {
    let h = unpack2x16float(w[wo + e / 2u]);
    return select(h.x, h.y, (e & 1u) == 1u);
}

// Even e: 16 words unpacked two halves at a time; odd e element by element.
fn f16_run(wo: u32, e: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    if (e & 1u) == 0u {
        let wi = wo + e / 2u;
        for (var i = 0u; i < 8u; i++) {
            v[i] = vec4<f32>(unpack2x16float(w[wi + 2u * i]), unpack2x16float(w[wi + 2u * i + 1u]));
        }
    } else {
        for (var i = 0u; i < 8u; i++) {
            let j = e + 4u * i;
            v[i] = vec4<f32>(f16_element(wo, j), f16_element(wo, j + 1u), f16_element(wo, j + 2u), f16_element(wo, j + 3u));
        }
    }
    return v;
}
