//! BF16: brain floats, the top 16 bits of an f32 (widened by a shift, exactly).

use super::Format;
use super::GgmlType;
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
    wgsl: format_wgsl!("bf16"),
};
