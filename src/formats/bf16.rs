//! BF16: brain floats, the top 16 bits of an f32 (widened by a shift, exactly).

use super::Format;
use crate::gguf::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::BF16,
    ggml: Some(GgmlType::BF16),
    name: "bf16",
    block_elements: 1,
    block_bytes: 2,
    decode: |b, o| o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
    quantize: |x, out| out.extend(half::bf16::from_f32(x[0]).to_le_bytes()),
    grouped: None,
    wgsl: r#"
fn bf16_element(wo: u32, e: u32) -> f32 {
    let u = w[wo + e / 2u];
    return bitcast<f32>(select(u << 16u, u & 0xffff0000u, (e & 1u) == 1u));
}

fn bf16_run(wo: u32, e: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let j = e + 4u * i;
        v[i] = vec4<f32>(bf16_element(wo, j), bf16_element(wo, j + 1u), bf16_element(wo, j + 2u), bf16_element(wo, j + 3u));
    }
    return v;
}
"#,
};
