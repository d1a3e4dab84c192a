//! The runtime's error type.

use crate::gpu::AllocError;
use crate::graph::GraphError;
use crate::memory::predictor::PredictorError;
use crate::shape::ShapeError;

/// Errors of compiling a network or running an inference. After any of them the network and
/// the request stay usable: buffers already held are kept, nothing half-allocated is left.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The graph is invalid or a node's shape inference failed (names the node).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A byte size overflowed.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// The shape predictor refused a shape (rank change, overflow).
    #[error(transparent)]
    Predictor(#[from] PredictorError),
    /// The output of `node` needs `requested_bytes` and even the exact size cannot be
    /// allocated. The request keeps its previous buffers and can run smaller shapes.
    #[error("node `{node}` needs {requested_bytes} bytes and they cannot be allocated: {reason}")]
    OutOfMemory {
        /// Label of the node.
        node: String,
        /// Exact bytes the output needs.
        requested_bytes: u64,
        /// The storage's error (over budget, too large, driver out of memory).
        reason: String,
    },
    /// A buffer the runtime needed could not be had from its storage.
    #[error("{what}: {reason}")]
    Storage {
        /// What was being done.
        what: String,
        /// The storage's error.
        reason: String,
    },
    /// A node the device computes has no kernel for its element types: refused when the
    /// network compiles (never float maths on integer bits).
    #[error("node `{node}` ({op}) has no device kernel for inputs {inputs:?} -> {output}: it needs {reason}")]
    UnsupportedDType {
        /// Label of the node.
        node: String,
        /// Op name.
        op: &'static str,
        /// Input element types.
        inputs: Vec<crate::shape::DType>,
        /// Output element type.
        output: crate::shape::DType,
        /// What the kernel accepts.
        reason: &'static str,
    },
    /// Another allocation or data-path error (uploads, readbacks).
    #[error("{what}: {cause}")]
    Alloc {
        /// What was being done.
        what: String,
        /// The engine's error.
        cause: AllocError,
    },
    /// The static planner failed.
    #[error("static plan failed: {0}")]
    Plan(String),
    /// A kernel could not be encoded for a node.
    #[error("node `{node}` ({op}): {reason}")]
    Kernel {
        /// Label of the node.
        node: String,
        /// Op name.
        op: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// An index of a gather is outside `[-bound, bound)`, the extent of the gathered axis:
    /// an error, as in ONNX (ONNX Runtime returns `INVALID_ARGUMENT`). Checked on the host
    /// before anything is submitted when the indices are fed or constant, on the device
    /// (and read back after the submit) when a kernel computes them. The request stays
    /// usable: its KV caches hold what they held before.
    #[error("node `{node}` ({op}): index {index} at position {position} of the indices is outside [-{bound}, {bound}) (the gathered axis has {bound} entries)")]
    IndexOutOfRange {
        /// Label of the node.
        node: String,
        /// Op name.
        op: &'static str,
        /// Position of the index in the indices, row-major.
        position: u64,
        /// The index as given.
        index: i64,
        /// Extent of the gathered axis.
        bound: u64,
    },
    /// An input was given data whose length or type does not match its shape.
    #[error("input `{input}`: {reason}")]
    BadInput {
        /// Label of the input.
        input: String,
        /// What is wrong.
        reason: String,
    },
    /// A state names a label that is not an input (or output) of the graph, or its output
    /// is not a concatenation of the input along axis 0.
    #[error("state `{past}` -> `{present}`: {reason}")]
    BadState {
        /// The past input label.
        past: String,
        /// The present output label.
        present: String,
        /// What is wrong.
        reason: String,
    },
    /// A label was asked for that is not an output of the graph.
    #[error("`{label}` is not an output of the network")]
    UnknownOutput {
        /// The label.
        label: String,
    },
    /// An environment variable has a value dynrt cannot use.
    #[error("environment variable {name}={value:?} is invalid: {reason}")]
    BadEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is expected.
        reason: &'static str,
    },
}
