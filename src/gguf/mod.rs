//! GGUF: the file format of llama.cpp models, parsed from bytes.
//!
//! [`Gguf::parse`] reads a version 2 or 3 file from a `&[u8]` (a memory map natively through
//! [`MappedGguf`], bytes fetched in the browser) into an owned index: the metadata
//! ([`MetaValue`], typed accessors such as [`Gguf::get_u32`]) and one [`TensorInfo`] per
//! tensor (name, [`GgmlType`], dims, byte range). Tensor bytes stay in the caller's slice;
//! [`Gguf::tensor_bytes`] borrows them and [`dequantize`] expands them to `f32` on the CPU.
//! [`crate::llm::ModelConfig::from_gguf`] reads a model's hyper-parameters from the metadata
//! and checks its tensors' shapes. [`GgufBuilder`] writes files (tiny models, fixtures).
//!
//! Everything a file says is validated before it is used (see [`Gguf::parse`]), and every
//! problem is a [`GgufError`] that names the key, tensor or byte offset: no input panics,
//! which a fuzz test (`tests/host/fuzz.rs`) exercises.
//!
//! This is dynrt's own parser rather than a GGUF crate: the crates available when it was
//! written panic on malformed input (unwraps in their accessors) or leave offsets and dim
//! products unchecked, and the format is small.
//!
//! ```
//! use dynrt::gguf::{Gguf, GgufError};
//! // The smallest valid file: magic, version 3, no tensors, no metadata.
//! let mut file = b"GGUF".to_vec();
//! file.extend(3u32.to_le_bytes());
//! file.extend(0u64.to_le_bytes());
//! file.extend(0u64.to_le_bytes());
//! let gguf = Gguf::parse(&file)?;
//! assert_eq!((gguf.version(), gguf.tensors().len()), (3, 0));
//! // A truncated one is an error, not a panic.
//! assert!(matches!(Gguf::parse(&file[..10]), Err(GgufError::Truncated { .. })));
//! # Ok::<(), GgufError>(())
//! ```

mod dequant;
mod error;
mod file;
#[cfg(not(target_arch = "wasm32"))]
mod mapped;
#[cfg(test)]
mod tests;
#[cfg(any(test, feature = "testing"))]
mod tiny;
mod value;
mod writer;

pub use crate::formats::GgmlType;
pub use dequant::{dequantize, dequantize_types, quantize};
pub use error::GgufError;
pub use file::{Gguf, TensorInfo, DEFAULT_ALIGNMENT_BYTES, MAX_ARRAY_NESTING, MAX_DIMS};
#[cfg(not(target_arch = "wasm32"))]
pub use mapped::MappedGguf;
#[cfg(any(test, feature = "testing"))]
pub use tiny::{TinyLlama, CHATML_TEMPLATE, TINY_SPECIAL_TOKENS};
pub use value::{MetaArray, MetaValue, ValueType};
pub use writer::GgufBuilder;
