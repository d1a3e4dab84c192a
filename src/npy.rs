//! NumPy `.npy` files in and out, as [`HostTensor`]s: what `dynrt run model.onnx --input
//! NAME=FILE.npy` reads and `--output-dir` writes.
//!
//! Element types: `f32`, `f16`, `f64`, `i64`, `i32`, `i16`, `i8`, `u64`, `u32`, `u16`, `u8` and
//! `bool`, little- or big-endian (converted to little-endian), C or Fortran order (converted to
//! C order), any rank including 0 (a scalar) and zero-length dimensions (an empty
//! `past_key_values` on the first decode step). Written files are little-endian, C order,
//! format version 1.0 — what `numpy.load` reads.
//!
//! The format is handled by `npyz` (a maintained fork of `npy-rs`: header parsing with a real
//! Python-literal parser, every plain dtype, f16 through `half`, no dependency on an array
//! crate). `ndarray-npy` was the alternative; it needs `ndarray` and has no f16.

use bytes::Bytes;
use npyz::{DType, Order, TypeChar, WriterBuilder};

use crate::onnx::{HostTensor, TensorDType, TensorError};

/// Errors reading or writing `.npy` data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NpyError {
    /// The file could not be read or written (native only).
    #[error("{path}: {cause}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// The bytes are not a valid `.npy` file (bad magic, malformed header, truncated data).
    #[error("not a valid .npy file: {reason}")]
    Malformed {
        /// What npyz reported.
        reason: String,
    },
    /// The array's dtype has no tensor element type here (structured, object, complex,
    /// strings, datetimes).
    #[error("unsupported .npy dtype `{descr}`: use f32, f16, f64, i64, i32, i16, i8, u64, u32, u16, u8 or bool")]
    UnsupportedDType {
        /// The header's `descr`.
        descr: String,
    },
    /// The tensor cannot be written as `.npy` (strings, sub-byte and float8 types).
    #[error("{dtype} tensors cannot be written as .npy")]
    UnwritableDType {
        /// Its element type.
        dtype: TensorDType,
    },
    /// The data does not match the shape.
    #[error("{cause}")]
    Tensor {
        /// What is wrong.
        cause: TensorError,
    },
}

fn malformed(e: impl std::fmt::Display) -> NpyError {
    NpyError::Malformed {
        reason: e.to_string(),
    }
}

/// Reads `T` elements (npyz converts the byte order) into little-endian bytes.
fn read_le<T, const N: usize>(
    npy: npyz::NpyFile<&[u8]>,
    to_le: impl Fn(T) -> [u8; N],
) -> Result<Vec<u8>, NpyError>
where
    T: npyz::Deserialize,
{
    let values = npy.into_vec::<T>().map_err(malformed)?;
    Ok(values.into_iter().flat_map(to_le).collect())
}

/// Reorders a Fortran-order (column-major) buffer of `dims` with `width`-byte elements into
/// C order.
fn fortran_to_c(bytes: &[u8], dims: &[u64], width: usize) -> Vec<u8> {
    let n = bytes.len() / width.max(1);
    let mut out = vec![0u8; bytes.len()];
    let mut index = vec![0u64; dims.len()];
    for c in 0..n {
        // Offset of the C-order multi-index in Fortran order: the first axis varies fastest.
        let mut f = 0u64;
        let mut stride = 1u64;
        for (i, d) in index.iter().zip(dims) {
            f += i * stride;
            stride *= d;
        }
        let f = f as usize;
        out[c * width..(c + 1) * width].copy_from_slice(&bytes[f * width..(f + 1) * width]);
        for k in (0..dims.len()).rev() {
            index[k] += 1;
            if index[k] < dims[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

/// Reads a `.npy` file's bytes into a tensor (one copy into little-endian C-order bytes).
///
/// # Errors
/// [`NpyError::Malformed`] for a bad header or truncated data, [`NpyError::UnsupportedDType`]
/// for dtypes without a tensor element type, [`NpyError::Tensor`] when the shape's size
/// overflows.
pub fn read_npy(bytes: &[u8]) -> Result<HostTensor, NpyError> {
    let npy = npyz::NpyFile::new(bytes).map_err(malformed)?;
    let descr = npy.header().dtype().descr();
    let unsupported = || NpyError::UnsupportedDType {
        descr: descr.clone(),
    };
    let DType::Plain(ts) = npy.dtype() else {
        return Err(unsupported());
    };
    let dims = npy.shape().to_vec();
    let fortran = npy.order() == Order::Fortran;
    // Check the size before reading, so a header that promises more than the file holds is
    // an error rather than a large allocation.
    let dtype = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 4) => TensorDType::F32,
        (TypeChar::Float, 2) => TensorDType::F16,
        (TypeChar::Float, 8) => TensorDType::F64,
        (TypeChar::Int, 8) => TensorDType::I64,
        (TypeChar::Int, 4) => TensorDType::I32,
        (TypeChar::Int, 2) => TensorDType::I16,
        (TypeChar::Int, 1) => TensorDType::I8,
        (TypeChar::Uint, 8) => TensorDType::U64,
        (TypeChar::Uint, 4) => TensorDType::U32,
        (TypeChar::Uint, 2) => TensorDType::U16,
        (TypeChar::Uint, 1) => TensorDType::U8,
        (TypeChar::Bool, 1) => TensorDType::Bool,
        _ => return Err(unsupported()),
    };
    let (_, size) = HostTensor::expected_bytes(dtype, &dims, ".npy data")
        .map_err(|cause| NpyError::Tensor { cause })?;
    let data_bytes = bytes.len() as u64;
    if size > data_bytes {
        return Err(malformed(format!(
            "the header promises {size} bytes of data but the file has {data_bytes} bytes"
        )));
    }
    let le = match dtype {
        TensorDType::F32 => read_le(npy, f32::to_le_bytes)?,
        TensorDType::F16 => read_le(npy, half::f16::to_le_bytes)?,
        TensorDType::F64 => read_le(npy, f64::to_le_bytes)?,
        TensorDType::I64 => read_le(npy, i64::to_le_bytes)?,
        TensorDType::I32 => read_le(npy, i32::to_le_bytes)?,
        TensorDType::I16 => read_le(npy, i16::to_le_bytes)?,
        TensorDType::I8 => read_le(npy, i8::to_le_bytes)?,
        TensorDType::U64 => read_le(npy, u64::to_le_bytes)?,
        TensorDType::U32 => read_le(npy, u32::to_le_bytes)?,
        TensorDType::U16 => read_le(npy, u16::to_le_bytes)?,
        TensorDType::U8 => read_le(npy, u8::to_le_bytes)?,
        TensorDType::Bool => read_le(npy, |b: bool| [b as u8])?,
        _ => return Err(unsupported()),
    };
    let le = if fortran && dims.len() > 1 {
        let width = dtype.bits().unwrap_or(8) as usize / 8;
        fortran_to_c(&le, &dims, width)
    } else {
        le
    };
    HostTensor::from_bytes(dtype, dims, Bytes::from(le)).map_err(|cause| NpyError::Tensor { cause })
}

/// Writes `T` elements decoded from little-endian bytes.
fn write_le<T, const N: usize>(
    dims: &[u64],
    bytes: &[u8],
    from_le: impl Fn([u8; N]) -> T,
) -> Result<Vec<u8>, NpyError>
where
    T: npyz::AutoSerialize,
{
    let mut out = Vec::new();
    {
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(dims)
            .writer(&mut out)
            .begin_nd()
            .map_err(malformed)?;
        for c in bytes.chunks_exact(N) {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            w.push(&from_le(a)).map_err(malformed)?;
        }
        w.finish().map_err(malformed)?;
    }
    Ok(out)
}

/// The `.npy` bytes of a tensor (little-endian, C order).
///
/// # Errors
/// [`NpyError::UnwritableDType`] for strings, complex, bf16, float8 and sub-byte types.
pub fn write_npy(tensor: &HostTensor) -> Result<Vec<u8>, NpyError> {
    let dims = tensor.dims();
    let unwritable = || NpyError::UnwritableDType {
        dtype: tensor.dtype(),
    };
    let b = tensor.bytes().ok_or_else(unwritable)?;
    match tensor.dtype() {
        TensorDType::F32 => write_le(dims, b, f32::from_le_bytes),
        TensorDType::F16 => write_le(dims, b, half::f16::from_le_bytes),
        TensorDType::F64 => write_le(dims, b, f64::from_le_bytes),
        TensorDType::I64 => write_le(dims, b, i64::from_le_bytes),
        TensorDType::I32 => write_le(dims, b, i32::from_le_bytes),
        TensorDType::I16 => write_le(dims, b, i16::from_le_bytes),
        TensorDType::I8 => write_le(dims, b, i8::from_le_bytes),
        TensorDType::U64 => write_le(dims, b, u64::from_le_bytes),
        TensorDType::U32 => write_le(dims, b, u32::from_le_bytes),
        TensorDType::U16 => write_le(dims, b, u16::from_le_bytes),
        TensorDType::U8 => write_le(dims, b, u8::from_le_bytes),
        TensorDType::Bool => write_le(dims, b, |[v]: [u8; 1]| v != 0),
        _ => Err(unwritable()),
    }
}

/// Reads a `.npy` file (native only).
///
/// # Errors
/// [`NpyError::Io`], then as [`read_npy`].
#[cfg(not(target_arch = "wasm32"))]
pub fn read_npy_file(path: impl AsRef<std::path::Path>) -> Result<HostTensor, NpyError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|cause| NpyError::Io {
        path: path.display().to_string(),
        cause,
    })?;
    read_npy(&bytes)
}

/// Writes a tensor as a `.npy` file (native only).
///
/// # Errors
/// As [`write_npy`], then [`NpyError::Io`].
#[cfg(not(target_arch = "wasm32"))]
pub fn write_npy_file(
    path: impl AsRef<std::path::Path>,
    tensor: &HostTensor,
) -> Result<(), NpyError> {
    let path = path.as_ref();
    let bytes = write_npy(tensor)?;
    std::fs::write(path, bytes).map_err(|cause| NpyError::Io {
        path: path.display().to_string(),
        cause,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_writable_type_and_shape() {
        let shapes: [&[u64]; 5] = [&[], &[3], &[2, 3], &[1, 3, 0, 4], &[2, 1, 2]];
        for dtype in [
            TensorDType::F32,
            TensorDType::F16,
            TensorDType::F64,
            TensorDType::I64,
            TensorDType::I32,
            TensorDType::I16,
            TensorDType::I8,
            TensorDType::U64,
            TensorDType::U32,
            TensorDType::U16,
            TensorDType::U8,
            TensorDType::Bool,
        ] {
            for dims in shapes {
                let n: u64 = dims.iter().product();
                let width = dtype.bits().unwrap() as usize / 8;
                let bytes: Vec<u8> = (0..n as usize * width)
                    .map(|i| {
                        if dtype == TensorDType::Bool {
                            (i % 2) as u8
                        } else {
                            (i * 37 % 251) as u8
                        }
                    })
                    .map(|v| {
                        if matches!(
                            dtype,
                            TensorDType::F16 | TensorDType::F32 | TensorDType::F64
                        ) {
                            v & 0x3f
                        } else {
                            v
                        }
                    })
                    .collect();
                let t = HostTensor::from_bytes(dtype, dims.to_vec(), Bytes::from(bytes)).unwrap();
                let file = write_npy(&t).unwrap();
                let back = read_npy(&file).unwrap();
                assert_eq!(back, t, "{dtype} {dims:?}");
            }
        }
    }

    #[test]
    fn fortran_order_becomes_c_order() {
        // A 2x3 f32 array [[0,1,2],[3,4,5]] stored column-major: 0 3 1 4 2 5.
        let header = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
        let mut file = b"\x93NUMPY\x01\x00".to_vec();
        let pad = 64 - (10 + header.len() + 1) % 64;
        let text = format!("{header}{}\n", " ".repeat(pad));
        file.extend_from_slice(&(text.len() as u16).to_le_bytes());
        file.extend_from_slice(text.as_bytes());
        for v in [0f32, 3., 1., 4., 2., 5.] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        let t = read_npy(&file).unwrap();
        assert_eq!(t.dims(), &[2, 3]);
        assert_eq!(t.to_f64_vec().unwrap(), vec![0., 1., 2., 3., 4., 5.]);
    }

    #[test]
    fn bad_files_are_typed_errors() {
        assert!(matches!(
            read_npy(b"not numpy"),
            Err(NpyError::Malformed { .. })
        ));
        let t = HostTensor::from_f32(vec![4], &[1., 2., 3., 4.]).unwrap();
        let file = write_npy(&t).unwrap();
        for cut in [0, 5, 20, file.len() - 1] {
            assert!(read_npy(&file[..cut]).is_err(), "cut at {cut}");
        }
        let complex = "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }";
        let mut f = b"\x93NUMPY\x01\x00".to_vec();
        let text = format!(
            "{complex}{}\n",
            " ".repeat(64 - (10 + complex.len() + 1) % 64)
        );
        f.extend_from_slice(&(text.len() as u16).to_le_bytes());
        f.extend_from_slice(text.as_bytes());
        f.extend_from_slice(&[0; 8]);
        assert!(matches!(
            read_npy(&f),
            Err(NpyError::UnsupportedDType { .. })
        ));
        let s = HostTensor::from_strings(vec![1], vec![Bytes::from_static(b"x")]).unwrap();
        assert!(matches!(
            write_npy(&s),
            Err(NpyError::UnwritableDType { .. })
        ));
    }
}
