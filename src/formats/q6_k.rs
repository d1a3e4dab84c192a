//! Q6_K, 210 bytes per 256 elements: 128 bytes `ql` (low nibbles), 64 bytes `qh` (top 2
//! bits), 16 signed 8-bit scales (one per 16 elements), f16 `d`. Element `i` (`h = i / 128`,
//! `r = i % 128`) takes its nibble `r / 64` of `ql[64h + r % 64]` and bits `2 * (r / 32)` of
//! `qh[32h + r % 32]`; its value is `(d * scales[i/16]) * ((nibble | top << 4) - 32)`.

use super::{f16_at, f16_bytes, level_signed, quantize_scales, signed_step, Format};
use crate::gguf::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q6_K,
    ggml: Some(GgmlType::Q6_K),
    name: "q6_k",
    block_elements: 256,
    block_bytes: 210,
    decode,
    quantize,
    grouped: None,
    wgsl: r#"
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
"#,
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 208);
    for (i, v) in o.iter_mut().enumerate() {
        let (h, r) = (i / 128, i % 128);
        let lo = (b[64 * h + r % 64] >> (4 * (r / 64))) & 15;
        let hi = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
        let q = (lo | (hi << 4)) as i8 - 32;
        let dl = d * f32::from(b[192 + i / 16] as i8);
        *v = dl * f32::from(q);
    }
}

fn quantize(x: &[f32], out: &mut Vec<u8>) {
    // Groups of 16 on the grid -32..=31, the step wide enough for both ends of the group.
    let steps = x.chunks_exact(16).map(|g| signed_step(g, 32.0, 31.0));
    let (d, sc) = quantize_scales(steps, 127);
    let u: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| (level_signed(v, d * f32::from(sc[i / 16]), -32, 31) + 32) as u8)
        .collect();
    for h in 0..2 {
        out.extend((0..64).map(|t| (u[128 * h + t] & 15) | ((u[128 * h + 64 + t] & 15) << 4)));
    }
    for h in 0..2 {
        for l in 0..32 {
            out.push((0..4).fold(0u8, |a, s| a | ((u[128 * h + 32 * s + l] >> 4) << (2 * s))));
        }
    }
    out.extend(sc);
    out.extend(f16_bytes(d));
}
