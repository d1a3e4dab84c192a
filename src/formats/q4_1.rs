//! Q4_1, 20 bytes per 32 elements: f16 scale `d`, f16 minimum `m`, 16 bytes `qs`; element
//! `j < 16` is `d * (qs[j] & 15) + m`, element `j + 16` is `d * (qs[j] >> 4) + m`.

use super::{f16_at, f16_bytes, inverse, pack_nibbles, Format};
use super::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q4_1,
    ggml: Some(GgmlType::Q4_1),
    name: "q4_1",
    block_elements: 32,
    block_bytes: 20,
    decode,
    quantize,
    grouped: None,
    wgsl: format_wgsl!("q4_1"),
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for (j, &q) in b[4..20].iter().enumerate() {
        o[j] = d * f32::from(q & 15) + m;
        o[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// ggml's reference: the block's range in 15 steps from its minimum.
fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    out.extend(f16_bytes(d));
    out.extend(f16_bytes(min));
    let q: Vec<u8> = x
        .iter()
        .map(|&v| (((v - min) * id + 0.5) as u8).min(15))
        .collect();
    pack_nibbles(&q, out);
}
