//! F16: IEEE half floats, 2 bytes each, widened exactly.

use super::GgmlType;
use super::{f16_at, f16_bytes, Format};
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
    wgsl: format_wgsl!("f16"),
};
