//! Q8_0, 34 bytes per 32 elements: f16 scale `d`, 32 `i8` values `q`; element `j` is
//! `d * q[j]`.

use super::{Grouped, f16_at, f16_bytes, inverse, Format};
use crate::gguf::GgmlType;
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
        wgsl: r#"
// Grouped planes (src/formats, `Grouped`): a group of 8 blocks is 68 words, the 8 scales as
// f16 pairs (words 0..4), then each block's 32 quants (8 aligned words).
fn q8_0_block_g8(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let g = wo + (blk / 8u) * 68u;
    let j = blk % 8u;
    *dm = vec2<f32>(f16_at(g, 2u * j), 0.0);
    let q = g + 4u + j * 8u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = bytes_i8(w[q + i]);
    }
    return v;
}
"#,
    }),
    wgsl: r#"
// A block starts at a byte offset that is 0 or 2 mod 4; both cases read 9 words.
fn q8_0_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let byte = wo * 4u + blk * 34u;
    let wi = byte / 4u;
    let odd = (byte & 2u) != 0u;
    var u = w[wi];
    *dm = vec2<f32>(unpack2x16float(select(u, u >> 16u, odd)).x, 0.0);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let next = w[wi + 1u + i];
        let q = select((u >> 16u) | (next << 16u), next, odd);
        u = next;
        v[i] = bytes_i8(q);
    }
    return v;
}
"#,
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
