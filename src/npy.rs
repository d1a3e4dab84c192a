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

use bytes::Bytes;
use npyz::WriterBuilder;

#[cfg(not(target_arch = "wasm32"))]
use crate::fileio::FileError;
use crate::onnx::{HostTensor, TensorDType, TensorError};

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

/// A `.npy` header's three keys.
#[derive(Debug, PartialEq)]
struct Header {
    dtype: TensorDType,
    big_endian: bool,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// One forward pass over the header text.
struct Cursor<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A [`NpyError::Malformed`] saying what was expected here and quoting what is here.
    fn expected(&self, what: &str) -> NpyError {
        let rest = &self.text[self.at.min(self.text.len())..];
        let found = if rest.is_empty() {
            "the end of the header".to_string()
        } else {
            format!("`{}`", quote(rest))
        };
        malformed(format!(
            "header byte {}: expected {what}, found {found}",
            self.at
        ))
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// A quoted string without escapes (`'...'` or `"..."`), its contents.
    fn string(&mut self, what: &str) -> Result<&'a [u8], NpyError> {
        let Some(q @ (b'\'' | b'"')) = self.peek() else {
            return Err(self.expected(what));
        };
        let start = self.at + 1;
        let Some(len) = self.text[start..]
            .iter()
            .position(|&b| b == q || b == b'\\' || b == b'\n')
        else {
            return Err(self.expected("a string closed on its line"));
        };
        let end = start + len;
        if self.text[end] != q {
            self.at = end;
            return Err(self.expected("the string's closing quote (escapes are not read)"));
        }
        self.at = end + 1;
        Ok(&self.text[start..end])
    }

    /// A run of ASCII letters.
    fn word(&mut self) -> &'a [u8] {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_alphabetic()) {
            self.at += 1;
        }
        &self.text[start..self.at]
    }

    /// A non-negative decimal integer (a trailing `L`, as Python 2 wrote longs, is allowed).
    fn dim(&mut self) -> Result<u64, NpyError> {
        let start = self.at;
        let mut value = 0u64;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(d - b'0')))
                .ok_or_else(|| {
                    self.at = start;
                    self.expected("a dimension below 2^64")
                })?;
            self.at += 1;
        }
        if self.at == start {
            return Err(self.expected("a non-negative integer dimension"));
        }
        let _ = self.eat(b'L');
        Ok(value)
    }

    /// `(d0, d1, ...)`, trailing comma allowed; `()` for a scalar.
    fn shape(&mut self) -> Result<Vec<u64>, NpyError> {
        if !self.eat(b'(') {
            return Err(self.expected("a shape tuple `(...)`"));
        }
        let mut dims = Vec::new();
        loop {
            self.skip_space();
            if self.eat(b')') {
                return Ok(dims);
            }
            if dims.len() == MAX_DIMS {
                return Err(NpyError::TooManyDims { max_dims: MAX_DIMS });
            }
            dims.push(self.dim()?);
            self.skip_space();
            if self.eat(b')') {
                return Ok(dims);
            }
            if !self.eat(b',') {
                return Err(self.expected("`,` or `)` in the shape"));
            }
        }
    }
}

/// The element type and byte order of a `descr` such as `<f4`, `>i8`, `|u1` or `|b1`.
fn dtype_of(descr: &[u8]) -> Option<(TensorDType, bool)> {
    let (order, code) = match descr.first() {
        Some(&o @ (b'<' | b'>' | b'|' | b'=')) => (o, &descr[1..]),
        _ => (b'=', descr),
    };
    let dtype = match code {
        b"f2" => TensorDType::F16,
        b"f4" => TensorDType::F32,
        b"f8" => TensorDType::F64,
        b"i1" => TensorDType::I8,
        b"i2" => TensorDType::I16,
        b"i4" => TensorDType::I32,
        b"i8" => TensorDType::I64,
        b"u1" => TensorDType::U8,
        b"u2" => TensorDType::U16,
        b"u4" => TensorDType::U32,
        b"u8" => TensorDType::U64,
        b"b1" | b"?" => TensorDType::Bool,
        _ => return None,
    };
    let big_endian = match order {
        b'>' => true,
        b'<' => false,
        // `|` (no byte order) and `=` (native).
        _ => cfg!(target_endian = "big"),
    };
    Some((dtype, big_endian))
}

/// Parses the header text: a dict literal with exactly `descr`, `fortran_order` and `shape`.
fn parse_header(text: &[u8]) -> Result<Header, NpyError> {
    let mut c = Cursor { text, at: 0 };
    let mut descr: Option<(TensorDType, bool)> = None;
    let mut fortran_order = None;
    let mut shape = None;
    c.skip_space();
    if !c.eat(b'{') {
        return Err(c.expected("`{`"));
    }
    loop {
        c.skip_space();
        if c.eat(b'}') {
            break;
        }
        let key_at = c.at;
        let key = c.string("a quoted key or `}`")?;
        let duplicate = match key {
            b"descr" => descr.is_some(),
            b"fortran_order" => fortran_order.is_some(),
            b"shape" => shape.is_some(),
            _ => {
                c.at = key_at;
                return Err(c.expected("one of the keys 'descr', 'fortran_order', 'shape'"));
            }
        };
        if duplicate {
            c.at = key_at;
            return Err(c.expected("each key once"));
        }
        c.skip_space();
        if !c.eat(b':') {
            return Err(c.expected("`:` after the key"));
        }
        c.skip_space();
        match key {
            b"descr" => {
                if c.peek() == Some(b'[') {
                    // A list of fields: a structured dtype.
                    return Err(NpyError::UnsupportedDType {
                        descr: quote(&c.text[c.at..]),
                    });
                }
                let d = c.string("a quoted dtype such as '<f4'")?;
                descr = Some(
                    dtype_of(d).ok_or_else(|| NpyError::UnsupportedDType { descr: quote(d) })?,
                );
            }
            b"fortran_order" => {
                let at = c.at;
                fortran_order = Some(match c.word() {
                    b"True" => true,
                    b"False" => false,
                    _ => {
                        c.at = at;
                        return Err(c.expected("True or False"));
                    }
                });
            }
            _ => shape = Some(c.shape()?),
        }
        c.skip_space();
        if c.eat(b'}') {
            break;
        }
        if !c.eat(b',') {
            return Err(c.expected("`,` or `}`"));
        }
    }
    c.skip_space();
    if c.at != text.len() {
        return Err(c.expected("only padding after `}`"));
    }
    let missing = |key: &str| malformed(format!("the header has no '{key}'"));
    let (dtype, big_endian) = descr.ok_or_else(|| missing("descr"))?;
    Ok(Header {
        dtype,
        big_endian,
        fortran_order: fortran_order.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
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
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_writable_type_and_shape() {
        let shapes: [&[u64]; 5] = [&[], &[3], &[2, 3], &[1, 3, 0, 4], &[2, 1, 2]];
        for dtype in DTYPES {
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

    /// A file of format `version` with header text `header` (padded) and `data`.
    fn file(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
        let mut f = b"\x93NUMPY".to_vec();
        f.extend_from_slice(&[version, 0]);
        let text = format!("{header}\n");
        if version == 1 {
            f.extend_from_slice(&(text.len() as u16).to_le_bytes());
        } else {
            f.extend_from_slice(&(text.len() as u32).to_le_bytes());
        }
        f.extend_from_slice(text.as_bytes());
        f.extend_from_slice(data);
        f
    }

    #[test]
    fn headers_in_every_form_numpy_and_others_write() {
        let one_two: Vec<u8> = [1i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        for (version, header) in [
            (
                1,
                "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
            ),
            (2, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,)}"),
            (
                3,
                "  {\"shape\":(2L,),\"fortran_order\":False,\"descr\":\"<i4\"}   ",
            ),
            (1, "{'fortran_order':False,'shape':(2),'descr':'i4',}"),
            (
                1,
                "{'descr': '<i4', 'fortran_order': True, 'shape': (1, 2, 1), }",
            ),
        ] {
            let t = read_npy(&file(version, header, &one_two)).unwrap();
            assert_eq!(t.to_i64_vec().unwrap(), vec![1, 2], "{header}");
        }
        let big: Vec<u8> = [1i32, 2].iter().flat_map(|v| v.to_be_bytes()).collect();
        let t = read_npy(&file(
            1,
            "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }",
            &big,
        ))
        .unwrap();
        assert_eq!(t.to_i64_vec().unwrap(), vec![1, 2]);
        // Bytes after the data are ignored, as NumPy ignores them.
        let mut longer = one_two.clone();
        longer.extend_from_slice(&[9; 3]);
        let t = read_npy(&file(
            1,
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
            &longer,
        ))
        .unwrap();
        assert_eq!(t.dims(), &[2]);
    }

    #[test]
    fn hostile_headers_are_typed_errors_that_quote_little() {
        let malformed = |header: &str| match read_npy(&file(1, header, &[0; 8])) {
            Err(NpyError::Malformed { reason }) => reason,
            other => panic!("{header:?}: {other:?}"),
        };
        for depth in [16, 64, 10_000] {
            let header = "{".repeat(depth);
            let reason = malformed(&header);
            assert!(reason.contains("expected a quoted key"), "{reason}");
            assert!(reason.chars().count() < 200, "{reason}");
        }
        for header in [
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
            "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ((2,),)}",
            "{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ()} x",
            "{'descr': '<f4' 'fortran_order': False, 'shape': ()}",
            "['descr', '<f4']",
            "",
        ] {
            malformed(header);
        }
        let long_key = format!("{{'{}': 1}}", "k".repeat(10_000));
        let reason = malformed(&long_key);
        assert!(
            reason.chars().count() < 200 && reason.ends_with("…`"),
            "{reason}"
        );
        let long_descr = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': ()}}",
            "x".repeat(10_000)
        );
        match read_npy(&file(1, &long_descr, &[])) {
            Err(NpyError::UnsupportedDType { descr }) => {
                assert_eq!(descr.chars().count(), QUOTE_CHARS + 1)
            }
            other => panic!("{other:?}"),
        }
        let structured = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': ()}";
        assert!(matches!(
            read_npy(&file(1, structured, &[0; 4])),
            Err(NpyError::UnsupportedDType { .. })
        ));
    }

    #[test]
    fn sizes_are_checked_before_anything_is_allocated() {
        let mut huge = b"\x93NUMPY\x02\x00".to_vec();
        huge.extend_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
        huge.extend_from_slice(b"{}");
        assert!(matches!(
            read_npy(&huge),
            Err(NpyError::HeaderTooLong {
                header_bytes: 0xFFFF_FFF0,
                ..
            })
        ));
        let overflow =
            "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }";
        assert!(matches!(
            read_npy(&file(1, overflow, &[])),
            Err(NpyError::Tensor {
                cause: TensorError::Overflow { .. }
            })
        ));
        let short = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }";
        assert!(matches!(
            read_npy(&file(1, short, &[0; 16])),
            Err(NpyError::Truncated {
                expected_bytes: 4_000_000_000_000,
                actual_bytes: 16
            })
        ));
        let rank = |n: usize| {
            format!(
                "{{'descr': '<f4', 'fortran_order': True, 'shape': ({}), }}",
                "1, ".repeat(n)
            )
        };
        assert!(read_npy(&file(1, &rank(MAX_DIMS), &[0; 4])).is_ok());
        assert!(matches!(
            read_npy(&file(1, &rank(MAX_DIMS + 1), &[0; 4])),
            Err(NpyError::TooManyDims { max_dims: MAX_DIMS })
        ));
        assert!(matches!(
            read_npy(&file(4, "{}", &[])),
            Err(NpyError::UnsupportedVersion { major: 4, minor: 0 })
        ));
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
