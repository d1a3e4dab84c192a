//! Q4_0, 18 bytes per 32 elements: f16 scale `d`, 16 bytes `qs`; element `j < 16` is
//! `d * ((qs[j] & 15) - 8)`, element `j + 16` is `d * ((qs[j] >> 4) - 8)`.

use super::{Grouped, f16_at, f16_bytes, inverse, pack_nibbles, signed_absmax, Format};
use super::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q4_0,
    ggml: Some(GgmlType::Q4_0),
    name: "q4_0",
    block_elements: 32,
    block_bytes: 18,
    decode,
    quantize,
    grouped: Some(Grouped {
        fields: &[(0, 2), (2, 16)],
        wgsl: format_wgsl!("q4_0_g8"),
    }),
    wgsl: format_wgsl!("q4_0"),
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        o[j] = d * f32::from((q & 15) as i8 - 8);
        o[j + 16] = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// ggml's reference: the scale maps the value of largest magnitude to -8.
fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    out.extend(f16_bytes(d));
    let q: Vec<u8> = x.iter().map(|&v| ((v * id + 8.5) as u8).min(15)).collect();
    pack_nibbles(&q, out);
}
