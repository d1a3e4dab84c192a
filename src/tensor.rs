//! Tensor bytes on the host: typed little-endian bytes ([`HostTensor`]), the bytes of a
//! constant that may be a range of a shared backing ([`ConstData`]), and the conversions
//! between bytes and values (f16/bf16 widening, block dequantization).
//!
//! Device-free. Integers keep their real bits everywhere: an `i64` constant is 8 bytes per
//! element, a `q4_1` weight stays 20 bytes per block of 32, and nothing here expands a tensor
//! unless a caller asks for its values ([`decode_f32`], [`decode_i64`]).

use crate::shape::{DType, Shape, ShapeError};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// Errors about tensor bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// The byte length does not match the shape and dtype.
    #[error("{what}: {got} bytes given, shape {shape} of {dtype} needs {expected}")]
    Length {
        /// What the bytes are for (a label).
        what: String,
        /// The shape.
        shape: Shape,
        /// The element type.
        dtype: DType,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// A range of a shared backing reaches past its end.
    #[error("range {start}..{end} is outside a backing of {backing_bytes} bytes")]
    Range {
        /// Start of the range.
        start: usize,
        /// End of the range.
        end: usize,
        /// Length of the backing.
        backing_bytes: usize,
    },
    /// A byte size overflowed.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// Values of this dtype cannot be converted the way asked (floats as integers, ...).
    #[error("{dtype} values cannot be read as {wanted}")]
    Conversion {
        /// The tensor's element type.
        dtype: DType,
        /// What was asked for.
        wanted: &'static str,
    },
}

/// Bytes some loader shares between constants: a whole file in memory, a memory map. Every
/// constant of a model can point into one backing; nothing is copied.
pub type Backing = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// The little-endian bytes of a constant: a range of a shared [`Backing`]. Cloning shares the
/// backing (no copy); the bytes are read where they are when the network uploads them, in
/// bounded chunks.
#[derive(Clone)]
pub struct ConstData {
    backing: Backing,
    start: usize,
    end: usize,
}

impl ConstData {
    /// Owns `bytes` (a backing of its own).
    pub fn from_vec(bytes: Vec<u8>) -> ConstData {
        let end = bytes.len();
        ConstData {
            backing: Arc::new(bytes),
            start: 0,
            end,
        }
    }

    /// `range` of a shared `backing` (a model file in memory or mapped): no copy.
    ///
    /// # Errors
    /// [`TensorError::Range`] when the range is reversed or reaches past the backing.
    pub fn slice(backing: Backing, range: Range<usize>) -> Result<ConstData, TensorError> {
        let len = (*backing).as_ref().len();
        if range.start > range.end || range.end > len {
            return Err(TensorError::Range {
                start: range.start,
                end: range.end,
                backing_bytes: len,
            });
        }
        Ok(ConstData {
            backing,
            start: range.start,
            end: range.end,
        })
    }

    /// f32 values as little-endian bytes.
    pub fn from_f32(values: &[f32]) -> ConstData {
        ConstData::from_vec(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// i32 values as little-endian bytes.
    pub fn from_i32(values: &[i32]) -> ConstData {
        ConstData::from_vec(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// i64 values as little-endian bytes.
    pub fn from_i64(values: &[i64]) -> ConstData {
        ConstData::from_vec(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &(*self.backing).as_ref()[self.start..self.end]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// These bytes followed by `next`'s: one range of the shared backing when `next` starts
    /// where these end in the same backing (no copy: two tensors stored one after the other
    /// in a model file), else a copy of both.
    pub fn joined(&self, next: &ConstData) -> ConstData {
        if Arc::ptr_eq(&self.backing, &next.backing) && self.end == next.start {
            return ConstData {
                backing: self.backing.clone(),
                start: self.start,
                end: next.end,
            };
        }
        let mut bytes = Vec::with_capacity(self.len() + next.len());
        bytes.extend_from_slice(self.bytes());
        bytes.extend_from_slice(next.bytes());
        ConstData::from_vec(bytes)
    }
}

impl fmt::Debug for ConstData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConstData({} bytes)", self.len())
    }
}

impl PartialEq for ConstData {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

/// A tensor on the host: shape, element type, row-major little-endian bytes
/// (`shape.size_bytes(dtype)` of them).
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Shape.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
    /// Row-major little-endian bytes.
    pub bytes: Vec<u8>,
}

impl HostTensor {
    /// An f32 tensor.
    pub fn f32(shape: Shape, data: &[f32]) -> Self {
        HostTensor {
            shape,
            dtype: DType::F32,
            bytes: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// An i32 tensor.
    pub fn i32(shape: Shape, data: &[i32]) -> Self {
        HostTensor {
            shape,
            dtype: DType::I32,
            bytes: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// A tensor of `dtype` from values carried as f32 (integers exact below 2^24), the
    /// convenience form of the reference and the tests.
    ///
    /// # Errors
    /// [`TensorError::Conversion`] for block-quantized types (they are loaded as bytes, never
    /// encoded from values).
    pub fn from_f32_values(
        shape: Shape,
        dtype: DType,
        values: &[f32],
    ) -> Result<HostTensor, TensorError> {
        let bytes = if dtype.is_int() {
            encode_i64(dtype, &values.iter().map(|&v| v as i64).collect::<Vec<_>>())?
        } else {
            encode_f32(dtype, values)?
        };
        Ok(HostTensor {
            shape,
            dtype,
            bytes,
        })
    }

    /// The values as f32 (integers converted, exact below 2^24; f16/bf16 widened; blocks
    /// dequantized).
    pub fn to_f32(&self) -> Vec<f32> {
        if self.dtype.is_int() {
            decode_i64(self.dtype, &self.bytes)
                .map(|v| v.into_iter().map(|x| x as f32).collect())
                .unwrap_or_default()
        } else {
            decode_f32(self.dtype, &self.bytes).unwrap_or_default()
        }
    }

    /// Checks that the byte length matches the shape.
    ///
    /// # Errors
    /// [`TensorError::Length`] naming `what`; [`TensorError::Shape`] on overflow.
    pub fn check(&self, what: &str) -> Result<(), TensorError> {
        check_len(what, &self.shape, self.dtype, self.bytes.len())
    }
}

/// Checks that `len` bytes hold `shape` of `dtype`.
///
/// # Errors
/// [`TensorError::Length`] naming `what`; [`TensorError::Shape`] on overflow.
pub fn check_len(what: &str, shape: &Shape, dtype: DType, len: usize) -> Result<(), TensorError> {
    let expected = shape.size_bytes(dtype)?;
    if expected != len as u64 {
        return Err(TensorError::Length {
            what: what.to_string(),
            shape: shape.clone(),
            dtype,
            expected,
            got: len as u64,
        });
    }
    Ok(())
}

/// Float values of float bytes: f32 as is, f16/bf16 widened exactly, block formats
/// dequantized by their [`crate::formats`] decoder (every element of every whole block; a
/// partial last block yields its whole block of values).
///
/// # Errors
/// [`TensorError::Conversion`] for integer types.
pub fn decode_f32(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>, TensorError> {
    let Some(format) = crate::formats::of_dtype(dtype) else {
        return Err(TensorError::Conversion {
            dtype,
            wanted: "floats",
        });
    };
    let (bl, bb) = (format.block_elements as usize, format.block_bytes as usize);
    let mut out = vec![0f32; bytes.len() / bb * bl];
    for (block, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
        (format.decode)(block, o);
    }
    Ok(out)
}

/// Integer values of integer bytes (bool as 0/1), sign- or zero-extended to i64.
///
/// # Errors
/// [`TensorError::Conversion`] for float types.
pub fn decode_i64(dtype: DType, bytes: &[u8]) -> Result<Vec<i64>, TensorError> {
    let w4 = || bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
    Ok(match dtype {
        DType::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        DType::I32 => w4().map(|w| i64::from(i32::from_le_bytes(w))).collect(),
        DType::U32 => w4().map(|w| i64::from(u32::from_le_bytes(w))).collect(),
        DType::I8 => bytes.iter().map(|&b| i64::from(b as i8)).collect(),
        DType::U8 | DType::Bool => bytes.iter().map(|&b| i64::from(b)).collect(),
        _ => {
            return Err(TensorError::Conversion {
                dtype,
                wanted: "integers",
            })
        }
    })
}

/// Bytes of float values in a float type (f16/bf16 rounded to nearest even).
///
/// # Errors
/// [`TensorError::Conversion`] for integer and block types.
pub fn encode_f32(dtype: DType, values: &[f32]) -> Result<Vec<u8>, TensorError> {
    Ok(match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        _ => {
            return Err(TensorError::Conversion {
                dtype,
                wanted: "encoded from floats",
            })
        }
    })
}

/// Bytes of integer values in an integer type (truncated to its width, as a cast does).
///
/// # Errors
/// [`TensorError::Conversion`] for float types.
pub fn encode_i64(dtype: DType, values: &[i64]) -> Result<Vec<u8>, TensorError> {
    Ok(match dtype {
        DType::I64 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::I32 | DType::U32 => values
            .iter()
            .flat_map(|&v| (v as u32).to_le_bytes())
            .collect(),
        DType::I8 | DType::U8 => values.iter().map(|&v| v as u8).collect(),
        DType::Bool => values.iter().map(|&v| u8::from(v != 0)).collect(),
        _ => {
            return Err(TensorError::Conversion {
                dtype,
                wanted: "encoded from integers",
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_ranges_join_without_a_copy() {
        let backing: Backing = Arc::new((0u8..64).collect::<Vec<u8>>());
        let a = ConstData::slice(backing.clone(), 8..16).unwrap();
        let b = ConstData::slice(backing.clone(), 16..20).unwrap();
        let ab = a.joined(&b);
        assert_eq!(ab.bytes(), &(8u8..20).collect::<Vec<u8>>()[..]);
        assert_eq!(ab.bytes().as_ptr(), a.bytes().as_ptr());
        // Not adjacent, or another backing: a copy of both.
        let c = ConstData::slice(backing, 24..28).unwrap();
        let ac = a.joined(&c);
        assert_eq!(ac.len(), 12);
        assert_eq!(&ac.bytes()[8..], c.bytes());
        assert_ne!(ac.bytes().as_ptr(), a.bytes().as_ptr());
        let own = ConstData::from_vec(vec![1, 2]).joined(&ConstData::from_vec(vec![3]));
        assert_eq!(own.bytes(), [1, 2, 3]);
    }

    #[test]
    fn const_data_shares_its_backing_and_checks_ranges() {
        let backing: Backing = Arc::new((0u8..64).collect::<Vec<u8>>());
        let a = ConstData::slice(backing.clone(), 8..16).unwrap();
        assert_eq!(a.bytes(), &(8u8..16).collect::<Vec<u8>>()[..]);
        assert_eq!(a.len(), 8);
        assert!(matches!(
            ConstData::slice(backing.clone(), 60..65),
            Err(TensorError::Range { .. })
        ));
        assert_eq!(
            Arc::strong_count(&backing),
            2,
            "the slice shares, not copies"
        );
        assert_eq!(ConstData::from_i64(&[-1]).bytes(), &[0xFF; 8]);
    }

    #[test]
    fn integers_keep_their_bits_and_halves_widen() {
        let big = 1i64 << 40;
        let b = encode_i64(DType::I64, &[big, -3]).unwrap();
        assert_eq!(decode_i64(DType::I64, &b).unwrap(), vec![big, -3]);
        assert_eq!(decode_i64(DType::I8, &[0xFF]).unwrap(), vec![-1]);
        assert_eq!(decode_i64(DType::U8, &[0xFF]).unwrap(), vec![255]);
        assert!(decode_i64(DType::F32, &[0; 4]).is_err());
        let h = encode_f32(DType::F16, &[1.5, -2.0]).unwrap();
        assert_eq!(h.len(), 4);
        assert_eq!(decode_f32(DType::F16, &h).unwrap(), vec![1.5, -2.0]);
        let bf = encode_f32(DType::BF16, &[3.0]).unwrap();
        assert_eq!(decode_f32(DType::BF16, &bf).unwrap(), vec![3.0]);
        assert!(encode_f32(DType::I32, &[1.0]).is_err());
    }

    #[test]
    fn blocks_dequantize_with_the_ggml_layout() {
        // Q8_0: scale 0.5, q = -4..28.
        let mut q8 = half::f16::from_f32(0.5).to_bits().to_le_bytes().to_vec();
        q8.extend((0..32).map(|i| (i as i8 - 4) as u8));
        let v = decode_f32(DType::Q8_0, &q8).unwrap();
        assert_eq!(v.len(), 32);
        assert_eq!((v[0], v[31]), (-2.0, 13.5));
        // Q4_1: scale 2, min -1; byte i holds element i (low) and i + 16 (high).
        let mut q4 = half::f16::from_f32(2.0).to_bits().to_le_bytes().to_vec();
        q4.extend(half::f16::from_f32(-1.0).to_bits().to_le_bytes());
        q4.extend((0..16u8).map(|i| i | (15 - i) << 4));
        let v = decode_f32(DType::Q4_1, &q4).unwrap();
        assert_eq!((v[0], v[15], v[16], v[31]), (-1.0, 29.0, 29.0, -1.0));
        assert_eq!(
            Shape::new(vec![32]).size_bytes(DType::Q4_1).unwrap(),
            q4.len() as u64
        );
    }

    #[test]
    fn host_tensors_check_their_length() {
        let t = HostTensor::from_f32_values(Shape::new(vec![2]), DType::I64, &[3.0, -1.0]).unwrap();
        assert_eq!(t.bytes.len(), 16);
        t.check("t").unwrap();
        assert_eq!(t.to_f32(), vec![3.0, -1.0]);
        let bad = HostTensor {
            bytes: vec![0; 3],
            ..t
        };
        assert!(matches!(bad.check("x"), Err(TensorError::Length { .. })));
    }
}
