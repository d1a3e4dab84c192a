//! Q5_0, 22 bytes per 32 elements: f16 scale `d`, a little-endian u32 `qh` of fifth bits,
//! 16 bytes `qs` of low nibbles (element `j < 16` in the low nibble of `qs[j]`, `j + 16` in
//! the high one); element `j` is `d * ((nibble | bit j of qh << 4) - 16)`.

use super::{Grouped, f16_at, f16_bytes, inverse, pack_nibbles, signed_absmax, Format};
use crate::gguf::GgmlType;
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
        wgsl: r#"
// Grouped planes (src/formats, `Grouped`): a group of 8 blocks is 44 words, the 8 scales as
// f16 pairs (words 0..4), the 8 words of fifth bits, then each block's 16 bytes of nibbles.
fn q5_0_block_g8(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let g = wo + (blk / 8u) * 44u;
    let j = blk % 8u;
    *dm = vec2<f32>(f16_at(g, 2u * j), 0.0);
    let qh = w[g + 4u + j];
    let qw = g + 12u + j * 4u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = w[qw + i];
        v[i] = nibbles(q, 0u) + 16.0 * bits4(qh, 4u * i) - 16.0;
        v[i + 4u] = nibbles(q, 4u) + 16.0 * bits4(qh, 16u + 4u * i) - 16.0;
    }
    return v;
}
"#,
    }),
    wgsl: r#"
fn q5_0_block(wo: u32, blk: u32, dm: ptr<function, vec2<f32>>) -> array<vec4<f32>, 8> {
    let b = blk * 22u;
    *dm = vec2<f32>(f16_at(wo, b), 0.0);
    let qh = word_at(wo, b + 2u);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = word_at(wo, b + 6u + 4u * i);
        v[i] = nibbles(q, 0u) + 16.0 * bits4(qh, 4u * i) - 16.0;
        v[i + 4u] = nibbles(q, 4u) + 16.0 * bits4(qh, 16u + 4u * i) - 16.0;
    }
    return v;
}
"#,
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
