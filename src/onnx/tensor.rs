//! Host tensors: an ONNX element type, dimensions and little-endian bytes.
//!
//! [`HostTensor`] is what the loader makes of an initializer, a `Constant` node's value or a
//! test-data file, and what `.npy` files read into ([`crate::npy`]). Its bytes are laid out
//! like ONNX `raw_data`: little-endian, row-major, packed without padding; 4-bit types hold two
//! elements per byte (the first in the low nibble), 2-bit types four (the first in the lowest
//! bits). The bytes are a [`Bytes`]: cloning a tensor does not copy its data, and a tensor
//! decoded from `raw_data` is a slice of the model buffer it came from.

use bytes::Bytes;
use std::fmt;

use super::proto;

/// Errors about a tensor's element type, dimensions and data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// The ONNX `data_type` code is not one this version of dynrt knows.
    #[error("unknown ONNX element type code {code}")]
    UnknownDType {
        /// The code as stored (`TensorProto.data_type`).
        code: i32,
    },
    /// A dimension is negative.
    #[error("dimension {index} is negative ({value})")]
    NegativeDim {
        /// Position of the dimension.
        index: usize,
        /// Its value.
        value: i64,
    },
    /// The element count or byte size overflows `u64`.
    #[error("{dtype} tensor of dims {dims:?} has a byte size that overflows u64")]
    Overflow {
        /// Element type.
        dtype: TensorDType,
        /// The dimensions.
        dims: Vec<u64>,
    },
    /// The data does not hold exactly the elements the dimensions ask for.
    #[error("{dtype} tensor of dims {dims:?} needs {expected} {unit} but {field} holds {actual}")]
    DataLength {
        /// Element type.
        dtype: TensorDType,
        /// The dimensions.
        dims: Vec<u64>,
        /// Where the data came from (`raw_data`, `float_data`, an external file, ...).
        field: &'static str,
        /// What the dimensions ask for.
        expected: u64,
        /// What is there.
        actual: u64,
        /// `bytes` or `values`.
        unit: &'static str,
    },
    /// String tensors hold their data in `string_data`, never in bytes (and vice versa).
    #[error("{dtype} data cannot be stored in {field}")]
    WrongStorage {
        /// Element type.
        dtype: TensorDType,
        /// The field that held it.
        field: &'static str,
    },
    /// A tensor split into segments (`TensorProto.segment`) is not supported.
    #[error("segmented tensors (TensorProto.segment) are not supported")]
    Segmented,
    /// The operation needs numbers this element type cannot give.
    #[error("{dtype} elements cannot be converted to numbers here")]
    NotNumeric {
        /// Element type.
        dtype: TensorDType,
    },
}

/// An ONNX element type (`TensorProto.DataType`), every one `onnx==1.22.0` defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TensorDType {
    /// 32-bit float (`FLOAT`, 1).
    F32,
    /// 8-bit unsigned (`UINT8`, 2).
    U8,
    /// 8-bit signed (`INT8`, 3).
    I8,
    /// 16-bit unsigned (`UINT16`, 4).
    U16,
    /// 16-bit signed (`INT16`, 5).
    I16,
    /// 32-bit signed (`INT32`, 6).
    I32,
    /// 64-bit signed (`INT64`, 7).
    I64,
    /// Byte strings (`STRING`, 8): variable length, held as a list.
    String,
    /// Boolean (`BOOL`, 9), one byte, 0 or 1.
    Bool,
    /// IEEE half (`FLOAT16`, 10).
    F16,
    /// 64-bit float (`DOUBLE`, 11).
    F64,
    /// 32-bit unsigned (`UINT32`, 12).
    U32,
    /// 64-bit unsigned (`UINT64`, 13).
    U64,
    /// Two f32: real, imaginary (`COMPLEX64`, 14).
    Complex64,
    /// Two f64 (`COMPLEX128`, 15).
    Complex128,
    /// bfloat16 (`BFLOAT16`, 16).
    BF16,
    /// float8 e4m3fn (17).
    F8E4M3FN,
    /// float8 e4m3fnuz (18).
    F8E4M3FNUZ,
    /// float8 e5m2 (19).
    F8E5M2,
    /// float8 e5m2fnuz (20).
    F8E5M2FNUZ,
    /// 4-bit unsigned, two per byte (21).
    U4,
    /// 4-bit signed, two per byte (22).
    I4,
    /// float4 e2m1, two per byte (23).
    F4E2M1,
    /// float8 e8m0 (24).
    F8E8M0,
    /// 2-bit unsigned, four per byte (25).
    U2,
    /// 2-bit signed, four per byte (26).
    I2,
}

const ALL_DTYPES: [TensorDType; 26] = [
    TensorDType::F32,
    TensorDType::U8,
    TensorDType::I8,
    TensorDType::U16,
    TensorDType::I16,
    TensorDType::I32,
    TensorDType::I64,
    TensorDType::String,
    TensorDType::Bool,
    TensorDType::F16,
    TensorDType::F64,
    TensorDType::U32,
    TensorDType::U64,
    TensorDType::Complex64,
    TensorDType::Complex128,
    TensorDType::BF16,
    TensorDType::F8E4M3FN,
    TensorDType::F8E4M3FNUZ,
    TensorDType::F8E5M2,
    TensorDType::F8E5M2FNUZ,
    TensorDType::U4,
    TensorDType::I4,
    TensorDType::F4E2M1,
    TensorDType::F8E8M0,
    TensorDType::U2,
    TensorDType::I2,
];

impl TensorDType {
    /// The type of an ONNX `data_type` / `elem_type` code.
    ///
    /// # Errors
    /// [`TensorError::UnknownDType`] for 0 (`UNDEFINED`) and codes above 26.
    pub fn from_onnx(code: i32) -> Result<Self, TensorError> {
        usize::try_from(code)
            .ok()
            .and_then(|c| c.checked_sub(1))
            .and_then(|i| ALL_DTYPES.get(i).copied())
            .ok_or(TensorError::UnknownDType { code })
    }

    /// The ONNX code (`TensorProto.DataType`).
    pub fn onnx_code(self) -> i32 {
        // ALL_DTYPES is in code order starting at 1.
        ALL_DTYPES
            .iter()
            .position(|&d| d == self)
            .map_or(0, |i| i as i32 + 1)
    }

    /// Width of one element in bits; `None` for [`TensorDType::String`].
    pub fn bits(self) -> Option<u32> {
        use TensorDType::*;
        Some(match self {
            String => return None,
            U2 | I2 => 2,
            U4 | I4 | F4E2M1 => 4,
            U8 | I8 | Bool | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => 8,
            U16 | I16 | F16 | BF16 => 16,
            F32 | I32 | U32 => 32,
            I64 | U64 | F64 | Complex64 => 64,
            Complex128 => 128,
        })
    }

    /// Short lower-case name: `f32`, `i64`, `bool`, `bf16`, `f8e4m3fn`, `string`, ...
    pub fn name(self) -> &'static str {
        use TensorDType::*;
        match self {
            F32 => "f32",
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            String => "string",
            Bool => "bool",
            F16 => "f16",
            F64 => "f64",
            U32 => "u32",
            U64 => "u64",
            Complex64 => "c64",
            Complex128 => "c128",
            BF16 => "bf16",
            F8E4M3FN => "f8e4m3fn",
            F8E4M3FNUZ => "f8e4m3fnuz",
            F8E5M2 => "f8e5m2",
            F8E5M2FNUZ => "f8e5m2fnuz",
            U4 => "u4",
            I4 => "i4",
            F4E2M1 => "f4e2m1",
            F8E8M0 => "f8e8m0",
            U2 => "u2",
            I2 => "i2",
        }
    }

    /// Bytes taken by `num_elements` elements packed as ONNX `raw_data`:
    /// `ceil(num_elements * bits / 8)`; `None` on overflow or for strings.
    pub fn size_bytes(self, num_elements: u64) -> Option<u64> {
        let bits = u64::from(self.bits()?);
        num_elements.checked_mul(bits).map(|b| b.div_ceil(8))
    }
}

impl fmt::Display for TensorDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for TensorDType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A tensor's elements.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// Fixed-width elements, little-endian and packed like ONNX `raw_data`.
    Bytes(Bytes),
    /// [`TensorDType::String`] elements, one byte string each.
    Strings(Vec<Bytes>),
}

impl TensorData {
    /// Size in bytes (for strings, the sum of their lengths).
    pub fn size_bytes(&self) -> u64 {
        match self {
            TensorData::Bytes(b) => b.len() as u64,
            TensorData::Strings(s) => s.iter().map(|s| s.len() as u64).sum(),
        }
    }
}

/// A tensor in host memory: element type, dimensions (outermost first) and data. Immutable;
/// cloning shares the data.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    dtype: TensorDType,
    dims: Vec<u64>,
    num_elements: u64,
    data: TensorData,
}

/// Number of elements of `dims`, checked; a scalar (no dims) has one.
pub(crate) fn checked_num_elements(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Converts ONNX's signed dims (`TensorProto.dims`) to extents.
pub(crate) fn dims_from_onnx(dims: &[i64]) -> Result<Vec<u64>, TensorError> {
    dims.iter()
        .enumerate()
        .map(|(index, &value)| {
            u64::try_from(value).map_err(|_| TensorError::NegativeDim { index, value })
        })
        .collect()
}

impl HostTensor {
    /// A fixed-width tensor from its packed little-endian bytes (not copied).
    ///
    /// # Errors
    /// [`TensorError::WrongStorage`] for strings, [`TensorError::Overflow`] when the size
    /// overflows, [`TensorError::DataLength`] unless `bytes` is exactly the size the dims need.
    pub fn from_bytes(
        dtype: TensorDType,
        dims: Vec<u64>,
        bytes: Bytes,
    ) -> Result<Self, TensorError> {
        Self::from_bytes_field(dtype, dims, bytes, "the data")
    }

    pub(crate) fn from_bytes_field(
        dtype: TensorDType,
        dims: Vec<u64>,
        bytes: Bytes,
        field: &'static str,
    ) -> Result<Self, TensorError> {
        let (num_elements, expected) = Self::expected_bytes(dtype, &dims, field)?;
        if bytes.len() as u64 != expected {
            return Err(TensorError::DataLength {
                dtype,
                dims,
                field,
                expected,
                actual: bytes.len() as u64,
                unit: "bytes",
            });
        }
        Ok(HostTensor {
            dtype,
            dims,
            num_elements,
            data: TensorData::Bytes(bytes),
        })
    }

    /// Element count and packed byte size of a fixed-width tensor.
    pub(crate) fn expected_bytes(
        dtype: TensorDType,
        dims: &[u64],
        field: &'static str,
    ) -> Result<(u64, u64), TensorError> {
        if dtype == TensorDType::String {
            return Err(TensorError::WrongStorage { dtype, field });
        }
        let overflow = || TensorError::Overflow {
            dtype,
            dims: dims.to_vec(),
        };
        let n = checked_num_elements(dims).ok_or_else(overflow)?;
        let size = dtype.size_bytes(n).ok_or_else(overflow)?;
        Ok((n, size))
    }

    /// A string tensor.
    ///
    /// # Errors
    /// [`TensorError::DataLength`] unless there is one string per element.
    pub fn from_strings(dims: Vec<u64>, strings: Vec<Bytes>) -> Result<Self, TensorError> {
        let dtype = TensorDType::String;
        let n = checked_num_elements(&dims).ok_or_else(|| TensorError::Overflow {
            dtype,
            dims: dims.clone(),
        })?;
        if strings.len() as u64 != n {
            return Err(TensorError::DataLength {
                dtype,
                dims,
                field: "string_data",
                expected: n,
                actual: strings.len() as u64,
                unit: "values",
            });
        }
        Ok(HostTensor {
            dtype,
            dims,
            num_elements: n,
            data: TensorData::Strings(strings),
        })
    }

    /// An f32 tensor from values (copied once into little-endian bytes).
    ///
    /// # Errors
    /// As [`HostTensor::from_bytes`]: the values must be exactly what the dims need.
    pub fn from_f32(dims: Vec<u64>, values: &[f32]) -> Result<Self, TensorError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(TensorDType::F32, dims, Bytes::from(bytes))
    }

    /// An i64 tensor from values (copied once into little-endian bytes).
    ///
    /// # Errors
    /// As [`HostTensor::from_bytes`].
    pub fn from_i64(dims: Vec<u64>, values: &[i64]) -> Result<Self, TensorError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(TensorDType::I64, dims, Bytes::from(bytes))
    }

    /// Element type.
    pub fn dtype(&self) -> TensorDType {
        self.dtype
    }

    /// Dimensions, outermost first; empty for a scalar.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Number of elements (1 for a scalar, 0 when a dimension is 0).
    pub fn num_elements(&self) -> u64 {
        self.num_elements
    }

    /// The data.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// The packed little-endian bytes; `None` for a string tensor.
    pub fn bytes(&self) -> Option<&Bytes> {
        match &self.data {
            TensorData::Bytes(b) => Some(b),
            TensorData::Strings(_) => None,
        }
    }

    /// Size of the data in bytes (for strings, the sum of their lengths).
    pub fn size_bytes(&self) -> u64 {
        self.data.size_bytes()
    }

    /// The elements as f64, for comparisons and host-side shape arithmetic: every float and
    /// integer type of at least 8 bits and `bool` (0 or 1). i64/u64 beyond 2^53 lose precision.
    ///
    /// # Errors
    /// [`TensorError::NotNumeric`] for strings, complex, float8, 4-bit and 2-bit types.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>, TensorError> {
        use TensorDType::*;
        let not_numeric = TensorError::NotNumeric { dtype: self.dtype };
        let b = self.bytes().ok_or(not_numeric.clone())?;
        fn chunks<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
            b.chunks_exact(N).map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                a
            })
        }
        Ok(match self.dtype {
            F32 => chunks::<4>(b)
                .map(|c| f32::from_le_bytes(c) as f64)
                .collect(),
            F64 => chunks::<8>(b).map(f64::from_le_bytes).collect(),
            F16 => chunks::<2>(b)
                .map(|c| half::f16::from_le_bytes(c).to_f64())
                .collect(),
            BF16 => chunks::<2>(b)
                .map(|c| half::bf16::from_le_bytes(c).to_f64())
                .collect(),
            I8 => b.iter().map(|&v| v as i8 as f64).collect(),
            U8 => b.iter().map(|&v| v as f64).collect(),
            Bool => b.iter().map(|&v| (v != 0) as u8 as f64).collect(),
            I16 => chunks::<2>(b)
                .map(|c| i16::from_le_bytes(c) as f64)
                .collect(),
            U16 => chunks::<2>(b)
                .map(|c| u16::from_le_bytes(c) as f64)
                .collect(),
            I32 => chunks::<4>(b)
                .map(|c| i32::from_le_bytes(c) as f64)
                .collect(),
            U32 => chunks::<4>(b)
                .map(|c| u32::from_le_bytes(c) as f64)
                .collect(),
            I64 => chunks::<8>(b)
                .map(|c| i64::from_le_bytes(c) as f64)
                .collect(),
            U64 => chunks::<8>(b)
                .map(|c| u64::from_le_bytes(c) as f64)
                .collect(),
            _ => return Err(not_numeric),
        })
    }

    /// The elements of an integer tensor (any signed or unsigned width of at least 8 bits, or
    /// bool) as i64; u64 values above `i64::MAX` wrap.
    ///
    /// # Errors
    /// [`TensorError::NotNumeric`] for every other type.
    pub fn to_i64_vec(&self) -> Result<Vec<i64>, TensorError> {
        use TensorDType::*;
        match self.dtype {
            I64 | U64 => {
                let b = self
                    .bytes()
                    .ok_or(TensorError::NotNumeric { dtype: self.dtype })?;
                Ok(b.chunks_exact(8)
                    .map(|c| {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(c);
                        i64::from_le_bytes(a)
                    })
                    .collect())
            }
            I8 | U8 | I16 | U16 | I32 | U32 | Bool => {
                Ok(self.to_f64_vec()?.into_iter().map(|v| v as i64).collect())
            }
            dtype => Err(TensorError::NotNumeric { dtype }),
        }
    }
}

/// Each value's bytes, concatenated (the narrower types ONNX stores in `int32_data` keep
/// their low bytes).
fn le<T: Copy, const N: usize>(values: &[T], bytes: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * N);
    for &v in values {
        out.extend_from_slice(&bytes(v));
    }
    out
}

/// Decodes a `TensorProto` whose data is inline (`raw_data` or a typed repeated field).
/// External data is the caller's business ([`crate::onnx::external`]).
pub(crate) fn decode_inline(t: &proto::TensorProto) -> Result<HostTensor, TensorError> {
    use TensorDType::*;
    if t.segment.is_some() {
        return Err(TensorError::Segmented);
    }
    let dtype = TensorDType::from_onnx(t.data_type)?;
    let dims = dims_from_onnx(&t.dims)?;
    if let Some(raw) = &t.raw_data {
        // raw_data is a slice of the buffer the model was decoded from: no copy.
        return HostTensor::from_bytes_field(dtype, dims, raw.clone(), "raw_data");
    }
    if dtype == String {
        return HostTensor::from_strings(dims, t.string_data.clone());
    }
    let (n, _) = HostTensor::expected_bytes(dtype, &dims, "typed data")?;
    // The number of values the typed field must hold: packed types store bytes in int32_data,
    // complex types two floats per element.
    let packed = |per_byte: u64| n.div_ceil(per_byte);
    let (field, count, actual, bytes): (&'static str, u64, usize, Vec<u8>) = match dtype {
        F32 => (
            "float_data",
            n,
            t.float_data.len(),
            le(&t.float_data, f32::to_le_bytes),
        ),
        Complex64 => (
            "float_data",
            n.saturating_mul(2),
            t.float_data.len(),
            le(&t.float_data, f32::to_le_bytes),
        ),
        F64 => (
            "double_data",
            n,
            t.double_data.len(),
            le(&t.double_data, f64::to_le_bytes),
        ),
        Complex128 => (
            "double_data",
            n.saturating_mul(2),
            t.double_data.len(),
            le(&t.double_data, f64::to_le_bytes),
        ),
        I64 => (
            "int64_data",
            n,
            t.int64_data.len(),
            le(&t.int64_data, i64::to_le_bytes),
        ),
        U64 => (
            "uint64_data",
            n,
            t.uint64_data.len(),
            le(&t.uint64_data, u64::to_le_bytes),
        ),
        U32 => (
            "uint64_data",
            n,
            t.uint64_data.len(),
            le(&t.uint64_data, |v| (v as u32).to_le_bytes()),
        ),
        I32 => (
            "int32_data",
            n,
            t.int32_data.len(),
            le(&t.int32_data, i32::to_le_bytes),
        ),
        I16 | U16 | F16 | BF16 => (
            "int32_data",
            n,
            t.int32_data.len(),
            le(&t.int32_data, |v| (v as u16).to_le_bytes()),
        ),
        Bool => (
            "int32_data",
            n,
            t.int32_data.len(),
            le(&t.int32_data, |v| [(v != 0) as u8]),
        ),
        I8 | U8 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => (
            "int32_data",
            n,
            t.int32_data.len(),
            le(&t.int32_data, |v| [v as u8]),
        ),
        U4 | I4 | F4E2M1 => (
            "int32_data",
            packed(2),
            t.int32_data.len(),
            le(&t.int32_data, |v| [v as u8]),
        ),
        U2 | I2 => (
            "int32_data",
            packed(4),
            t.int32_data.len(),
            le(&t.int32_data, |v| [v as u8]),
        ),
        String => unreachable!("handled above"),
    };
    let actual = actual as u64;
    if actual != count {
        return Err(TensorError::DataLength {
            dtype,
            dims,
            field,
            expected: count,
            actual,
            unit: "values",
        });
    }
    HostTensor::from_bytes_field(dtype, dims, Bytes::from(bytes), field)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_round_trip() {
        for code in 1..=26 {
            let d = TensorDType::from_onnx(code).unwrap();
            assert_eq!(d.onnx_code(), code);
        }
        assert_eq!(TensorDType::from_onnx(1).unwrap(), TensorDType::F32);
        assert_eq!(TensorDType::from_onnx(7).unwrap(), TensorDType::I64);
        assert_eq!(TensorDType::from_onnx(9).unwrap(), TensorDType::Bool);
        assert_eq!(TensorDType::from_onnx(16).unwrap(), TensorDType::BF16);
        assert_eq!(TensorDType::from_onnx(26).unwrap(), TensorDType::I2);
        for bad in [0, 27, -1, i32::MAX] {
            assert_eq!(
                TensorDType::from_onnx(bad),
                Err(TensorError::UnknownDType { code: bad })
            );
        }
    }

    #[test]
    fn packed_sizes() {
        assert_eq!(TensorDType::I4.size_bytes(5), Some(3));
        assert_eq!(TensorDType::U2.size_bytes(5), Some(2));
        assert_eq!(TensorDType::F32.size_bytes(3), Some(12));
        assert_eq!(TensorDType::String.size_bytes(3), None);
        assert_eq!(TensorDType::F64.size_bytes(u64::MAX), None);
    }

    fn proto(dtype: TensorDType, dims: &[i64]) -> proto::TensorProto {
        proto::TensorProto {
            data_type: dtype.onnx_code(),
            dims: dims.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn typed_fields_become_le_bytes() {
        let mut t = proto(TensorDType::F16, &[2]);
        t.int32_data = vec![0x3c00, 0xc000]; // 1.0, -2.0
        let h = decode_inline(&t).unwrap();
        assert_eq!(h.bytes().unwrap().as_ref(), &[0x00, 0x3c, 0x00, 0xc0]);
        assert_eq!(h.to_f64_vec().unwrap(), vec![1.0, -2.0]);

        let mut t = proto(TensorDType::I64, &[2, 1]);
        t.int64_data = vec![-3, 1 << 40];
        let h = decode_inline(&t).unwrap();
        assert_eq!(h.to_i64_vec().unwrap(), vec![-3, 1 << 40]);

        let mut t = proto(TensorDType::Bool, &[3]);
        t.int32_data = vec![0, 1, 7];
        assert_eq!(
            decode_inline(&t).unwrap().bytes().unwrap().as_ref(),
            &[0, 1, 1]
        );

        let mut t = proto(TensorDType::I4, &[3]);
        t.int32_data = vec![0x21, 0x03];
        assert_eq!(decode_inline(&t).unwrap().size_bytes(), 2);
    }

    #[test]
    fn wrong_counts_are_errors() {
        let mut t = proto(TensorDType::F32, &[2, 2]);
        t.float_data = vec![1.0; 3];
        assert!(matches!(
            decode_inline(&t),
            Err(TensorError::DataLength {
                expected: 4,
                actual: 3,
                field: "float_data",
                ..
            })
        ));
        let mut t = proto(TensorDType::F32, &[2]);
        t.raw_data = Some(Bytes::from_static(&[0; 7]));
        assert!(matches!(
            decode_inline(&t),
            Err(TensorError::DataLength {
                expected: 8,
                actual: 7,
                field: "raw_data",
                ..
            })
        ));
        let t = proto(TensorDType::F32, &[2, -1]);
        assert_eq!(
            decode_inline(&t),
            Err(TensorError::NegativeDim {
                index: 1,
                value: -1
            })
        );
        let t = proto(TensorDType::F32, &[i64::MAX, i64::MAX]);
        assert!(matches!(
            decode_inline(&t),
            Err(TensorError::Overflow { .. })
        ));
        let mut t = proto(TensorDType::F32, &[0, 5]);
        t.raw_data = Some(Bytes::new());
        assert_eq!(decode_inline(&t).unwrap().num_elements(), 0);
        let mut t = proto(TensorDType::F32, &[1]);
        t.segment = Some(proto::Segment { begin: 0, end: 1 });
        assert_eq!(decode_inline(&t), Err(TensorError::Segmented));
    }
}
