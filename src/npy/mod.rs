//! NumPy `.npy` files in and out, as [`HostTensor`]s: what `dynrt run model.onnx --input
//! NAME=FILE.npy` reads and `--output-dir` writes.
//!
//! Element types: `f32`, `f16`, `f64`, `i64`, `i32`, `i16`, `i8`, `u64`, `u32`, `u16`, `u8` and
//! `bool`, little- or big-endian (converted to little-endian), C or Fortran order (converted to
//! C order), any rank including 0 (a scalar) and zero-length dimensions (an empty
//! `past_key_values` on the first decode step). Written files are little-endian, C order,
//! format version 1.0 — what `numpy.load` reads.
//!
//! Reading parses the format's own grammar and nothing more: the header is a Python dict
//! literal with exactly the keys `'descr'` (a dtype string such as `'<f4'`), `'fortran_order'`
//! (`True` or `False`) and `'shape'` (a tuple of non-negative integers), in any order, with a
//! trailing comma and whitespace padding allowed. The parser makes one pass over the header
//! without recursion, so a hostile header costs time linear in its length, and the length is
//! bounded by [`MAX_HEADER_BYTES`] before anything is read. The shape's byte size is checked
//! for overflow and against the bytes present before anything is allocated, and an error
//! quotes at most a short piece of the header. Bytes after the data are ignored, as NumPy
//! ignores them.
//!
//! Writing is done by `npyz` (a maintained fork of `npy-rs`: every plain dtype, f16 through
//! `half`, no dependency on an array crate). Its reader is not used: it hands the header to a
//! general Python-literal parser, on which a 64-byte file of nested braces never finished.

mod header;

use bytes::Bytes;
use npyz::WriterBuilder;

#[cfg(not(target_arch = "wasm32"))]
use crate::fileio::FileError;
use crate::onnx::{HostTensor, TensorDType, TensorError};
use header::parse_header;

/// Longest `.npy` header read, in bytes: 64 KiB. NumPy writes headers of a few hundred bytes
/// (and its own reader refuses headers over 10,000 bytes unless told otherwise); a longer
/// length field is refused before any of the header is looked at.
pub const MAX_HEADER_BYTES: u64 = 64 << 10;

/// Most dimensions a `.npy` shape may have: 64, NumPy's own limit (`NPY_MAXDIMS`).
pub const MAX_DIMS: usize = 64;

/// At most this many characters of a header are quoted in an error message.
const QUOTE_CHARS: usize = 60;

/// The element types a `.npy` file is read and written with (little- or big-endian on
/// reading; little-endian on writing).
pub const DTYPES: [TensorDType; 12] = [
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
];

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
    /// The file is not a regular file (a FIFO, a device, a directory) or is larger than
    /// [`crate::fileio::MAX_NPY_BYTES`] (native only).
    #[cfg(not(target_arch = "wasm32"))]
    #[error(transparent)]
    File(FileError),
    /// The bytes are not a valid `.npy` file: bad magic, a header outside the format's
    /// grammar, a header cut short.
    #[error("not a valid .npy file: {reason}")]
    Malformed {
        /// What is wrong, with where in the header and at most a short quote of it.
        reason: String,
    },
    /// The format version is not 1.0, 2.0 or 3.0.
    #[error("unsupported .npy format version {major}.{minor}: versions 1.0, 2.0 and 3.0 are read")]
    UnsupportedVersion {
        /// The major version byte.
        major: u8,
        /// The minor version byte.
        minor: u8,
    },
    /// The header length field is larger than [`MAX_HEADER_BYTES`].
    #[error("the .npy header is {header_bytes} bytes long, more than the {max_bytes} bytes read")]
    HeaderTooLong {
        /// The length the file states.
        header_bytes: u64,
        /// The bound, [`MAX_HEADER_BYTES`].
        max_bytes: u64,
    },
    /// The shape has more than [`MAX_DIMS`] dimensions.
    #[error("the .npy shape has more than {max_dims} dimensions")]
    TooManyDims {
        /// The bound, [`MAX_DIMS`].
        max_dims: usize,
    },
    /// The header promises more data than the file holds.
    #[error(
        "the .npy header promises {expected_bytes} bytes of data but the file holds {actual_bytes}"
    )]
    Truncated {
        /// The shape's size in bytes.
        expected_bytes: u64,
        /// The bytes after the header.
        actual_bytes: u64,
    },
    /// The array's dtype has no tensor element type here (structured, object, complex,
    /// strings, datetimes).
    #[error("unsupported .npy dtype `{descr}`: use f32, f16, f64, i64, i32, i16, i8, u64, u32, u16, u8 or bool")]
    UnsupportedDType {
        /// The header's `descr` (at most a short quote of it).
        descr: String,
    },
    /// The tensor cannot be written as `.npy` (strings, sub-byte and float8 types).
    #[error("{dtype} tensors cannot be written as .npy")]
    UnwritableDType {
        /// Its element type.
        dtype: TensorDType,
    },
    /// The shape's size overflows, or the data does not match the shape.
    #[error("{cause}")]
    Tensor {
        /// What is wrong.
        cause: TensorError,
    },
}

#[cfg(not(target_arch = "wasm32"))]
impl From<FileError> for NpyError {
    /// An operating-system error stays [`NpyError::Io`]; the rest is [`NpyError::File`].
    fn from(e: FileError) -> Self {
        match e {
            FileError::Io { path, cause } => NpyError::Io { path, cause },
            other => NpyError::File(other),
        }
    }
}

fn malformed(e: impl std::fmt::Display) -> NpyError {
    NpyError::Malformed {
        reason: e.to_string(),
    }
}

/// At most [`QUOTE_CHARS`] characters of `bytes`, control characters escaped, with `…` when
/// there is more.
fn quote(bytes: &[u8]) -> String {
    // Four bytes per character at most: enough bytes for QUOTE_CHARS characters.
    let head = &bytes[..bytes.len().min(QUOTE_CHARS * 4)];
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    let mut chars = text.chars();
    for c in chars.by_ref().take(QUOTE_CHARS) {
        out.extend(c.escape_debug());
    }
    if chars.next().is_some() || head.len() < bytes.len() {
        out.push('…');
    }
    out
}

/// Reorders a Fortran-order (column-major) buffer of `dims` with `width`-byte elements into
/// C order.
fn fortran_to_c(bytes: Vec<u8>, dims: &[u64], width: usize) -> Vec<u8> {
    // Dimensions of 1 do not change the order: without them the rank is at most log2 of the
    // element count, and the work per element below stays small.
    let dims: Vec<u64> = dims.iter().copied().filter(|&d| d != 1).collect();
    if dims.len() < 2 {
        return bytes;
    }
    let n = bytes.len() / width.max(1);
    let mut out = vec![0u8; bytes.len()];
    let mut index = vec![0u64; dims.len()];
    for c in 0..n {
        // Offset of the C-order multi-index in Fortran order: the first axis varies fastest.
        let mut f = 0u64;
        let mut stride = 1u64;
        for (i, d) in index.iter().zip(&dims) {
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
/// [`NpyError::Malformed`] for a bad magic or a header outside the format's grammar,
/// [`NpyError::UnsupportedVersion`], [`NpyError::HeaderTooLong`] (over
/// [`MAX_HEADER_BYTES`]), [`NpyError::TooManyDims`] (over [`MAX_DIMS`]),
/// [`NpyError::UnsupportedDType`] for dtypes without a tensor element type,
/// [`NpyError::Tensor`] when the shape's size overflows, [`NpyError::Truncated`] when the
/// file holds less data than the shape needs.
pub fn read_npy(bytes: &[u8]) -> Result<HostTensor, NpyError> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if bytes.len() < MAGIC.len() + 2 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(malformed("no \\x93NUMPY magic at the start"));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (length_bytes, header_bytes) = match (major, minor) {
        (1, 0) => (
            2,
            bytes
                .get(8..10)
                .map(|b| u64::from(u16::from_le_bytes([b[0], b[1]]))),
        ),
        (2 | 3, 0) => (
            4,
            bytes
                .get(8..12)
                .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        ),
        _ => return Err(NpyError::UnsupportedVersion { major, minor }),
    };
    let header_bytes =
        header_bytes.ok_or_else(|| malformed("the file ends inside the header length"))?;
    if header_bytes > MAX_HEADER_BYTES {
        return Err(NpyError::HeaderTooLong {
            header_bytes,
            max_bytes: MAX_HEADER_BYTES,
        });
    }
    // Both below 64 KiB + 12: no overflow.
    let start = 8 + length_bytes;
    let end = start + header_bytes as usize;
    let text = bytes.get(start..end).ok_or_else(|| {
        malformed(format!(
            "the file ends inside the header ({} of {end} bytes)",
            bytes.len()
        ))
    })?;
    let header = parse_header(text)?;
    let (_, size) = HostTensor::expected_bytes(header.dtype, &header.shape, ".npy data")
        .map_err(|cause| NpyError::Tensor { cause })?;
    let data = &bytes[end..];
    if size > data.len() as u64 {
        return Err(NpyError::Truncated {
            expected_bytes: size,
            actual_bytes: data.len() as u64,
        });
    }
    // At most the bytes present: fits in usize.
    let mut le = data[..size as usize].to_vec();
    let width = header.dtype.bits().unwrap_or(8) as usize / 8;
    if header.big_endian && width > 1 {
        for element in le.chunks_exact_mut(width) {
            element.reverse();
        }
    }
    if header.dtype == TensorDType::Bool {
        for b in &mut le {
            *b = u8::from(*b != 0);
        }
    }
    if header.fortran_order {
        le = fortran_to_c(le, &header.shape, width);
    }
    HostTensor::from_bytes(header.dtype, header.shape, Bytes::from(le))
        .map_err(|cause| NpyError::Tensor { cause })
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

/// Reads a `.npy` file (native only): a regular file of at most
/// [`crate::fileio::MAX_NPY_BYTES`] bytes.
///
/// # Errors
/// [`NpyError::Io`] when it cannot be read, [`NpyError::File`] when it is not a regular file
/// or is too large, then as [`read_npy`].
#[cfg(not(target_arch = "wasm32"))]
pub fn read_npy_file(path: impl AsRef<std::path::Path>) -> Result<HostTensor, NpyError> {
    let bytes =
        crate::fileio::read_bounded(path.as_ref(), crate::fileio::MAX_NPY_BYTES, "a .npy file")?;
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
mod tests;
