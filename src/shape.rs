//! Concrete shapes, element types and byte sizes with overflow checks.
//!
//! Everything here is plain Rust: no wgpu. Symbolic dimensions (`seq`, `past`) live in
//! [`crate::graph`]; once bound for a run they become the concrete [`Shape`] of this module.

use std::fmt;

/// Errors about shapes and byte sizes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError {
    /// The element count or byte size of a shape does not fit in `u64`.
    #[error("byte size of shape {shape} with {bits}-bit elements overflows u64")]
    Overflow {
        /// The shape, printed.
        shape: String,
        /// Element width in bits.
        bits: u32,
    },
    /// An element type name was not recognised.
    #[error("unknown dtype `{name}`: expected one of {}", DType::names())]
    UnknownDType {
        /// The name as given.
        name: String,
    },
    /// A shape string was malformed.
    #[error("malformed shape `{text}`: {reason}")]
    Malformed {
        /// The text as given.
        text: String,
        /// What was wrong with it.
        reason: String,
    },
}

/// How many elements a block-quantized format packs into how many bytes (ggml's Q4_1: 32
/// elements in 20 bytes, Q4_K: 256 in 144). Blocks run along the last dimension of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockLayout {
    /// Elements per block.
    pub elements: u32,
    /// Bytes per block (scales and packed integers).
    pub bytes: u32,
}

/// Element type of a tensor: a plain element of a whole number of bits, or a block-quantized
/// format whose size is counted in blocks ([`DType::block`]), never in bits per element. The
/// block formats are the rows of [`crate::formats`]' table (one variant each, its layout
/// documented in that format's module; a test there checks that the table and this enum
/// name the same formats with the same block sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
// ggml's names (`Q4_K`) are the vocabulary every reader of GGUF knows.
#[allow(non_camel_case_types)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 16-bit brain float (the top half of an f32).
    BF16,
    /// 64-bit signed integer (ONNX shape tensors; computed on the host).
    I64,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
    /// 8-bit signed integer.
    I8,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean, one byte per element (0 or 1), as ONNX stores it.
    Bool,
    /// Q4_0: a block format (see the `q4_0` row of [`crate::formats::FORMATS`]).
    Q4_0,
    /// Q4_1: a block format (see the `q4_1` row of [`crate::formats::FORMATS`]).
    Q4_1,
    /// Q5_0: a block format (see the `q5_0` row of [`crate::formats::FORMATS`]).
    Q5_0,
    /// Q5_1: a block format (see the `q5_1` row of [`crate::formats::FORMATS`]).
    Q5_1,
    /// Q8_0: a block format (see the `q8_0` row of [`crate::formats::FORMATS`]).
    Q8_0,
    /// Q2_K: a block format (see the `q2_k` row of [`crate::formats::FORMATS`]).
    Q2_K,
    /// Q3_K: a block format (see the `q3_k` row of [`crate::formats::FORMATS`]).
    Q3_K,
    /// Q4_K: a block format (see the `q4_k` row of [`crate::formats::FORMATS`]).
    Q4_K,
    /// Q5_K: a block format (see the `q5_k` row of [`crate::formats::FORMATS`]).
    Q5_K,
    /// Q6_K: a block format (see the `q6_k` row of [`crate::formats::FORMATS`]).
    Q6_K,
    /// Q4_NB: a block format (see the `q4_nb` row of [`crate::formats::FORMATS`]).
    Q4_NB,
    /// Q8_NB: a block format (see the `q8_nb` row of [`crate::formats::FORMATS`]).
    Q8_NB,
}

impl DType {
    /// Every element type, in the order error messages list them.
    pub const ALL: &'static [DType] = &[
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U32,
        DType::I8,
        DType::U8,
        DType::Bool,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q4_NB,
        DType::Q8_NB,
    ];

    /// Width of one element in bits; `None` for block-quantized formats, whose size is only
    /// defined per block ([`DType::block`]).
    pub fn bits(self) -> Option<u32> {
        match self {
            DType::I64 => Some(64),
            DType::F32 | DType::I32 | DType::U32 => Some(32),
            DType::F16 | DType::BF16 => Some(16),
            DType::I8 | DType::U8 | DType::Bool => Some(8),
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q4_NB
            | DType::Q8_NB => None,
        }
    }

    /// Lower-case name (`f32`, `q4_1`, ...), as used in traces and on the CLI.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2_K => "q2_k",
            DType::Q3_K => "q3_k",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
            DType::Q4_NB => "q4_nb",
            DType::Q8_NB => "q8_nb",
        }
    }
}

impl DType {
    /// The block layout of a block-quantized format; `None` for plain element types.
    pub fn block(self) -> Option<BlockLayout> {
        let (elements, bytes) = match self {
            DType::Q4_0 => (32, 18),
            DType::Q4_1 => (32, 20),
            DType::Q5_0 => (32, 22),
            DType::Q5_1 => (32, 24),
            DType::Q8_0 => (32, 34),
            DType::Q2_K => (256, 84),
            DType::Q3_K => (256, 110),
            DType::Q4_K => (256, 144),
            DType::Q5_K => (256, 176),
            DType::Q6_K => (256, 210),
            DType::Q4_NB => (32, 24),
            DType::Q8_NB => (32, 36),
            DType::F32
            | DType::F16
            | DType::BF16
            | DType::I64
            | DType::I32
            | DType::U32
            | DType::I8
            | DType::U8
            | DType::Bool => return None,
        };
        Some(BlockLayout { elements, bytes })
    }

    /// Whether values are floating point (f32, f16, bf16, and the block formats, whose
    /// values dequantize to floats).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16) || self.block().is_some()
    }

    /// Whether values are integers (bool included).
    pub fn is_int(self) -> bool {
        !self.is_float()
    }

    /// Every name [`DType::from_str`](std::str::FromStr) accepts, for messages.
    pub fn names() -> &'static str {
        static NAMES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        NAMES.get_or_init(|| {
            DType::ALL
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", ")
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = ShapeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == name)
            .ok_or_else(|| ShapeError::UnknownDType {
                name: name.to_string(),
            })
    }
}

/// A concrete shape: one extent per dimension, outermost first. Rank 0 is a scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Shape(pub Vec<u64>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl Into<Vec<u64>>) -> Self {
        Shape(dims.into())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[u64] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements, `None` on overflow. A scalar has one element.
    pub fn checked_num_elements(&self) -> Option<u64> {
        self.0.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Number of elements.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the product does not fit in `u64`.
    pub fn num_elements(&self) -> Result<u64, ShapeError> {
        self.checked_num_elements()
            .ok_or_else(|| ShapeError::Overflow {
                shape: self.to_string(),
                bits: 0,
            })
    }

    /// Bytes taken by this shape with elements of `bits` bits: `ceil(elements * bits / 8)`,
    /// as the reference plugin computes it.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the size does not fit in `u64`.
    pub fn size_bytes_for_bits(&self, bits: u32) -> Result<u64, ShapeError> {
        self.checked_num_elements()
            .and_then(|n| n.checked_mul(bits as u64))
            .map(|b| b.div_ceil(8))
            .ok_or_else(|| ShapeError::Overflow {
                shape: self.to_string(),
                bits,
            })
    }

    /// Bytes taken by this shape with elements of `dtype`: `ceil(elements * bits / 8)` for
    /// plain types; for block-quantized types, blocks along the last dimension, a partial
    /// block counting whole (`rows * ceil(last / block elements) * block bytes`, a scalar
    /// being one row of one element).
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the size does not fit in `u64`.
    pub fn size_bytes(&self, dtype: DType) -> Result<u64, ShapeError> {
        let Some(block) = dtype.block() else {
            return self.size_bytes_for_bits(dtype.bits().unwrap_or(8));
        };
        let overflow = || ShapeError::Overflow {
            shape: self.to_string(),
            bits: 0,
        };
        let (rows, last) = match self.0.split_last() {
            Some((&last, rest)) => (
                rest.iter()
                    .try_fold(1u64, |a, &d| a.checked_mul(d))
                    .ok_or_else(overflow)?,
                last,
            ),
            None => (1, 1),
        };
        rows.checked_mul(last.div_ceil(u64::from(block.elements)))
            .and_then(|blocks| blocks.checked_mul(u64::from(block.bytes)))
            .ok_or_else(overflow)
    }
}

impl From<Vec<u64>> for Shape {
    fn from(v: Vec<u64>) -> Self {
        Shape(v)
    }
}

impl From<&[u64]> for Shape {
    fn from(v: &[u64]) -> Self {
        Shape(v.to_vec())
    }
}

impl fmt::Display for Shape {
    /// Dimensions joined by `x` (`1x32x128x64`); a scalar prints as `scalar`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("scalar");
        }
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("x")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Shape {
    type Err = ShapeError;
    /// Parses `1x32x128x64` (and `scalar`, what a rank-0 shape prints).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        if text == "scalar" {
            return Ok(Shape(Vec::new()));
        }
        if text.is_empty() {
            return Err(ShapeError::Malformed {
                text: s.to_string(),
                reason: "empty shape".into(),
            });
        }
        text.split('x')
            .map(|d| {
                d.trim().parse::<u64>().map_err(|_| ShapeError::Malformed {
                    text: s.to_string(),
                    reason: format!("dimension `{d}` is not a non-negative integer"),
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_round_up_and_detect_overflow() {
        assert_eq!(Shape::new(vec![3]).size_bytes_for_bits(4).unwrap(), 2);
        assert_eq!(Shape::new(vec![2, 3]).size_bytes(DType::F32).unwrap(), 24);
        assert_eq!(Shape::new(vec![]).size_bytes(DType::F16).unwrap(), 2);
        assert!(matches!(
            Shape::new(vec![u64::MAX, 2]).size_bytes(DType::F32),
            Err(ShapeError::Overflow { .. })
        ));
    }

    #[test]
    fn block_formats_are_sized_in_blocks_never_in_bits() {
        assert_eq!(DType::Q4_1.bits(), None);
        // 2 rows of 64: 2 blocks each, 20 bytes per Q4_1 block, 34 per Q8_0 block.
        assert_eq!(Shape::new(vec![2, 64]).size_bytes(DType::Q4_1).unwrap(), 80);
        assert_eq!(
            Shape::new(vec![2, 64]).size_bytes(DType::Q8_0).unwrap(),
            136
        );
        // A partial block counts whole; a scalar is one block.
        assert_eq!(
            Shape::new(vec![3, 33]).size_bytes(DType::Q8_0).unwrap(),
            3 * 2 * 34
        );
        assert_eq!(Shape::new(vec![]).size_bytes(DType::Q4_1).unwrap(), 20);
        assert_eq!(Shape::new(vec![0, 64]).size_bytes(DType::Q4_1).unwrap(), 0);
        assert!(Shape::new(vec![u64::MAX, 64])
            .size_bytes(DType::Q8_0)
            .is_err());
        assert_eq!(Shape::new(vec![3]).size_bytes(DType::Bool).unwrap(), 3);
        assert_eq!(Shape::new(vec![3]).size_bytes(DType::I64).unwrap(), 24);
    }

    #[test]
    fn shape_text_round_trips() {
        let s: Shape = "1x32x128x64".parse().unwrap();
        assert_eq!(s.dims(), &[1, 32, 128, 64]);
        assert_eq!(s.to_string(), "1x32x128x64");
        assert!("1x-2".parse::<Shape>().is_err());
        assert!("".parse::<Shape>().is_err());
        assert!("f64".parse::<DType>().is_err());
        assert_eq!("i8".parse::<DType>().unwrap().bits(), Some(8));
        for &d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
    }
}
