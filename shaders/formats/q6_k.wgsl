// Q6_K's decoder, appended to the `quant` family's source (one per row of the
// format table); the contract is in `src/formats/mod.rs`.
// Two 16-element groups per chunk, each with its own scale: values returned dequantized.
// Super-blocks start 2 bytes apart mod 4: reads go through word_at.
fn q6_k_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let j = blk % 8u;
    let b = (blk / 8u) * 210u;
    let d = f16_at(wo, b + 208u);
    *dm = vec2<f32>(1.0, 0.0);
    let d0 = d * f32((bitcast<i32>(byte_at(wo, b + 192u + 2u * j) << 24u)) >> 24u);
    let d1 = d * f32((bitcast<i32>(byte_at(wo, b + 193u + 2u * j) << 24u)) >> 24u);
    let h = j / 4u;
    let lb = b + 64u * h + 32u * (j % 2u);
    let ls = 4u * ((j % 4u) / 2u);
    let hb = b + 128u + 32u * h;
    let hs = 2u * (j % 4u);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let lo = (vec4<u32>(word_at(wo, lb + 4u * i)) >> vec4<u32>(ls, ls + 8u, ls + 16u, ls + 24u)) & vec4<u32>(15u);
        let hi = (vec4<u32>(word_at(wo, hb + 4u * i)) >> vec4<u32>(hs, hs + 8u, hs + 16u, hs + 24u)) & vec4<u32>(3u);
        v[i] = select(d1, d0, i < 4u) * (vec4<f32>(lo | (hi << vec4<u32>(4u))) - 32.0);
    }
    return v;
}
