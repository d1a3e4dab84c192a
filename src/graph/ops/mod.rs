//! Operators of the graph IR and their shape rules.
//!
//! Every op answers its own output shape ([`Op::infer`]) from its input shapes and, for the few
//! ops whose output *shape* depends on input *values* (a reshape taking a shape tensor produced by
//! [`Op::ShapeOf`]), from those values ([`Op::shape_data_inputs`]). This mirrors the reference
//! plugin's `calc_output_layouts()` with `get_shape_infer_dependencies()`
//! (`reference/openvino-gpu-dynamic-shape-preprocessing.md`, update_shape step 7).
//!
//! One file per op family: [`elementwise`], [`matmul`], [`norm`], [`movement`], [`mask`].

pub mod elementwise;
pub mod mask;
pub mod matmul;
pub mod movement;
pub mod norm;

use crate::shape::{DType, Shape};

pub use elementwise::{BinaryOp, UnaryOp};

/// Why an op could not infer its output shape. The graph wraps it with the node's label
/// ([`crate::graph::GraphError::Infer`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InferError {
    /// Two shapes do not broadcast (NumPy rules: dimensions equal or one of them 1).
    #[error("cannot broadcast {left} with {right}")]
    Broadcast {
        /// Left operand shape.
        left: Shape,
        /// Right operand shape.
        right: Shape,
    },
    /// Two shapes that must agree in some dimensions do not.
    #[error("{what}: {left} vs {right}")]
    Mismatch {
        /// What had to agree, e.g. `matmul inner dimensions differ`.
        what: &'static str,
        /// First shape.
        left: Shape,
        /// Second shape.
        right: Shape,
    },
    /// An input has a rank the op does not accept.
    #[error("input {input} has shape {shape}, expected {expected}")]
    Rank {
        /// Input position.
        input: usize,
        /// The shape found.
        shape: Shape,
        /// What was expected, in words.
        expected: &'static str,
    },
    /// An axis is outside the rank.
    #[error("axis {axis} is out of range for rank {rank}")]
    Axis {
        /// The axis as given.
        axis: i64,
        /// The rank of the input.
        rank: usize,
    },
    /// A transpose permutation is not a permutation of `0..rank`.
    #[error("permutation {perm:?} is not a permutation of 0..{rank}")]
    Permutation {
        /// The permutation as given.
        perm: Vec<usize>,
        /// The rank of the input.
        rank: usize,
    },
    /// A reshape target is invalid for the input (element counts differ, several -1, ...).
    #[error("cannot reshape {from} to {target:?}: {reason}")]
    Reshape {
        /// The input shape.
        from: Shape,
        /// The target as given (0 copies the input dimension, -1 is inferred).
        target: Vec<i64>,
        /// What was wrong.
        reason: &'static str,
    },
    /// A slice parameter is invalid (step not positive, axes/starts/ends of different lengths).
    #[error("invalid slice: {reason}")]
    Slice {
        /// What was wrong.
        reason: &'static str,
    },
    /// The causal mask needs at least as many keys as queries (keys = past + queries).
    #[error("causal mask needs keys >= queries in the last two dimensions, got {shape}")]
    CausalMask {
        /// The input shape.
        shape: Shape,
    },
    /// An op that needs at least one input got none.
    #[error("op needs at least one input")]
    NoInputs,
    /// The values of a shape-data input were not available on the host.
    #[error(
        "values of input {input} are needed for shape inference but are not known on the host"
    )]
    MissingShapeData {
        /// Input position.
        input: usize,
    },
    /// A computed shape overflows `u64` elements.
    #[error("shape {shape} overflows u64 elements")]
    Overflow {
        /// The shape, printed.
        shape: String,
    },
}

/// An operator with its parameters. Inputs are listed per variant in the order the node's
/// `inputs` hold them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// A network input; its dimensions may be symbolic and are bound per run. No inputs.
    Input {
        /// Declared dimensions.
        dims: Vec<crate::graph::Dim>,
    },
    /// A constant (weights). No inputs. Integer constants carry exact integer values in `data`.
    Constant {
        /// Its shape.
        shape: Shape,
        /// Row-major values, `shape.num_elements()` of them.
        data: std::sync::Arc<Vec<f32>>,
    },
    /// `[..., M, K] x [..., K, N] -> [..., M, N]`, batch dimensions broadcast (NumPy).
    /// With `transpose_b` the right side is `[..., N, K]`. Inputs: a, b.
    MatMul {
        /// Right operand is stored transposed (`[..., N, K]`).
        transpose_b: bool,
    },
    /// Elementwise binary op with NumPy broadcasting. Inputs: a, b.
    Binary(BinaryOp),
    /// Elementwise unary op. Inputs: x.
    Unary(UnaryOp),
    /// Softmax over the last axis, numerically stable (max subtracted). Inputs: x.
    Softmax,
    /// Layer normalisation over the last axis with scale and shift. Inputs: x `[..., D]`,
    /// gamma `[D]`, beta `[D]`.
    LayerNorm {
        /// Added to the variance.
        eps: f32,
    },
    /// RMS normalisation over the last axis with scale. Inputs: x `[..., D]`, gamma `[D]`.
    RmsNorm {
        /// Added to the mean square.
        eps: f32,
    },
    /// Reshape to a static target: `0` copies the input dimension at that position, `-1` is
    /// inferred (at most one). Inputs: x.
    Reshape {
        /// Target dimensions.
        target: Vec<i64>,
    },
    /// Reshape to the shape held in the values of a 1-D integer tensor (same `0`/`-1` rules).
    /// Inputs: x, shape (an integer tensor whose values are a shape-inference dependency).
    ReshapeTo,
    /// Permute dimensions: output dimension `i` is input dimension `perm[i]`. Inputs: x.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Concatenate along `axis`; all other dimensions equal. Inputs: one or more tensors.
    Concat {
        /// The axis.
        axis: usize,
    },
    /// Slice listed axes with `start:end:step` (ONNX rules: negative indices count from the end,
    /// out-of-range indices clamp, steps positive). Inputs: x.
    Slice {
        /// The axes sliced.
        axes: Vec<usize>,
        /// Start per listed axis.
        starts: Vec<i64>,
        /// End (exclusive) per listed axis; `i64::MAX` means to the end.
        ends: Vec<i64>,
        /// Step per listed axis, at least 1.
        steps: Vec<i64>,
    },
    /// Embedding lookup along axis 0: `out[i.., d..] = table[ids[i..], d..]`. Ids out of range
    /// (including negative i32) give zeros. Inputs: table, ids (i32 or u32).
    Gather,
    /// `cond ? a : b` elementwise with three-way broadcasting; `cond` is true where nonzero.
    /// Inputs: cond, a, b.
    Where,
    /// Causal attention mask over a growing past: for scores `[..., S, T]` with `T = P + S`
    /// (P past keys), query `i` sees keys `j <= P + i`; the others become [`MASK_VALUE`].
    /// The past length comes from the shape, so one node serves prefill and decode. Inputs: x.
    CausalMask,
    /// The shape of its input as a 1-D i32 tensor. Its values are known on the host once shapes
    /// are, so they feed shape inference of later nodes without a GPU round trip. Inputs: x.
    ShapeOf,
}

/// What [`Op::CausalMask`] writes into hidden positions: the most negative finite f32, so that
/// `exp(x - max)` underflows to 0 in softmax without producing NaN from `inf - inf`.
pub const MASK_VALUE: f32 = f32::MIN;

impl Op {
    /// Short lower-case name (`matmul`, `add`, `layer_norm`, ...), used in errors and labels.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Constant { .. } => "constant",
            Op::MatMul { .. } => "matmul",
            Op::Binary(b) => b.name(),
            Op::Unary(u) => u.name(),
            Op::Softmax => "softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Reshape { .. } => "reshape",
            Op::ReshapeTo => "reshape_to",
            Op::Transpose { .. } => "transpose",
            Op::Concat { .. } => "concat",
            Op::Slice { .. } => "slice",
            Op::Gather => "gather",
            Op::Where => "where",
            Op::CausalMask => "causal_mask",
            Op::ShapeOf => "shape_of",
        }
    }

    /// How many inputs the op takes: `(min, max)`.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Input { .. } | Op::Constant { .. } => (0, 0),
            Op::MatMul { .. } | Op::Binary(_) | Op::ReshapeTo | Op::Gather => (2, 2),
            Op::RmsNorm { .. } => (2, 2),
            Op::LayerNorm { .. } | Op::Where => (3, 3),
            Op::Concat { .. } => (1, usize::MAX),
            Op::Unary(_)
            | Op::Softmax
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::CausalMask
            | Op::ShapeOf => (1, 1),
        }
    }

    /// Input positions whose *values* (not only shapes) are needed to infer the output shape.
    /// The runtime must know those values on the host before calling [`Op::infer`]; the graph
    /// computes them on the host for integer tensors derived from [`Op::ShapeOf`] and integer
    /// constants ([`crate::graph::Graph::infer_shapes`]).
    pub fn shape_data_inputs(&self) -> &'static [usize] {
        match self {
            Op::ReshapeTo => &[1],
            _ => &[],
        }
    }

    /// Whether the output shape is the same as input 0's for every valid input: such nodes are
    /// candidates for in-place execution and need no shape work beyond a copy.
    pub fn preserves_shape(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Softmax | Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::CausalMask
        )
    }

    /// The output element type given the input element types (already checked by the graph).
    pub fn output_dtype(&self, inputs: &[DType]) -> DType {
        match self {
            Op::Input { .. } | Op::Constant { .. } => DType::F32,
            Op::ShapeOf => DType::I32,
            Op::Where => inputs.get(1).copied().unwrap_or(DType::F32),
            _ => inputs.first().copied().unwrap_or(DType::F32),
        }
    }

    /// Infers the output shape from the input shapes and, for [`Op::shape_data_inputs`], the
    /// input values (`data[i]` is `Some` for every such input `i`).
    ///
    /// [`Op::Input`] takes its shape from the run's bindings and [`Op::Constant`] from its
    /// declaration; both are answered here too (`Input` only when all dimensions are fixed).
    ///
    /// # Errors
    /// [`InferError`] when the inputs do not fit the op; the message carries both shapes.
    pub fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        match self {
            Op::Input { dims } => dims
                .iter()
                .map(|d| match d {
                    crate::graph::Dim::Fixed(n) => Ok(*n),
                    crate::graph::Dim::Sym(_) => Err(InferError::MissingShapeData { input: 0 }),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Shape),
            Op::Constant { shape, .. } => Ok(shape.clone()),
            Op::MatMul { transpose_b } => matmul::infer(inputs, *transpose_b),
            Op::Binary(_) => elementwise::broadcast(inputs[0], inputs[1]),
            Op::Unary(_) | Op::Softmax => norm::infer_rank_at_least_1(inputs[0], self),
            Op::LayerNorm { .. } | Op::RmsNorm { .. } => norm::infer_norm(inputs),
            Op::Reshape { target } => movement::infer_reshape(inputs[0], target),
            Op::ReshapeTo => {
                let values = data
                    .get(1)
                    .copied()
                    .flatten()
                    .ok_or(InferError::MissingShapeData { input: 1 })?;
                if inputs[1].rank() != 1 {
                    return Err(InferError::Rank {
                        input: 1,
                        shape: inputs[1].clone(),
                        expected: "a 1-D shape tensor",
                    });
                }
                movement::infer_reshape(inputs[0], values)
            }
            Op::Transpose { perm } => movement::infer_transpose(inputs[0], perm),
            Op::Concat { axis } => movement::infer_concat(inputs, *axis),
            Op::Slice {
                axes,
                starts,
                ends,
                steps,
            } => movement::slice_ranges(inputs[0], axes, starts, ends, steps)
                .map(|r| Shape(r.iter().map(|r| r.len).collect())),
            Op::Gather => movement::infer_gather(inputs[0], inputs[1]),
            Op::Where => {
                let ab = elementwise::broadcast(inputs[1], inputs[2])?;
                elementwise::broadcast(inputs[0], &ab)
            }
            Op::CausalMask => mask::infer_causal(inputs[0]),
            Op::ShapeOf => Ok(Shape(vec![inputs[0].rank() as u64])),
        }
    }
}

/// Checks that the element count of `shape` fits in `u64`.
pub(crate) fn checked(shape: Shape) -> Result<Shape, InferError> {
    match shape.checked_num_elements() {
        Some(_) => Ok(shape),
        None => Err(InferError::Overflow {
            shape: shape.to_string(),
        }),
    }
}
