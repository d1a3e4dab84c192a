//! The error type of GGUF parsing, metadata access, dequantization and model configuration.

use super::GgmlType;

/// Everything that can be wrong with a GGUF file or with a request made of it. Each variant
/// names the key, the tensor or the byte offset, and carries the numbers.
///
/// Parsing allocates nothing whose size the file has not first been checked to hold, so a
/// failed parse leaves nothing behind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file ends before `what` does.
    #[error(
        "truncated GGUF: {what} at byte {offset} needs {needed_bytes} bytes but the file has \
         {file_bytes} bytes"
    )]
    Truncated {
        /// What was being read (`"header"`, `"the name of key #3"`, `"tensor data of x"`).
        what: String,
        /// Byte offset where it starts.
        offset: u64,
        /// Bytes it needs from `offset`.
        needed_bytes: u64,
        /// Size of the whole file in bytes.
        file_bytes: u64,
    },
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A GGUF version other than 2 or 3 (version 1 used 32-bit counts; a byte-swapped version
    /// means a big-endian file, which is not supported).
    #[error("unsupported GGUF version {version}: dynrt reads little-endian versions 2 and 3")]
    UnsupportedVersion {
        /// The version field as read little-endian.
        version: u32,
    },
    /// A count (tensors, keys, array elements) larger than the rest of the file could hold,
    /// checked before anything is allocated for it.
    #[error(
        "{what}: count {count} cannot fit in the {remaining_bytes} bytes left in the file \
         (at least {min_bytes_each} bytes each)"
    )]
    CountTooLarge {
        /// What is counted.
        what: String,
        /// The count read from the file.
        count: u64,
        /// Bytes left in the file after the count.
        remaining_bytes: u64,
        /// The fewest bytes each element takes in the file.
        min_bytes_each: u64,
    },
    /// A string is not valid UTF-8.
    #[error("{what} is not valid UTF-8 (at byte {offset})")]
    InvalidUtf8 {
        /// Which string.
        what: String,
        /// Byte offset of the string's bytes.
        offset: u64,
    },
    /// A metadata value type id that GGUF does not define.
    #[error("key `{key}`: unknown metadata value type {type_id}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The type id read.
        type_id: u32,
    },
    /// A boolean byte other than 0 or 1.
    #[error("key `{key}`: boolean byte {value} is neither 0 nor 1")]
    InvalidBool {
        /// The key.
        key: String,
        /// The byte read.
        value: u8,
    },
    /// Arrays nested deeper than dynrt follows (a guard against stack exhaustion).
    #[error("key `{key}`: arrays nested more than {max_depth} deep")]
    NestingTooDeep {
        /// The key.
        key: String,
        /// The deepest nesting accepted.
        max_depth: usize,
    },
    /// The same key twice.
    #[error("key `{key}` appears twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment is {value}: it must be a power of two (default 32)")]
    BadAlignment {
        /// The value read.
        value: u64,
    },
    /// A required metadata key is absent.
    #[error("metadata key `{key}` is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata key holds a different type than asked for.
    #[error("metadata key `{key}` holds {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The type found.
        found: &'static str,
    },
    /// A metadata value outside the range its use allows.
    #[error("metadata key `{key}` = {value}: {reason}")]
    ValueOutOfRange {
        /// The key.
        key: String,
        /// The value, printed.
        value: String,
        /// What the range is.
        reason: String,
    },
    /// A tensor type id that ggml does not define (or no longer defines).
    #[error("tensor `{tensor}`: unknown ggml type {type_id}")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The type id read.
        type_id: u32,
    },
    /// A tensor type that is known but that this operation does not handle.
    #[error("tensor `{tensor}`: type {ty} is not supported here (supported: {supported})")]
    UnsupportedTensorType {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// The types that are.
        supported: &'static str,
    },
    /// More dimensions than ggml's four, or none.
    #[error("tensor `{tensor}`: {n_dims} dimensions (ggml allows 1 to {max})")]
    BadDimCount {
        /// The tensor.
        tensor: String,
        /// The count read.
        n_dims: u32,
        /// The most allowed.
        max: u32,
    },
    /// The element count or byte size of a tensor overflows 64 bits.
    #[error("tensor `{tensor}`: dims {dims:?} overflow 64 bits")]
    DimsOverflow {
        /// The tensor.
        tensor: String,
        /// Its dims, innermost first.
        dims: Vec<u64>,
    },
    /// The innermost dimension is not a whole number of quantization blocks.
    #[error("tensor `{tensor}` ({ty}): row length {row_len} is not a multiple of the block size {block_len}")]
    PartialBlock {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// The innermost dim.
        row_len: u64,
        /// Elements per block of `ty`.
        block_len: u64,
    },
    /// Two tensors with one name.
    #[error("tensor `{tensor}` appears twice")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
    },
    /// A tensor's data offset is not a multiple of the file's alignment.
    #[error(
        "tensor `{tensor}`: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset from the start of the data section, in bytes.
        offset: u64,
        /// `general.alignment`.
        alignment: u64,
    },
    /// A tensor's bytes reach past the end of the file.
    #[error(
        "tensor `{tensor}`: bytes {start}..{end} are past the end of the file ({file_bytes} bytes)"
    )]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// First byte, from the start of the file.
        start: u64,
        /// One past the last byte.
        end: u64,
        /// Size of the file.
        file_bytes: u64,
    },
    /// Two tensors share bytes.
    #[error("tensors `{first}` and `{second}` overlap in the file")]
    TensorsOverlap {
        /// The one that starts first.
        first: String,
        /// The other.
        second: String,
    },
    /// A tensor that the caller needs is not in the file.
    #[error("tensor `{tensor}` is missing")]
    MissingTensor {
        /// The tensor.
        tensor: String,
    },
    /// A tensor whose shape is not what the model's metadata implies.
    #[error("tensor `{tensor}` has dims {found:?}, the metadata implies {expected:?}")]
    TensorShape {
        /// The tensor.
        tensor: String,
        /// The dims the metadata implies, innermost first.
        expected: Vec<u64>,
        /// The dims in the file.
        found: Vec<u64>,
    },
    /// `general.architecture` names an architecture dynrt does not run.
    #[error("architecture `{architecture}` is not supported (supported: {supported})")]
    UnsupportedArchitecture {
        /// The file's `general.architecture`.
        architecture: String,
        /// The architectures dynrt runs, comma-separated.
        supported: String,
    },
    /// Metadata values that contradict each other.
    #[error("inconsistent model metadata: {reason}")]
    Inconsistent {
        /// What contradicts what.
        reason: String,
    },
    /// Bytes handed in for a tensor or a row have the wrong length.
    #[error("{what}: {actual_bytes} bytes given, {expected_bytes} expected")]
    LengthMismatch {
        /// What the bytes were for.
        what: String,
        /// Bytes expected.
        expected_bytes: u64,
        /// Bytes given.
        actual_bytes: u64,
    },
    /// Opening or mapping a file failed.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// The path is not a regular file (a directory, a FIFO, a device): refused before it is
    /// opened (native only).
    #[cfg(not(target_arch = "wasm32"))]
    #[error(transparent)]
    File(crate::fileio::FileError),
}
