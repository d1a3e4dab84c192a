//! Q5_0, 22 bytes per 32 elements: f16 scale `d`, a little-endian u32 `qh` of fifth bits,
//! 16 bytes `qs` of low nibbles (element `j < 16` in the low nibble of `qs[j]`, `j + 16` in
//! the high one); element `j` is `d * ((nibble | bit j of qh << 4) - 16)`.

use super::{Grouped, f16_at, f16_bytes, inverse, pack_nibbles, signed_absmax, Format};
use super::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q5_0,
    ggml: Some(GgmlType::Q5_0),
    name: "q5_0",
    block_elements: 32,
    block_bytes: 22,
    decode,
    quantize,
    grouped: Some(Grouped {
        fields: &[(0, 2), (2, 4), (6, 16)],
        wgsl: format_wgsl!("q5_0_g8"),
    }),
    wgsl: format_wgsl!("q5_0"),
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let q = |j: usize, nibble: u8| (nibble | ((((qh >> j) & 1) as u8) << 4)) as i8 - 16;
    for (j, &byte) in b[6..22].iter().enumerate() {
        o[j] = d * f32::from(q(j, byte & 15));
        o[j + 16] = d * f32::from(q(j + 16, byte >> 4));
    }
}

/// ggml's reference: the scale maps the value of largest magnitude to -16.
fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    let q: Vec<u8> = x.iter().map(|&v| ((v * id + 16.5) as u8).min(31)).collect();
    out.extend(f16_bytes(d));
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | (u32::from(v >> 4) << j));
    out.extend(qh.to_le_bytes());
    pack_nibbles(&q, out);
}
