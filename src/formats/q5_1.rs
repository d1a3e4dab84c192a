//! Q5_1, 24 bytes per 32 elements: f16 scale `d`, f16 minimum `m`, a little-endian u32 `qh`
//! of fifth bits, 16 bytes `qs` of low nibbles (as Q5_0); element `j` is
//! `d * (nibble | bit j of qh << 4) + m`.

use super::{f16_at, f16_bytes, inverse, pack_nibbles, Format};
use super::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q5_1,
    ggml: Some(GgmlType::Q5_1),
    name: "q5_1",
    block_elements: 32,
    block_bytes: 24,
    decode,
    quantize,
    grouped: None,
    wgsl: format_wgsl!("q5_1"),
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let q = |j: usize, nibble: u8| nibble | ((((qh >> j) & 1) as u8) << 4);
    for (j, &byte) in b[8..24].iter().enumerate() {
        o[j] = d * f32::from(q(j, byte & 15)) + m;
        o[j + 16] = d * f32::from(q(j + 16, byte >> 4)) + m;
    }
}

/// ggml's reference: the block's range in 31 steps from its minimum.
fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| (((v - min) * id + 0.5) as u8).min(31))
        .collect();
    out.extend(f16_bytes(d));
    out.extend(f16_bytes(min));
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | (u32::from(v >> 4) << j));
    out.extend(qh.to_le_bytes());
    pack_nibbles(&q, out);
}
