//! The runtime's error type.

use crate::gpu::{AllocError, DeviceLost};
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
    /// The device is lost ([`crate::gpu::Gpu::is_lost`]): the network and every request on
    /// it are gone with it (unlike after the other errors); build them again on a new device.
    #[error(transparent)]
    DeviceLost(#[from] DeviceLost),
}

impl RunError {
    /// Whether this is [`RunError::DeviceLost`], or an allocation error that is.
    pub fn is_device_lost(&self) -> bool {
        match self {
            RunError::DeviceLost(_) => true,
            RunError::Alloc { cause, .. } => cause.is_device_lost(),
            _ => false,
        }
    }

    /// The error of node `node` (`op`) whose kernel could not be encoded: the engine's
    /// out-of-memory errors (a uniform chunk, a workspace) are [`RunError::OutOfMemory`] and a
    /// lost device [`RunError::DeviceLost`], as for the node's own buffers; the rest
    /// [`RunError::Kernel`].
    pub fn from_kernel(
        node: &str,
        op: &'static str,
        e: crate::gpu::kernels::KernelError,
    ) -> RunError {
        use crate::gpu::kernels::KernelError;
        match e {
            KernelError::Uniforms(AllocError::DeviceLost(lost)) => RunError::DeviceLost(lost),
            KernelError::Uniforms(
                ref cause @ (AllocError::OverBudget {
                    requested_bytes, ..
                }
                | AllocError::OutOfMemory { requested_bytes }),
            ) => RunError::OutOfMemory {
                node: node.to_string(),
                requested_bytes,
                reason: cause.to_string(),
            },
            e => RunError::Kernel {
                node: node.to_string(),
                op,
                reason: e.to_string(),
            },
        }
    }

    /// `self`, or [`RunError::DeviceLost`] when `gpu`'s device is lost: an error met while
    /// the device is gone (an allocation refused, a readback that never came) is the loss.
    pub fn or_lost(self, gpu: &crate::gpu::Gpu) -> RunError {
        match gpu.lost() {
            Some(lost) => RunError::DeviceLost(lost),
            None => self,
        }
    }
}
