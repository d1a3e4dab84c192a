// Q5_K's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// As q4_k_block (k_scale_min is Q4_K's), plus a fifth bit per element.
fn q5_k_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let j = blk % 8u;
    let b = (blk / 8u) * 176u;
    let dd = unpack2x16float(w[wo + b / 4u]);
    let sm = k_scale_min(wo, b, j);
    *dm = vec2<f32>(dd.x * sm.x, -(dd.y * sm.y));
    let hw = wo + (b + 16u) / 4u;
    let qw = wo + (b + 48u + (j / 2u) * 32u) / 4u;
    let sh = (j % 2u) * 4u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let hb = (vec4<u32>(w[hw + i]) >> vec4<u32>(j, j + 8u, j + 16u, j + 24u)) & vec4<u32>(1u);
        v[i] = nibbles(w[qw + i], sh) + 16.0 * vec4<f32>(hb);
    }
    return v;
}
