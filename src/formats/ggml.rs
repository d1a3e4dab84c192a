//! ggml tensor types: ids, block lengths and block sizes. They live with the formats, which
//! name the ggml type of each row; `gguf` reads and writes them (`gguf::GgmlType`) and
//! imports this module, not the other way round.

use std::fmt;

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block_len:literal, $block_bytes:literal, $doc:literal;)*) => {
        /// The element type of a GGUF tensor: plain numbers or a block quantization format.
        ///
        /// Block-quantized types store `block_len()` elements in `block_bytes()` bytes; a
        /// tensor's innermost dimension is a whole number of blocks. The ids and sizes are
        /// ggml's (the table of the Python `gguf` package's `GGML_QUANT_SIZES`, which a test
        /// compares against); ids that ggml has retired are rejected as unknown.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        // ggml's names (`Q4_1`, `IQ2_XXS`) are the vocabulary every reader of GGUF knows.
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $(#[doc = $doc] $variant,)*
        }

        impl GgmlType {
            /// Every type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type with ggml id `id`, or `None` for an id ggml does not define.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// ggml's id of the type (as stored in a GGUF tensor info).
            pub fn id(self) -> u32 {
                match self { $(GgmlType::$variant => $id,)* }
            }

            /// ggml's name of the type (`"Q4_1"`, `"F32"`).
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name,)* }
            }

            /// Elements per block (1 for plain numbers).
            pub fn block_len(self) -> u64 {
                match self { $(GgmlType::$variant => $block_len,)* }
            }

            /// Bytes per block.
            pub fn block_bytes(self) -> u64 {
                match self { $(GgmlType::$variant => $block_bytes,)* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4, "32-bit float.";
    F16 = 1, "F16", 1, 2, "16-bit IEEE float.";
    Q4_0 = 2, "Q4_0", 32, 18, "Blocks of 32: f16 scale, 16 bytes of 4-bit values offset by 8.";
    Q4_1 = 3, "Q4_1", 32, 20, "Blocks of 32: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit `q`; value `d*q + m`.";
    Q5_0 = 6, "Q5_0", 32, 22, "Blocks of 32, 5-bit values with a scale.";
    Q5_1 = 7, "Q5_1", 32, 24, "Blocks of 32, 5-bit values with a scale and a minimum.";
    Q8_0 = 8, "Q8_0", 32, 34, "Blocks of 32: f16 scale `d`, 32 signed bytes `q`; value `d*q`.";
    Q8_1 = 9, "Q8_1", 32, 40, "Blocks of 32, 8-bit values with a scale and a sum.";
    Q2_K = 10, "Q2_K", 256, 84, "k-quant super-blocks of 256, 2-bit.";
    Q3_K = 11, "Q3_K", 256, 110, "k-quant super-blocks of 256, 3-bit.";
    Q4_K = 12, "Q4_K", 256, 144, "k-quant super-blocks of 256, 4-bit.";
    Q5_K = 13, "Q5_K", 256, 176, "k-quant super-blocks of 256, 5-bit.";
    Q6_K = 14, "Q6_K", 256, 210, "k-quant super-blocks of 256, 6-bit.";
    Q8_K = 15, "Q8_K", 256, 292, "k-quant super-blocks of 256, 8-bit.";
    IQ2_XXS = 16, "IQ2_XXS", 256, 66, "i-quant, about 2.06 bits per weight.";
    IQ2_XS = 17, "IQ2_XS", 256, 74, "i-quant, about 2.31 bits per weight.";
    IQ3_XXS = 18, "IQ3_XXS", 256, 98, "i-quant, about 3.06 bits per weight.";
    IQ1_S = 19, "IQ1_S", 256, 50, "i-quant, about 1.56 bits per weight.";
    IQ4_NL = 20, "IQ4_NL", 32, 18, "Non-linear 4-bit blocks of 32.";
    IQ3_S = 21, "IQ3_S", 256, 110, "i-quant, about 3.44 bits per weight.";
    IQ2_S = 22, "IQ2_S", 256, 82, "i-quant, about 2.5 bits per weight.";
    IQ4_XS = 23, "IQ4_XS", 256, 136, "i-quant, about 4.25 bits per weight.";
    I8 = 24, "I8", 1, 1, "8-bit signed integer.";
    I16 = 25, "I16", 1, 2, "16-bit signed integer.";
    I32 = 26, "I32", 1, 4, "32-bit signed integer.";
    I64 = 27, "I64", 1, 8, "64-bit signed integer.";
    F64 = 28, "F64", 1, 8, "64-bit float.";
    IQ1_M = 29, "IQ1_M", 256, 56, "i-quant, about 1.75 bits per weight.";
    BF16 = 30, "BF16", 1, 2, "bfloat16.";
    TQ1_0 = 34, "TQ1_0", 256, 54, "Ternary, about 1.69 bits per weight.";
    TQ2_0 = 35, "TQ2_0", 256, 66, "Ternary, 2.06 bits per weight.";
    MXFP4 = 39, "MXFP4", 32, 17, "Microscaling FP4 blocks of 32.";
    NVFP4 = 40, "NVFP4", 64, 36, "NVIDIA FP4 blocks of 64.";
    Q1_0 = 41, "Q1_0", 128, 18, "1-bit blocks of 128.";
}

impl GgmlType {
    /// Bytes that `num_elements` elements take, or `None` when `num_elements` is not a whole
    /// number of blocks or the size overflows.
    pub fn size_bytes(self, num_elements: u64) -> Option<u64> {
        if num_elements % self.block_len() != 0 {
            return None;
        }
        (num_elements / self.block_len()).checked_mul(self.block_bytes())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_retired_ids_are_unknown() {
        assert_eq!(GgmlType::ALL.len(), 34);
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t), "{t}");
        }
        // Q4_2, Q4_3 and the Q4_0_4_4 family were removed from ggml.
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
    }

    #[test]
    fn size_bytes_needs_whole_blocks() {
        assert_eq!(GgmlType::Q4_1.size_bytes(576 * 1536), Some(552_960));
        assert_eq!(GgmlType::Q8_0.size_bytes(576 * 49152), Some(30_081_024));
        assert_eq!(GgmlType::Q4_1.size_bytes(33), None);
        assert_eq!(GgmlType::F32.size_bytes(u64::MAX), None);
    }
}
