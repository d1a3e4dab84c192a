//! Q8_0, 34 bytes per 32 elements: f16 scale `d`, 32 `i8` values `q`; element `j` is
//! `d * q[j]`.

use super::{Grouped, f16_at, f16_bytes, inverse, Format};
use super::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::Q8_0,
    ggml: Some(GgmlType::Q8_0),
    name: "q8_0",
    block_elements: 32,
    block_bytes: 34,
    decode,
    quantize,
    grouped: Some(Grouped {
        fields: &[(0, 2), (2, 32)],
        wgsl: format_wgsl!("q8_0_g8"),
    }),
    wgsl: format_wgsl!("q8_0"),
};

fn decode(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (v, &q) in o.iter_mut().zip(&b[2..34]) {
        *v = f32::from(q as i8) * d;
    }
}

/// ggml's reference: the scale maps the largest magnitude to 127, values rounded half away
/// from zero.
fn quantize(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    out.extend(f16_bytes(d));
    out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
}
