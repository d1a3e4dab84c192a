//! Q4_0, 18 bytes per 32 elements: f16 scale `d`, 16 bytes `qs`; element `j < 16` is
//! `d * ((qs[j] & 15) - 8)`, element `j + 16` is `d * ((qs[j] >> 4) - 8)`.

use super::{Grouped, f16_at, f16_bytes, inverse, pack_nibbles, signed_absmax, Format};
use crate::gguf::GgmlType;
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
        wgsl: r#"
// Grouped planes (src/formats, `Grouped`): a group of 8 blocks is 36 words, the 8 scales as
// f16 pairs (words 0..4), then each block's 16 bytes of nibbles (4 aligned words).
fn q4_0_block_g8(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let g = wo + (blk / 8u) * 36u;
    let j = blk % 8u;
    *dm = vec2<f32>(f16_at(g, 2u * j), 0.0);
    let qw = g + 4u + j * 4u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = w[qw + i];
        v[i] = nibbles(q, 0u) - 8.0;
        v[i + 4u] = nibbles(q, 4u) - 8.0;
    }
    return v;
}
"#,
    }),
    wgsl: r#"
// Blocks start 2 bytes apart mod 4: the nibbles are read through word_at.
fn q4_0_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let b = blk * 18u;
    *dm = vec2<f32>(f16_at(wo, b), 0.0);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = word_at(wo, b + 2u + 4u * i);
        v[i] = nibbles(q, 0u) - 8.0;
        v[i + 4u] = nibbles(q, 4u) - 8.0;
    }
    return v;
}
"#,
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
