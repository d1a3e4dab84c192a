//! [`OnnxError`]: everything that can go wrong loading an ONNX model or test-data file.

use super::external::ExternalDataError;
use super::tensor::TensorError;

/// Errors of the ONNX loader. Each names the model part it is about: the node (its name, or
/// `op_type#index` when unnamed), the initializer, the input or the attribute.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnnxError {
    /// The bytes are not a valid protobuf of the expected message (truncated, malformed, or a
    /// different kind of file).
    #[error("{what} is not a valid ONNX protobuf: {cause}")]
    Decode {
        /// What was being decoded (`model`, `tensor file input_0.pb`, ...).
        what: String,
        /// prost's description, with the field path where decoding stopped.
        cause: prost::DecodeError,
    },
    /// A file could not be read (native only).
    #[error("cannot read {path}: {cause}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// The model has no graph.
    #[error("the model has no graph")]
    NoGraph,
    /// An opset import outside the versions dynrt supports for its domain.
    #[error(
        "opset {version} of domain `{domain}` is not supported: dynrt supports {min} to {max}"
    )]
    UnsupportedOpset {
        /// The domain (`""` is the default ONNX domain).
        domain: String,
        /// The imported version.
        version: i64,
        /// Oldest supported version.
        min: i64,
        /// Newest supported version.
        max: i64,
    },
    /// The same domain is imported twice.
    #[error("domain `{domain}` is imported twice (opsets {first} and {second})")]
    DuplicateOpset {
        /// The domain.
        domain: String,
        /// First version.
        first: i64,
        /// Second version.
        second: i64,
    },
    /// A node uses a domain that the model does not import.
    #[error("node `{node}` ({op_type}) uses domain `{domain}`, which the model does not import")]
    MissingOpset {
        /// The node.
        node: String,
        /// Its op type.
        op_type: String,
        /// The domain.
        domain: String,
    },
    /// An initializer or tensor value is malformed.
    #[error("tensor `{tensor}`: {cause}")]
    Tensor {
        /// Its name (for attributes, `node/attribute`).
        tensor: String,
        /// What is wrong with it.
        cause: TensorError,
    },
    /// A sparse tensor is malformed (missing values or indices, wrong shapes, an index out of
    /// range).
    #[error("sparse tensor `{tensor}`: {reason}")]
    Sparse {
        /// Its name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// External tensor data could not be had.
    #[error("initializer `{initializer}`: {cause}")]
    External {
        /// The initializer (or `node/attribute` for a tensor attribute).
        initializer: String,
        /// What went wrong.
        cause: ExternalDataError,
    },
    /// A value name is empty where ONNX requires one (graph inputs, outputs, initializers).
    #[error("{kind} #{index} of graph `{graph}` has no name")]
    EmptyName {
        /// `input`, `output` or `initializer`.
        kind: &'static str,
        /// Its position.
        index: usize,
        /// The graph.
        graph: String,
    },
    /// Two values of one graph have the same name (graph inputs, initializers and node outputs
    /// share one namespace: ONNX graphs are in SSA form).
    #[error("value `{name}` is defined twice in graph `{graph}`: by {first} and by {second}")]
    DuplicateName {
        /// The value.
        name: String,
        /// The graph.
        graph: String,
        /// What defined it first (`graph input`, `initializer`, `node X`).
        first: String,
        /// What defined it again.
        second: String,
    },
    /// A node reads a value that no earlier node, graph input, initializer or enclosing graph
    /// defines.
    #[error("node `{node}` ({op_type}) reads `{input}`, which is not defined before it")]
    UndefinedInput {
        /// The node.
        node: String,
        /// Its op type.
        op_type: String,
        /// The value it reads.
        input: String,
    },
    /// A graph output that nothing defines.
    #[error("graph output `{output}` of graph `{graph}` is not defined by any node, input or initializer")]
    UndefinedOutput {
        /// The output.
        output: String,
        /// The graph.
        graph: String,
    },
    /// An attribute is malformed (no value, two values, an unknown type, a duplicate name).
    #[error("node `{node}` attribute `{attribute}`: {reason}")]
    Attribute {
        /// The node.
        node: String,
        /// The attribute.
        attribute: String,
        /// What is wrong.
        reason: String,
    },
    /// A `Constant` node whose value cannot be had.
    #[error("Constant node `{node}`: {reason}")]
    Constant {
        /// The node.
        node: String,
        /// What is wrong.
        reason: String,
    },
    /// A value's type is malformed (unknown element type, negative dimension, empty type).
    #[error("value `{value}`: {reason}")]
    Type {
        /// The graph input, output or value_info entry.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// An `--input` argument that is not `NAME=PATH`.
    #[error("input argument `{arg}` is not NAME=FILE.npy")]
    InputArg {
        /// The argument.
        arg: String,
    },
    /// A fed input the model does not declare.
    #[error("the model has no input `{input}`")]
    UnknownInput {
        /// The name fed.
        input: String,
    },
    /// An input fed twice.
    #[error("input `{input}` is given twice")]
    DuplicateInput {
        /// The input.
        input: String,
    },
    /// A required input not fed.
    #[error("input `{input}` is required but not given")]
    MissingInput {
        /// The input.
        input: String,
    },
    /// An input of the wrong element type (or a tensor for a non-tensor input).
    #[error("input `{input}` must be {expected}, is {actual}")]
    InputType {
        /// The input.
        input: String,
        /// The declared type.
        expected: String,
        /// What was given.
        actual: String,
    },
    /// An input of the wrong rank.
    #[error("input `{input}` must have rank {expected}, has rank {actual}")]
    InputRank {
        /// The input.
        input: String,
        /// Declared rank.
        expected: usize,
        /// Given rank.
        actual: usize,
    },
    /// A fixed dimension that differs.
    #[error("input `{input}` dimension {index} must be {expected}, is {actual}")]
    InputDim {
        /// The input.
        input: String,
        /// The dimension.
        index: usize,
        /// Declared extent.
        expected: u64,
        /// Given extent.
        actual: u64,
    },
    /// One symbol bound to two extents.
    #[error("dimension `{symbol}` is {first_value} in input `{first_input}` but {value} in input `{input}`")]
    SymbolConflict {
        /// The symbol (`dim_param`).
        symbol: String,
        /// The input that bound it first.
        first_input: String,
        /// Its extent there.
        first_value: u64,
        /// The input that disagrees.
        input: String,
        /// Its extent there.
        value: u64,
    },
    /// A file is not a regular file (a FIFO, a device, a directory) or is larger than
    /// [`crate::fileio::MAX_ONNX_BYTES`] (native only).
    #[cfg(not(target_arch = "wasm32"))]
    #[error(transparent)]
    File(crate::fileio::FileError),
}

#[cfg(not(target_arch = "wasm32"))]
impl From<crate::fileio::FileError> for OnnxError {
    /// An operating-system error stays [`OnnxError::Io`]; the rest is [`OnnxError::File`].
    fn from(e: crate::fileio::FileError) -> Self {
        match e {
            crate::fileio::FileError::Io { path, cause } => OnnxError::Io { path, cause },
            other => OnnxError::File(other),
        }
    }
}
