//! F32: IEEE single floats, 4 bytes each.

use super::Format;
use super::GgmlType;
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
    wgsl: format_wgsl!("f32"),
};
