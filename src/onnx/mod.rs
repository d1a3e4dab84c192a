//! ONNX models: decoding, checking, inspecting and importing `.onnx` files (no device needed),
//! and running them on the device ([`OnnxSession`], the one part that needs one).
//!
//! ```no_run
//! # fn main() -> Result<(), dynrt::onnx::OnnxError> {
//! use dynrt::onnx::{InspectReport, LoadOptions, OnnxFile};
//! let model = OnnxFile::load("model.onnx", &LoadOptions::default())?;
//! for input in model.graph.runtime_inputs() {
//!     println!("{}: {:?}", input.name, input.ty);
//! }
//! print!("{}", InspectReport::new(&model).to_text());
//! # Ok(())
//! # }
//! ```
//!
//! * [`OnnxFile`] (`model`): the decoded model, checked: opset imports within
//!   [`ops::DEFAULT_DOMAIN_OPSETS`] for the default domain, every node input defined before
//!   use (by an earlier node, a graph input, an initializer or an enclosing graph), no value
//!   defined twice, graph outputs defined, attributes typed ([`AttributeValue`]), subgraphs
//!   checked the same way, `Constant` values decodable, initializers of the right size.
//!   Inputs and outputs carry [`ValueType`]s whose dims are [`OnnxDim::Fixed`] (`dim_value`)
//!   or [`OnnxDim::Symbolic`] (`dim_param`).
//! * [`HostTensor`] (`tensor`): element type ([`TensorDType`], every ONNX type), dims and
//!   little-endian bytes, shared ([`bytes::Bytes`]).
//! * [`external`]: external data (`location`/`offset`/`length`), paths kept inside the
//!   model's folder, and the [`external::ExternalData`] resolvers: files (native), bytes
//!   handed over (wasm32).
//! * [`bind_inputs`] / [`parse_input_arg`] (`feeds`): a run's inputs checked against the
//!   model (names, element types, ranks, fixed dims) and its symbolic dims bound.
//! * [`mod@import`]: the importer, [`OnnxFile`] into a dynrt [`crate::graph::Graph`], with its
//!   converter registry ([`import::CONVERTERS`], one line per op type).
//! * [`OnnxSession`] (`session`): a model imported, compiled and run step by step on the
//!   device, its KV caches carried in place between steps.
//! * [`ops`]: the opsets the loader accepts and which definition of an op they select.
//! * [`InspectReport`] (`inspect`): what `dynrt inspect` prints.
//! * `testdata` (feature `testing`, for this crate's tests): the ONNX backend node tests
//!   (`model.onnx` + `test_data_set_N/*.pb`).
//!
//! Every failure is an [`OnnxError`] naming the node, initializer, input or attribute; a
//! truncated or malformed file is [`OnnxError::Decode`], never a panic.
//!
//! # Why prost with hand-written messages
//!
//! The protobuf decoding is `prost` (the Tokio project's protobuf crate) with the message
//! structs of `onnx.proto` written out with `#[derive(prost::Message)]` in `src/onnx/proto.rs`
//! (crate-private). Against the alternatives, as of this writing:
//!
//! * *Size and build*: prost + bytes are small and pure Rust; no `protoc` or build script at
//!   build time, since the structs are source. Only the ~20 messages dynrt reads are there;
//!   unknown fields are skipped by the decoder.
//! * *wasm32*: prost decodes from any `bytes::Buf`, so loading from bytes works in the
//!   browser; `raw_data` decoded from a `Bytes` buffer is a slice of it (zero copy).
//! * *Maintenance*: prost is widely used and maintained (0.14, 2025), with a recursion limit
//!   that keeps hostile nesting from overflowing the stack.
//! * Rejected: `onnx-protobuf` (generated with the `protobuf` crate, MPL-2.0, one maintainer,
//!   copies every `bytes` field); burn's `onnx-ir` (a pre-release that pulls in
//!   `burn-tensor`, `protobuf`, `regex` and `memmap2`, and converts into burn's own node IR,
//!   not a file model dynrt could map to its graph).
//!
//! Bytes are copied at most once: a model read from disk is one buffer that `raw_data`
//! initializers slice; typed repeated fields (`float_data`, ...) are converted once into
//! little-endian bytes; external data is read once per tensor.

mod error;
pub mod external;
mod feeds;
mod file;
pub mod import;
mod inspect;
pub mod ops;
pub(crate) mod proto;
mod schemas;
pub mod session;
mod tensor;
#[cfg(any(test, feature = "testing"))]
pub mod testdata;
#[cfg(test)]
pub(crate) mod tests;

pub use error::OnnxError;
pub use external::{ExternalData, ExternalDataError, ExternalRef};
pub use feeds::{bind_inputs, bind_inputs_carried, parse_input_arg};
pub use file::{
    Attribute, AttributeValue, DataLocation, Initializer, LoadOptions, LocalFunction, OnnxDim,
    OnnxFile, OnnxGraph, OnnxNode, Opset, SparseInitializer, SparseTensor, TensorType, ValueInfo,
    ValueType, MAX_DENSE_BYTES,
};
pub use import::{import, ImportError, ImportedGraph};
pub use inspect::{
    DTypeBytes, ExternalFile, InitializerSummary, InspectReport, OpCount, UnsupportedNode,
};
pub use session::{onnx_tensor, Carry, OnnxSession, SessionError, SessionOptions};
pub use tensor::{HostTensor, TensorDType, TensorData, TensorError};
