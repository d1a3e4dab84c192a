//! Q3_K, 110 bytes per 256 elements: 32 bytes `hmask` (the third bits), 64 bytes `qs` (the low
//! 2 bits), 12 bytes of sixteen 6-bit scales (offset by 32), f16 `d`. Element `i`
//! (`j = i / 32`, `l = i % 32`, `h = j / 4`, `s = j % 4`) is
//! `(d * (scale[i/16] - 32)) * (((qs[32h + l] >> 2s) & 3) - 4 * (1 - (hmask[l] >> j & 1)))`;
//! scale `k`'s low nibble is nibble `k / 8` of byte `k % 8`, its top 2 bits are bits
//! `2 * (k / 4)` of byte `8 + k % 4`.

use super::{f16_at, f16_bytes, level_signed, quantize_scales, signed_step, Format};
use super::GgmlType;
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
    wgsl: format_wgsl!("q3_k"),
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
