//! Operators of the graph IR: each op (or family) is a type that answers for itself.
//!
//! An op implements [`OpDef`]: its name and arity, its **dtype rule** (which input types it
//! accepts, what it outputs), its **shape rule** ([`OpDef::infer`], from input shapes and, for
//! the few ops whose output *shape* depends on input *values*, from those values:
//! [`OpDef::shape_data_inputs`]), its **CPU reference** ([`OpDef::reference`], plain loops on
//! host values) and, optionally, its **host evaluation for shape data**
//! ([`OpDef::host_value`]: integer tensors derived from shapes, computed on the host so no GPU
//! round trip is needed). This mirrors the reference plugin's `calc_output_layouts()` with
//! `get_shape_infer_dependencies()` (OpenVINO's update_shape reads the values of such inputs
//! before it infers).
//!
//! [`Op`] is the enum of every op type, generated from one list (the `registry!` invocation
//! below): adding an op is its file here, one line in that list, its kernel (a family file in
//! `src/gpu/kernels/` and one line in its registry), its WGSL and its test. See "How to add
//! an op" in the crate docs.
//!
//! Files: [`source`] (input, constant), [`elementwise`] (binary, unary), [`logic`]
//! (comparisons, boolean logic, cast, identity), [`matmul`] (matmul, gemm), [`linear`] (`x ·
//! wᵀ` on quantized weights), [`fused_linear`] (a linear with its norm, gated activation and
//! residual folded in), [`norm`] (softmax and log-softmax on any axis, layer norm, RMS
//! norm), [`movement`] (reshape, transpose, concat, slice, split, gather, expand, shape_of),
//! [`view`] (squeeze, unsqueeze, flatten: new shapes over the same bytes), [`generate`]
//! (constant_of_shape, range), [`mask`] (causal mask, where, trilu), [`reduce`] (reductions
//! over any axes, cumulative sum), [`conv`] (convolution, pooling, batch norm), [`rotary`]
//! (ONNX's rotary embedding), [`attention`] (RoPE on adjacent pairs, grouped-query attention
//! over a KV cache), [`paged`] (attention over a paged KV pool, rows scattered into it),
//! [`sample`] (the next token from rows of logits).
//!
//! Axes are `i64` as ONNX writes them (negative counts from the end) and are resolved against
//! the input's rank by the shape rule ([`axis_index`]): a graph is built without knowing
//! ranks, which only concrete shapes have.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod fused_linear;
pub mod generate;
pub mod linear;
pub mod logic;
pub mod mask;
pub mod matmul;
pub mod movement;
pub mod norm;
pub mod paged;
pub mod reduce;
pub mod rotary;
pub mod sample;
pub mod source;
pub mod view;

use crate::graph::reference::{RefError, RefTensor, Values};
use crate::shape::{DType, Shape};
use std::fmt;

pub use attention::{rope_block, rope_table, rope_table_rows, rope_table_scaled, Attention, Rope};
pub use conv::{BatchNorm, Conv, Pool, PoolKind};
pub use elementwise::{BinaryOp, UnaryOp};
pub use fused_linear::{FusedLinear, GateAct, HeadNorm, KvRows, KvSplit, ParamOffsets};
pub use generate::{ConstantOfShape, Range};
pub use linear::Linear;
pub use logic::{Cast, CompareOp, Identity, LogicOp, Not};
pub use mask::{CausalMask, Trilu, Where};
pub use matmul::{Gemm, MatMul};
pub use movement::{
    Concat, Expand, Gather, Reshape, ReshapeTo, ShapeOf, SizeOf, Slice, SliceTo, SplitPart,
    Transpose,
};
pub use norm::{LayerNorm, RmsNorm, Softmax};
pub use paged::{PagedAttention, ScatterRows};
pub use reduce::{CumSum, Reduce, ReduceAxes, ReduceKind};
pub use rotary::RotaryEmbedding;
pub use sample::{Sample, SampleRow};
pub use source::{Constant, Input};
pub use view::{Flatten, Squeeze, Unsqueeze};

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
    /// An op's parameters do not fit its inputs (a head size that does not divide a width,
    /// ...).
    #[error("{op}: {reason}")]
    Invalid {
        /// The op name.
        op: &'static str,
        /// What is wrong, with the numbers.
        reason: String,
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
    /// A list of axes does not fit the input (out of range, repeated, or naming a dimension
    /// the op cannot take there, such as squeezing a dimension that is not 1).
    #[error("axes {axes:?} do not fit shape {shape}: {reason}")]
    Axes {
        /// The axes as given.
        axes: Vec<i64>,
        /// The input shape.
        shape: Shape,
        /// What is wrong.
        reason: &'static str,
    },
    /// The values of a shape-data input are not valid for the op (a negative dimension, a
    /// zero step).
    #[error("input {input} holds {values:?}: {reason}")]
    ShapeData {
        /// Input position.
        input: usize,
        /// The values found.
        values: Vec<i64>,
        /// What is wrong.
        reason: &'static str,
    },
    /// An index of a gather is outside `[-bound, bound)`, the extent of the gathered axis
    /// (ONNX calls it an error; ONNX Runtime returns `INVALID_ARGUMENT`).
    #[error("index {index} at position {position} of input {input} is outside [-{bound}, {bound}) (the gathered axis has {bound} entries)")]
    IndexOutOfRange {
        /// Input position (the indices).
        input: usize,
        /// Position of the index in the indices, row-major.
        position: u64,
        /// The index as given.
        index: i64,
        /// Extent of the gathered axis.
        bound: u64,
    },
    /// An op parameter does not fit the inputs (a kernel larger than the padded input, a
    /// channel count that the groups do not divide).
    #[error("{what}: {detail}")]
    Param {
        /// Which parameter rule failed.
        what: &'static str,
        /// The numbers involved.
        detail: String,
    },
}

/// An input element type an op does not accept: which input and what it wants. The graph
/// names the node and the type found ([`crate::graph::GraphError::DType`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DTypeError {
    /// Input position.
    pub input: usize,
    /// What the op accepts there, in words.
    pub expected: &'static str,
}

impl DTypeError {
    /// `input` should be `expected`.
    pub fn at(input: usize, expected: &'static str) -> DTypeError {
        DTypeError { input, expected }
    }
}

/// What every op answers for itself. Implement it for the op's type in its own file, add the
/// type to the `registry!` list of this module, and the graph, the builder (through
/// [`crate::graph::GraphBuilder::node`]), the CPU reference and the host evaluator all know it.
pub trait OpDef: fmt::Debug + Send + Sync {
    /// Short lower-case name (`matmul`, `add`, `layer_norm`, ...), used in errors and labels.
    fn name(&self) -> &'static str;

    /// How many inputs the op takes: `(min, max)`.
    fn arity(&self) -> (usize, usize);

    /// The dtype rule: the output element type for these input types, or which input has a
    /// type the op does not accept. Checked when the graph is built.
    ///
    /// # Errors
    /// [`DTypeError`] naming the input and what it should be.
    fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError>;

    /// The shape rule: the output shape from the input shapes and, for
    /// [`OpDef::shape_data_inputs`], the input values (`data[i]` is `Some` for those inputs).
    ///
    /// # Errors
    /// [`InferError`] when the inputs do not fit the op; the message carries the shapes.
    fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError>;

    /// Input positions whose *values* (not only shapes) the shape rule needs. The graph
    /// computes them on the host ([`crate::graph::Graph::infer_shapes`]).
    fn shape_data_inputs(&self) -> &'static [usize] {
        &[]
    }

    /// Whether the op reads its inputs' values at all (`shape_of` reads only shapes).
    fn reads_values(&self) -> bool {
        true
    }

    /// Whether the device reads the values of input `pos`. By default every input but the
    /// [`OpDef::shape_data_inputs`] (when the op reads values at all); an op whose kernel
    /// also reads a shape-data input (a range's start and step) says so here, so that input
    /// keeps a device buffer.
    fn reads_input(&self, pos: usize) -> bool {
        self.reads_values() && !self.shape_data_inputs().contains(&pos)
    }

    /// Whether the output is input 0's bytes under a new shape (reshape, squeeze, flatten):
    /// the runtime copies (or could alias) the bytes instead of running a kernel.
    fn is_view(&self) -> bool {
        false
    }

    /// Whether the output shape is input 0's for every valid input (activations, norms).
    fn preserves_shape(&self) -> bool {
        false
    }

    /// The CPU reference: the output values from host values of the inputs, in plain loops
    /// with the reference's own index code ([`crate::graph::reference`]), never the kernels'.
    ///
    /// # Errors
    /// [`RefError`] for inputs the reference cannot evaluate (a dtype it does not handle).
    fn reference(
        &self,
        inputs: &[&RefTensor],
        out: &Shape,
        dtype: DType,
    ) -> Result<Values, RefError>;

    /// Whether [`OpDef::host_value`] can compute this op's integer output on the host (the
    /// graph marks nodes whose values only feed shape rules as never dispatched).
    fn host_evaluable(&self) -> bool {
        false
    }

    /// The host evaluation for shape data: the op's integer output from its inputs' shapes and
    /// host values (`values` holds every input's values when [`OpDef::reads_values`], else it
    /// is empty), or `None`. Written apart from [`OpDef::reference`] (see
    /// [`crate::graph::shape_data`]) so that a bug in one does not hide in the other.
    fn host_value(&self, shapes: &[&Shape], values: &[&[i64]], out: &Shape) -> Option<Vec<i64>> {
        let _ = (shapes, values, out);
        None
    }
}

/// Generates [`Op`] (one variant per op type), [`Op::def`] and the `From` conversions from
/// one list: the one line an op adds here.
macro_rules! registry {
    ($( $(#[$doc:meta])* $variant:ident($ty:ty), )*) => {
        /// An operator with its parameters: one variant per op type (see [`OpDef`]). Inputs
        /// are listed by each type in the order a node's `inputs` hold them.
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub enum Op {
            $( $(#[$doc])* $variant($ty), )*
        }

        impl Op {
            /// The op's rules (name, arity, dtype, shape, reference, host value).
            pub fn def(&self) -> &dyn OpDef {
                match self {
                    $( Op::$variant(o) => o, )*
                }
            }
        }

        $(
            impl From<$ty> for Op {
                fn from(o: $ty) -> Op {
                    Op::$variant(o)
                }
            }
        )*
    };
}

registry! {
    /// A network input (dimensions possibly symbolic, bound per run). No inputs.
    Input(source::Input),
    /// A constant: typed little-endian bytes (weights). No inputs.
    Constant(source::Constant),
    /// Batched matmul `[..., M, K] x [..., K, N]`. Inputs: a, b.
    MatMul(matmul::MatMul),
    /// `x · wᵀ` with the weight in its stored format (any of [`crate::formats`]). Inputs: x, w.
    Linear(linear::Linear),
    /// A linear with an RMSNorm of x, a gated activation and a residual folded in (made by
    /// [`crate::graph::fuse`]). Inputs: x, w, gamma (with a norm), residual (with one).
    FusedLinear(fused_linear::FusedLinear),
    /// Elementwise binary op with NumPy broadcasting. Inputs: a, b.
    Binary(elementwise::BinaryOp),
    /// Elementwise unary op. Inputs: x.
    Unary(elementwise::UnaryOp),
    /// Softmax or log-softmax over any one axis (negative counts from the end). Inputs: x.
    Softmax(norm::Softmax),
    /// Layer norm over the last axis. Inputs: x, gamma, beta.
    LayerNorm(norm::LayerNorm),
    /// RMS norm over the last axis. Inputs: x, gamma.
    RmsNorm(norm::RmsNorm),
    /// Reshape to a static target. Inputs: x.
    Reshape(movement::Reshape),
    /// Reshape to the shape held in an integer tensor. Inputs: x, shape.
    ReshapeTo(movement::ReshapeTo),
    /// Permute dimensions. Inputs: x.
    Transpose(movement::Transpose),
    /// Concatenate along an axis. Inputs: one or more tensors.
    Concat(movement::Concat),
    /// Slice with ONNX rules. Inputs: x.
    Slice(movement::Slice),
    /// Gather along an axis (embedding lookup on axis 0). Inputs: data, indices.
    Gather(movement::Gather),
    /// `cond ? a : b` with broadcasting. Inputs: cond, a, b.
    Where(mask::Where),
    /// Causal attention mask over a growing past. Inputs: x.
    CausalMask(mask::CausalMask),
    /// The shape of its input (a range of it) as an i32 or i64 tensor. Inputs: x.
    ShapeOf(movement::ShapeOf),
    /// The element count of its input as an i64 scalar. Inputs: x.
    SizeOf(movement::SizeOf),
    /// Slice with parameters held in integer tensors. Inputs: x, starts, ends, optional steps.
    SliceTo(movement::SliceTo),
    /// One part of a split along an axis. Inputs: x.
    SplitPart(movement::SplitPart),
    /// Broadcast to a shape held in an integer tensor. Inputs: x, shape.
    Expand(movement::Expand),
    /// Remove dimensions of 1. Inputs: x.
    Squeeze(view::Squeeze),
    /// Insert dimensions of 1. Inputs: x.
    Unsqueeze(view::Unsqueeze),
    /// Flatten to 2-D around an axis. Inputs: x.
    Flatten(view::Flatten),
    /// A tensor of one repeated value, shaped by an integer tensor. Inputs: shape.
    ConstantOfShape(generate::ConstantOfShape),
    /// `start, start + delta, ...` below `limit`. Inputs: start, limit, delta.
    Range(generate::Range),
    /// Keep the upper or lower triangle of the last two dimensions. Inputs: x, optional k.
    Trilu(mask::Trilu),
    /// Sum, mean, max, min or inverse standard deviation over axes. Inputs: x.
    Reduce(reduce::Reduce),
    /// Cumulative sum along an axis. Inputs: x.
    CumSum(reduce::CumSum),
    /// `alpha * op(A) @ op(B) + beta * C`. Inputs: a, b, optional c.
    Gemm(matmul::Gemm),
    /// 1-D or 2-D convolution with groups, strides, dilations, padding and bias. Inputs: x,
    /// w, bias.
    Conv(conv::Conv),
    /// Max or average pooling over 1 to 3 spatial dimensions. Inputs: x.
    Pool(conv::Pool),
    /// Batch normalisation with running statistics (inference). Inputs: x, scale, bias,
    /// mean, var.
    BatchNorm(conv::BatchNorm),
    /// Rotary position embedding (ONNX opset 23). Inputs: x, cos, sin, optional positions.
    RotaryEmbedding(rotary::RotaryEmbedding),
    /// Rotary position embedding on adjacent pairs. Inputs: x, positions, cos/sin table.
    Rope(attention::Rope),
    /// Causal grouped-query attention over a KV cache. Inputs: q, k, v.
    Attention(attention::Attention),
    /// Grouped-query attention over a paged KV pool. Inputs: q, k pool, v pool, rows, pages.
    PagedAttention(paged::PagedAttention),
    /// Rows written into their slots of a pool (in place on a state). Inputs: pool, rows,
    /// slots.
    ScatterRows(paged::ScatterRows),
    /// The key or value rows of a `fused_linear` with a KV split, which its kernel writes into
    /// the KV cache (no device work of its own). Inputs: that node.
    KvRows(fused_linear::KvRows),
    /// Comparison with broadcasting, bool result. Inputs: a, b.
    Compare(logic::CompareOp),
    /// Boolean logic with broadcasting. Inputs: a, b (bool).
    Logic(logic::LogicOp),
    /// Boolean negation. Inputs: x (bool).
    Not(logic::Not),
    /// Element type conversion. Inputs: x.
    Cast(logic::Cast),
    /// A copy of its input. Inputs: x.
    Identity(logic::Identity),
    /// One token per row of logits, greedy or sampled on the device. Inputs: logits, params.
    Sample(sample::Sample),
}

/// What [`CausalMask`] writes into hidden positions: the most negative finite f32, so that
/// `exp(x - max)` underflows to 0 in softmax without producing NaN from `inf - inf`.
pub const MASK_VALUE: f32 = f32::MIN;

impl Op {
    /// Short lower-case name ([`OpDef::name`]).
    pub fn name(&self) -> &'static str {
        self.def().name()
    }

    /// `(min, max)` inputs ([`OpDef::arity`]).
    pub fn arity(&self) -> (usize, usize) {
        self.def().arity()
    }

    /// Input positions whose values the shape rule needs ([`OpDef::shape_data_inputs`]).
    pub fn shape_data_inputs(&self) -> &'static [usize] {
        self.def().shape_data_inputs()
    }

    /// Whether the output shape is always input 0's ([`OpDef::preserves_shape`]).
    pub fn preserves_shape(&self) -> bool {
        self.def().preserves_shape()
    }

    /// The output element type ([`OpDef::output_dtype`]).
    ///
    /// # Errors
    /// [`DTypeError`] for an input type the op does not accept.
    pub fn output_dtype(&self, inputs: &[DType]) -> Result<DType, DTypeError> {
        self.def().output_dtype(inputs)
    }

    /// The output shape ([`OpDef::infer`]).
    ///
    /// # Errors
    /// [`InferError`] when the inputs do not fit the op.
    pub fn infer(&self, inputs: &[&Shape], data: &[Option<&[i64]>]) -> Result<Shape, InferError> {
        self.def().infer(inputs, data)
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

/// The dtype rule of ops that take f32 only: every input f32, output f32.
pub(crate) fn all_f32(inputs: &[DType]) -> Result<DType, DTypeError> {
    match inputs.iter().position(|&d| d != DType::F32) {
        Some(i) => Err(DTypeError::at(i, "f32")),
        None => Ok(DType::F32),
    }
}

/// The dtype rule of data movement: any element type that is not block-quantized (blocks
/// cannot be cut at element boundaries), every input of input 0's type.
pub(crate) fn same_plain_type(inputs: &[DType]) -> Result<DType, DTypeError> {
    let first = *inputs.first().ok_or(DTypeError::at(0, "an input"))?;
    for (i, &d) in inputs.iter().enumerate() {
        if d.block().is_some() {
            return Err(DTypeError::at(i, "a type that is not block-quantized"));
        }
        if d != first {
            return Err(DTypeError::at(i, "the same type as input 0"));
        }
    }
    Ok(first)
}

/// Whether `d` is an integer type usable as indices or shape values.
pub(crate) fn is_index(d: DType) -> bool {
    matches!(d, DType::I32 | DType::U32 | DType::I64)
}

/// Resolves an ONNX axis against a rank: `axis` in `[-rank, rank)`, negative counting from the
/// end.
///
/// # Errors
/// [`InferError::Axis`] when it is out of range.
pub fn axis_index(axis: i64, rank: usize) -> Result<usize, InferError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(InferError::Axis { axis, rank })
    }
}

/// Resolves a list of distinct ONNX axes against a rank ([`axis_index`] each).
///
/// # Errors
/// [`InferError::Axes`] naming the shape for an axis out of range or listed twice.
pub fn axes_indices(axes: &[i64], shape: &Shape, rank: usize) -> Result<Vec<usize>, InferError> {
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let bad = |reason| InferError::Axes {
            axes: axes.to_vec(),
            shape: shape.clone(),
            reason,
        };
        let i = axis_index(a, rank).map_err(|_| bad("an axis is out of range"))?;
        if std::mem::replace(&mut seen[i], true) {
            return Err(bad("an axis is listed twice"));
        }
        out.push(i);
    }
    Ok(out)
}
