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
    #[error("unknown dtype `{name}`: expected one of f32, f16, i32, u32, i8, u8")]
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

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
    /// 8-bit signed integer.
    I8,
    /// 8-bit unsigned integer.
    U8,
}

impl DType {
    /// Width of one element in bits.
    pub fn bits(self) -> u32 {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 => 16,
            DType::I8 | DType::U8 => 8,
        }
    }

    /// Lower-case name (`f32`, ...), as used in traces and on the CLI.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I8 => "i8",
            DType::U8 => "u8",
        }
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
        Ok(match s.trim() {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "i32" => DType::I32,
            "u32" => DType::U32,
            "i8" => DType::I8,
            "u8" => DType::U8,
            other => {
                return Err(ShapeError::UnknownDType {
                    name: other.to_string(),
                })
            }
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

    /// Bytes taken by this shape with elements of `dtype`.
    ///
    /// # Errors
    /// [`ShapeError::Overflow`] when the size does not fit in `u64`.
    pub fn size_bytes(&self, dtype: DType) -> Result<u64, ShapeError> {
        self.size_bytes_for_bits(dtype.bits())
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
    /// Parses `1x32x128x64`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
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
    fn shape_text_round_trips() {
        let s: Shape = "1x32x128x64".parse().unwrap();
        assert_eq!(s.dims(), &[1, 32, 128, 64]);
        assert_eq!(s.to_string(), "1x32x128x64");
        assert!("1x-2".parse::<Shape>().is_err());
        assert!("".parse::<Shape>().is_err());
        assert!("f64".parse::<DType>().is_err());
        assert_eq!("i8".parse::<DType>().unwrap().bits(), 8);
    }
}
