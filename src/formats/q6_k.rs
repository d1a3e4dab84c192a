//! Q6_K, 210 bytes per 256 elements: 128 bytes `ql` (low nibbles), 64 bytes `qh` (top 2
//! bits), 16 signed 8-bit scales (one per 16 elements), f16 `d`. Element `i` (`h = i / 128`,
//! `r = i % 128`) takes its nibble `r / 64` of `ql[64h + r % 64]` and bits `2 * (r / 32)` of
//! `qh[32h + r % 32]`; its value is `(d * scales[i/16]) * ((nibble | top << 4) - 32)`.

use super::{f16_at, f16_bytes, level_signed, quantize_scales, signed_step, Format};
use super::GgmlType;
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
    wgsl: format_wgsl!("q6_k"),
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
