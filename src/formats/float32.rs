//! F32: IEEE single floats, 4 bytes each.

use super::Format;
use crate::gguf::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::F32,
    ggml: Some(GgmlType::F32),
    name: "f32",
    block_elements: 1,
    block_bytes: 4,
    decode: |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    quantize: |x, out| out.extend(x[0].to_le_bytes()),
    grouped: None,
    wgsl: r#"
fn f32_element(wo: u32, e: u32) -> f32 {
    return bitcast<f32>(w[wo + e]);
}

fn f32_run(wo: u32, e: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    let wi = wo + e;
    for (var i = 0u; i < 8u; i++) {
        let j = wi + 4u * i;
        v[i] = bitcast<vec4<f32>>(vec4<u32>(w[j], w[j + 1u], w[j + 2u], w[j + 3u]));
    }
    return v;
}
"#,
};
