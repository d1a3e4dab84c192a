//! F16: IEEE half floats, 2 bytes each, widened exactly.

use super::{f16_at, f16_bytes, Format};
use crate::gguf::GgmlType;
use crate::shape::DType;

/// The table row.
pub const FORMAT: Format = Format {
    dtype: DType::F16,
    ggml: Some(GgmlType::F16),
    name: "f16",
    block_elements: 1,
    block_bytes: 2,
    decode: |b, o| o[0] = f16_at(b, 0),
    quantize: |x, out| out.extend(f16_bytes(x[0])),
    grouped: None,
    wgsl: r#"
fn f16_element(wo: u32, e: u32) -> f32 {
    let h = unpack2x16float(w[wo + e / 2u]);
    return select(h.x, h.y, (e & 1u) == 1u);
}

// Even e: 16 words unpacked two halves at a time; odd e element by element.
fn f16_run(wo: u32, e: u32) -> array<vec4<f32>, 8> {
    var v: array<vec4<f32>, 8>;
    if (e & 1u) == 0u {
        let wi = wo + e / 2u;
        for (var i = 0u; i < 8u; i++) {
            v[i] = vec4<f32>(unpack2x16float(w[wi + 2u * i]), unpack2x16float(w[wi + 2u * i + 1u]));
        }
    } else {
        for (var i = 0u; i < 8u; i++) {
            let j = e + 4u * i;
            v[i] = vec4<f32>(f16_element(wo, j), f16_element(wo, j + 1u), f16_element(wo, j + 2u), f16_element(wo, j + 3u));
        }
    }
    return v;
}
"#,
};
