//! Q3_K, 110 bytes per 256 elements: 32 bytes `hmask` (the third bits), 64 bytes `qs` (the low
//! 2 bits), 12 bytes of sixteen 6-bit scales (offset by 32), f16 `d`. Element `i`
//! (`j = i / 32`, `l = i % 32`, `h = j / 4`, `s = j % 4`) is
//! `(d * (scale[i/16] - 32)) * (((qs[32h + l] >> 2s) & 3) - 4 * (1 - (hmask[l] >> j & 1)))`;
//! scale `k`'s low nibble is nibble `k / 8` of byte `k % 8`, its top 2 bits are bits
//! `2 * (k / 4)` of byte `8 + k % 4`.

use super::{f16_at, f16_bytes, level_signed, quantize_scales, signed_step, Format};
use crate::gguf::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q3_K,
    ggml: Some(GgmlType::Q3_K),
    name: "q3_k",
    block_elements: 256,
    block_bytes: 110,
    decode,
    quantize,
    grouped: None,
    wgsl: r#"
// Scale k of the Q3_K super-block at byte b, minus its offset of 32.
fn q3_k_scale(wo: u32, b: u32, k: u32) -> f32 {
    let lo = (byte_at(wo, b + 96u + k % 8u) >> (4u * (k / 8u))) & 15u;
    let hi = (byte_at(wo, b + 104u + k % 4u) >> (2u * (k / 4u))) & 3u;
    return f32(i32(lo | (hi << 4u)) - 32);
}

// Super-blocks start 2 bytes apart mod 4: reads go through word_at.
fn q3_k_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let j = blk % 8u;
    let b = (blk / 8u) * 110u;
    let d = f16_at(wo, b + 108u);
    *dm = vec2<f32>(1.0, 0.0);
    let d0 = d * q3_k_scale(wo, b, 2u * j);
    let d1 = d * q3_k_scale(wo, b, 2u * j + 1u);
    let sh = (j % 4u) * 2u;
    let qb = b + 32u + (j / 4u) * 32u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let ql = (vec4<u32>(word_at(wo, qb + 4u * i)) >> vec4<u32>(sh, sh + 8u, sh + 16u, sh + 24u)) & vec4<u32>(3u);
        let hb = (vec4<u32>(word_at(wo, b + 4u * i)) >> vec4<u32>(j, j + 8u, j + 16u, j + 24u)) & vec4<u32>(1u);
        let q = vec4<f32>(vec4<i32>(ql) - 4 * vec4<i32>(vec4<u32>(1u) - hb));
        v[i] = select(d1, d0, i < 4u) * q;
    }
    return v;
}
"#,
};

/// Scale `k` (0..16) of the 12 scale bytes, 0..64.
fn scale6(s: &[u8], k: usize) -> u8 {
    let lo = (s[k % 8] >> (4 * (k / 8))) & 15;
    let hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    lo | (hi << 4)
}

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 108);
    let scales = &b[96..108];
    for (i, v) in o.iter_mut().enumerate() {
        let (j, l) = (i / 32, i % 32);
        let (h, s) = (j / 4, j % 4);
        let ql = (b[32 + 32 * h + l] >> (2 * s)) & 3;
        let hb = (b[l] >> j) & 1;
        let q = ql as i8 - (((hb ^ 1) << 2) as i8);
        let dl = d * f32::from(scale6(scales, i / 16) as i8 - 32);
        *v = dl * f32::from(q);
    }
}

fn quantize(x: &[f32], out: &mut Vec<u8>) {
    // Groups of 16 on the grid -4..=3, the step wide enough for both ends of the group.
    let steps = x.chunks_exact(16).map(|g| signed_step(g, 4.0, 3.0));
    let (d, sc) = quantize_scales(steps, 31);
    // Stored q + 4 in 0..8: low 2 bits in qs, the third in hmask.
    let u: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| (level_signed(v, d * f32::from(sc[i / 16]), -4, 3) + 4) as u8)
        .collect();
    out.extend((0..32).map(|l| (0..8).fold(0u8, |a, j| a | ((u[32 * j + l] >> 2) << j))));
    for h in 0..2 {
        for l in 0..32 {
            out.push((0..4).fold(0u8, |a, s| {
                a | ((u[128 * h + 32 * s + l] & 3) << (2 * s))
            }));
        }
    }
    let s6: Vec<u8> = sc.iter().map(|&s| s + 32).collect();
    let mut scales = [0u8; 12];
    for (k, &s) in s6.iter().enumerate() {
        scales[k % 8] |= (s & 15) << (4 * (k / 8));
        scales[8 + k % 4] |= (s >> 4) << (2 * (k / 4));
    }
    out.extend(scales);
    out.extend(f16_bytes(d));
}
