//! Compute kernels for the graph ops: one file per kernel family, each holding its
//! `#[repr(C)]` uniform structs, its source (`shaders/<family>.wgsl` after the prelude that
//! every shader shares, [`crate::gpu::PRELUDE_WGSL`]), its [`Family`] (entry points and their
//! bindings) and the [`Kernel`] implementations of the ops it serves; this file holds what
//! they share and the one registry that maps an op to its kernel ([`kernel_of`]).
//!
//! * [`Kernels`] owns the shader modules and a pipeline cache keyed by [`PipelineKey`]
//!   (family, entry point, specialisation constants); every lookup counts as a hit or a miss
//!   ([`Kernels::stats`]) — the runtime's `update_impl`
//!   (the pipeline lookup of an iteration, docs/design.md).
//! * [`Kernels::encode`] records the dispatches of one op into a compute pass, given its
//!   operands as [`Operand`]s: a byte range of an engine [`Buffer`] plus the concrete shape
//!   and type. Tensors are sub-ranges of arena buffers bound `read_write` (docs/design.md). A
//!   binding offset must be a multiple of `min_storage_buffer_offset_alignment`, so the
//!   kernels bind the aligned-down offset and pass the remainder as an element offset in the
//!   uniform: any 4-byte aligned `offset_bytes` works ([`Encoder::bind`]).
//! * Every dispatch gets its own uniform slot from a [`UniformArena`] (engine buffers, counted
//!   as `cl_mem`); call [`UniformArena::flush`] before submitting.
//! * A kernel states the element types it runs on ([`Kernel::check_dtypes`]): a network whose
//!   node would need another is refused when it compiles, naming the node (never float maths
//!   on integer bits).
//! * Size-0 outputs record no dispatch.
//!
//! Files: [`elementwise`], [`logic`] (typed elementwise: integers, bools, casts), [`matmul`]
//! (matmul, gemm, and convolution as an implicit GEMM on the same tiles), [`quant`] (linear
//! and gather on quantized weights), [`reduce`] (row normalisations, reductions over any
//! axes, cumulative sum), [`movement`], [`mask`], [`generate`] (range, trilu), [`cnn`]
//! (pooling, batch norm), [`rotary`] (ONNX's RotaryEmbedding), [`attention`] (RoPE,
//! grouped-query attention), [`sample`] (the next token from rows of logits); [`layout`] (the kernels' own index arithmetic), [`encoder`],
//! [`plan`] (dispatch plans), [`uniforms`]; `cache` ([`Kernels`]); [`fill`] (a ramp written
//! outside any graph, for examples and device checks).

pub mod attention;
mod cache;
pub mod cnn;
pub mod elementwise;
pub mod encoder;
pub mod fill;
pub mod generate;
pub mod layout;
pub mod logic;
pub mod mask;
pub mod matmul;
pub mod movement;
pub mod plan;
pub mod quant;
pub mod reduce;
pub mod rotary;
#[cfg(not(target_arch = "wasm32"))]
pub mod run;
pub mod sample;
pub mod uniforms;

use std::hash::{Hash, Hasher};

use crate::gpu::Buffer;
use crate::graph::Op;
use crate::memory::AllocKind;
use crate::shape::{DType, Shape};
pub use cache::{CacheStats, Kernels};
pub use encoder::{Bound, Encoder};
pub use plan::DispatchPlan;
pub use uniforms::UniformArena;

/// A kernel family: one WGSL file and the storage bindings of each of its entry points
/// (binding 0 is always the uniform).
#[derive(Debug)]
pub struct Family {
    /// The file stem (`shaders/<name>.wgsl`); entry points are named `<name>_<variant>`.
    pub name: &'static str,
    /// The WGSL source (composed once, for families whose file is completed from a table:
    /// `quant` adds the weight formats' decoders).
    pub source: fn() -> &'static str,
    /// Storage binding numbers of an entry point.
    pub bindings: fn(&str) -> &'static [u32],
    /// Entry points compiled without wgpu's runtime bounds checks (from a second module of
    /// the same source): only those whose every storage index is within its binding by
    /// construction, which the family's file shows. On adapters without robustBufferAccess2
    /// (SwiftShader) wgpu clamps each storage index, which made a streaming add cost much more
    /// CPU time (docs/benchmarks/2026-11-22-elementwise-swiftshader.md); where the driver
    /// bounds accesses itself (lavapipe) nothing changes.
    pub unchecked: &'static [&'static str],
}

impl Family {
    /// The pipeline key of `entry` of this family, without specialisation constants (add them
    /// with [`PipelineKey::with`]).
    pub fn key(&'static self, entry: &'static str) -> PipelineKey {
        PipelineKey {
            family: self,
            entry,
            constants: [None; MAX_CONSTANTS],
        }
    }
}

/// Every kernel family: one line per family.
pub const FAMILIES: [&Family; 15] = [
    &elementwise::FAMILY,
    &logic::FAMILY,
    &matmul::FAMILY,
    &quant::FAMILY,
    &quant::FAMILY_X4,
    &quant::FAMILY_SG,
    &reduce::FAMILY,
    &movement::FAMILY,
    &mask::FAMILY,
    &generate::FAMILY,
    &cnn::FAMILY,
    &rotary::FAMILY,
    &attention::FAMILY,
    &sample::FAMILY,
    &attention::FAMILY_GQA,
];

/// Every WGSL source dynrt compiles, by the stem of its file (`shaders/<stem>.wgsl`): each
/// kernel family's ([`FAMILIES`]) and `fill`'s, as their
/// pipelines get it (the prelude, the file, and for `quant` the formats' decoders).
pub fn shader_sources() -> impl Iterator<Item = (&'static str, &'static str)> {
    FAMILIES
        .iter()
        .map(|f| (f.name, (f.source)()))
        .chain([("fill", fill::FILL_WGSL)])
}

/// The kernel of an op: one line per op (inputs and constants have none, their values are
/// uploaded). The compiler makes sure a new [`Op`] variant gets its line here.
pub fn kernel_of(op: &Op) -> Option<&dyn Kernel> {
    Some(match op {
        Op::Input(_) | Op::Constant(_) => return None,
        Op::MatMul(o) => o,
        Op::Linear(o) => o,
        Op::FusedLinear(o) => o,
        Op::Binary(o) => o,
        Op::Unary(o) => o,
        Op::Softmax(o) => o,
        Op::LayerNorm(o) => o,
        Op::RmsNorm(o) => o,
        Op::Reshape(o) => o,
        Op::ReshapeTo(o) => o,
        Op::Transpose(o) => o,
        Op::Concat(o) => o,
        Op::Slice(o) => o,
        Op::Gather(o) => o,
        Op::Where(o) => o,
        Op::CausalMask(o) => o,
        Op::ShapeOf(o) => o,
        Op::SizeOf(o) => o,
        Op::SliceTo(o) => o,
        Op::SplitPart(o) => o,
        Op::Expand(o) => o,
        Op::Squeeze(o) => o,
        Op::Unsqueeze(o) => o,
        Op::Flatten(o) => o,
        Op::ConstantOfShape(o) => o,
        Op::Range(o) => o,
        Op::Trilu(o) => o,
        Op::Reduce(o) => o,
        Op::CumSum(o) => o,
        Op::Gemm(o) => o,
        Op::Conv(o) => o,
        Op::Pool(o) => o,
        Op::BatchNorm(o) => o,
        Op::RotaryEmbedding(o) => o,
        Op::Rope(o) => o,
        Op::Attention(o) => o,
        Op::PagedAttention(o) => o,
        Op::ScatterRows(o) => o,
        // Written by the kernel of the fused projection it reads (`Role::KvRows`).
        Op::KvRows(_) => return None,
        Op::Compare(o) => o,
        Op::Logic(o) => o,
        Op::Not(o) => o,
        Op::Cast(o) => o,
        Op::Identity(o) => o,
        Op::Sample(o) => o,
    })
}

/// An op's GPU kernel: which element types it runs on, and how it records its dispatches.
/// Implemented in the op's family file.
pub trait Kernel {
    /// Whether the kernel runs on these input and output types; `Err` says what it needs
    /// (checked when a network compiles and again when a dispatch is encoded).
    ///
    /// # Errors
    /// A description of the types the kernel accepts.
    fn check_dtypes(&self, inputs: &[DType], output: DType) -> Result<(), &'static str>;

    /// Operands the runtime passes after the op's inputs: what the kernel writes besides its
    /// output (a fused projection's key and value rows, into the KV cache).
    fn extra_operands(&self) -> usize {
        0
    }

    /// Whether the kernel reads input `input` through its [`Operand::strides`] (a strided view
    /// such as a padded KV cache); `false` (the default) means the runtime must hand it a
    /// contiguous tensor. Kernels that read strided inputs: matmul (both sides), and the
    /// strided copies of the movement family (reshape, transpose, slice, concat).
    fn reads_strided(&self, input: usize) -> bool {
        let _ = input;
        false
    }

    /// Records the dispatches computing the op from `inputs` into `output` (shapes already
    /// checked against the op's shape rule, output not empty). Returns the dispatch count.
    ///
    /// # Errors
    /// [`KernelError`] for ranges too small, limits exceeded.
    fn encode(
        &self,
        e: &mut Encoder<'_, '_>,
        inputs: &[Operand<'_>],
        output: &Operand<'_>,
    ) -> Result<usize, KernelError>;
}

/// Most pipeline-overridable constants one pipeline is specialised by.
pub const MAX_CONSTANTS: usize = 5;

/// What a compiled pipeline is keyed by: family, entry point, and the pipeline-overridable
/// constants that specialise it (the elementwise operator and `ALIGNED`, the pooling kind,
/// the weight format...). Shapes are never part of the key: they travel in the uniform.
#[derive(Debug, Clone)]
pub struct PipelineKey {
    /// The WGSL file.
    pub family: &'static Family,
    /// The entry point.
    pub entry: &'static str,
    /// `(override name, value)` pairs in the order they were added, then `None`s; a WGSL
    /// `bool` override takes 0 or 1.
    pub constants: [Option<(&'static str, u32)>; MAX_CONSTANTS],
}

impl PipelineKey {
    /// The key with override `name` set to `value` as well.
    ///
    /// # Panics
    /// If the key holds [`MAX_CONSTANTS`] constants already: which constants a kernel sets is
    /// fixed in its code, never chosen by its input.
    pub fn with(mut self, name: &'static str, value: u32) -> Self {
        let Some(free) = self.constants.iter_mut().find(|c| c.is_none()) else {
            panic!(
                "{}: more than {MAX_CONSTANTS} pipeline constants",
                self.entry
            );
        };
        *free = Some((name, value));
        self
    }
}

impl PartialEq for PipelineKey {
    fn eq(&self, o: &Self) -> bool {
        self.family.name == o.family.name && self.entry == o.entry && self.constants == o.constants
    }
}

impl Eq for PipelineKey {}

impl Hash for PipelineKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.family.name.hash(h);
        self.entry.hash(h);
        self.constants.hash(h);
    }
}

/// A byte range of an engine buffer holding one tensor.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// The buffer (a bindable kind).
    pub buffer: &'a Buffer,
    /// Start of the tensor in the buffer, a multiple of 4.
    pub offset_bytes: u64,
    /// Bytes available from `offset_bytes`: at least the tensor's size rounded up to a whole
    /// 4-byte word (kernels of 1- and 2-byte types read and write the words their elements
    /// share, as the runtime allocates them).
    pub size_bytes: u64,
}

/// A tensor operand of a kernel: where it is, its concrete shape and element type, and, for a
/// strided view, its strides.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    /// Where the values are.
    pub tensor: TensorRef<'a>,
    /// Concrete shape.
    pub shape: &'a Shape,
    /// Element type.
    pub dtype: DType,
    /// Element strides per dimension, from `tensor.offset_bytes`, when the tensor is a
    /// strided view of its buffer (a KV cache with a padded sequence axis, a transposed view
    /// of one); `None` is row-major and contiguous. Only kernels whose
    /// [`Kernel::reads_strided`] says so take a strided input; outputs are always contiguous.
    pub strides: Option<&'a [u64]>,
    /// How a weight's blocks lie in the buffer: [`WeightLayout::File`] for every operand but
    /// the weights the runtime reordered (read only by the `quant` kernels).
    pub layout: WeightLayout,
}

/// The layout of a block-quantized weight on the device: the file's blocks, or the grouped
/// planes of its format ([`crate::formats::Grouped`]) that the runtime reorders a weight into
/// when every kernel reading it takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightLayout {
    /// The blocks as the file stores them.
    #[default]
    File,
    /// Grouped planes: [`crate::formats::GROUP_BLOCKS`] blocks per group, field by field.
    Grouped,
}

impl WeightLayout {
    /// The `WEIGHT_LAYOUT` pipeline constant of `shaders/quant.wgsl`.
    pub fn code(self) -> u32 {
        match self {
            WeightLayout::File => 0,
            WeightLayout::Grouped => 1,
        }
    }
}

impl<'a> Operand<'a> {
    /// A contiguous row-major operand.
    pub fn contiguous(tensor: TensorRef<'a>, shape: &'a Shape, dtype: DType) -> Self {
        Operand {
            tensor,
            shape,
            dtype,
            strides: None,
            layout: WeightLayout::File,
        }
    }

    /// Whether the operand is a strided view that is not row-major contiguous (explicit
    /// strides equal to the row-major ones are contiguous).
    pub fn is_strided(&self) -> bool {
        self.strides
            .is_some_and(|s| !layout::is_row_major(self.shape, s))
    }
}

/// Why a kernel could not be encoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The op has no kernel (inputs and constants are uploaded, not computed).
    #[error("op `{op}` has no kernel: its values are uploaded by the runtime")]
    NotAKernel {
        /// The op name.
        op: &'static str,
    },
    /// The op got the wrong number of operands.
    #[error("op `{op}` got {got} inputs, expected {expected}")]
    Arity {
        /// The op name.
        op: &'static str,
        /// Inputs given.
        got: usize,
        /// Inputs expected.
        expected: usize,
    },
    /// The kernel does not run on these element types.
    #[error("op `{op}` has no kernel for inputs {inputs:?} -> {output}: it needs {expected}")]
    DType {
        /// The op name.
        op: &'static str,
        /// The input types.
        inputs: Vec<DType>,
        /// The output type.
        output: DType,
        /// What the kernel accepts.
        expected: &'static str,
    },
    /// The given output shape is not what the op infers from its inputs.
    #[error("op `{op}` infers output {expected}, but the output operand has shape {got}")]
    OutputShape {
        /// The op name.
        op: &'static str,
        /// What the inputs imply.
        expected: Shape,
        /// What was given.
        got: Shape,
    },
    /// Shape inference rejected the operands.
    #[error("op `{op}`: {cause}")]
    Infer {
        /// The op name.
        op: &'static str,
        /// Why.
        cause: crate::graph::InferError,
    },
    /// A tensor offset is not a multiple of 4 bytes.
    #[error("{what} starts at byte {offset_bytes}, which is not a multiple of 4")]
    Unaligned {
        /// Which operand.
        what: &'static str,
        /// The offset given.
        offset_bytes: u64,
    },
    /// A tensor's buffer cannot be bound to a kernel (`usm_host`).
    #[error("{what} is in a {kind} buffer, which cannot be bound to a kernel")]
    NotBindable {
        /// Which operand.
        what: &'static str,
        /// The buffer's kind.
        kind: AllocKind,
    },
    /// A tensor's byte range is smaller than its shape needs, or runs past its buffer.
    #[error("{what} needs {needed_bytes} bytes at offset {offset_bytes} but only {size_bytes} are available")]
    TooSmall {
        /// Which operand.
        what: &'static str,
        /// Offset given.
        offset_bytes: u64,
        /// Bytes available.
        size_bytes: u64,
        /// Bytes needed.
        needed_bytes: u64,
    },
    /// One binding would exceed `max_storage_buffer_binding_size`.
    #[error("{what} needs a binding of {size_bytes} bytes, above the device limit of {max_bytes}")]
    BindingTooLarge {
        /// Which operand.
        what: &'static str,
        /// Bytes needed.
        size_bytes: u64,
        /// `max_storage_buffer_binding_size`.
        max_bytes: u64,
    },
    /// Element counts or offsets do not fit the kernels' 32-bit indices.
    #[error("{what} has {elements} elements; kernels index with u32 (at most {max})")]
    TooManyElements {
        /// Which operand.
        what: &'static str,
        /// Elements.
        elements: u64,
        /// The largest count supported.
        max: u64,
    },
    /// A tensor has more dimensions than the strided kernels address.
    #[error("rank {rank} is above the kernels' maximum of {max}")]
    RankTooLarge {
        /// The rank.
        rank: usize,
        /// The maximum.
        max: usize,
    },
    /// More workgroups than a 2-D grid of the device's size holds.
    #[error("{workgroups} workgroups exceed the device grid of {max} x {max}")]
    TooManyWorkgroups {
        /// Workgroups needed.
        workgroups: u64,
        /// `max_compute_workgroups_per_dimension`.
        max: u32,
    },
    /// The kernel does not handle these parameters (named, with the limit).
    #[error("op `{op}`: {reason}")]
    Unsupported {
        /// The op name.
        op: &'static str,
        /// What is beyond the kernel, with the numbers.
        reason: String,
    },
    /// A block-quantized weight whose rows do not hold whole blocks (every GGUF tensor
    /// does; the kernels read whole blocks).
    #[error("{what}: K = {k} is not a multiple of the {dtype} block of {block} elements")]
    PartialBlock {
        /// Which operand.
        what: &'static str,
        /// The weight's element type.
        dtype: DType,
        /// The row length.
        k: u64,
        /// Elements per block.
        block: u32,
    },
    /// A uniform chunk, the unused-slot pad, the scratch of aliased operands or a workspace
    /// could not be allocated (the engine's error: over the budget, the driver out of
    /// memory, the device lost).
    #[error("uniform slots: {0}")]
    Uniforms(crate::gpu::AllocError),
    /// Two storage bindings of one dispatch overlap: two outputs, or (a bug in the encoder)
    /// bindings left overlapping. WebGPU rejects writable storage bindings that alias, and
    /// every binding is `read_write` ([`Encoder::dispatch`]).
    #[error(
        "entry point `{entry}` would bind overlapping ranges of one buffer as {first} and {second}"
    )]
    AliasedBindings {
        /// The entry point.
        entry: &'static str,
        /// The first operand's name.
        first: &'static str,
        /// The second operand's name.
        second: &'static str,
    },
    /// A strided input given to a kernel that reads its inputs contiguously (the runtime
    /// copies such inputs into a contiguous tensor first), or strides that do not fit the
    /// operand's rank.
    #[error("op `{op}` input {input}: {reason}")]
    Strided {
        /// The op name.
        op: &'static str,
        /// Input position.
        input: usize,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Most storage bindings of one entry point (a fused linear: x, weights, output, parameters,
/// residual or key rows, integers, RoPE table, value rows; WebGPU guarantees 8 per stage).
pub(crate) const MAX_STORAGE_BINDINGS: usize = 8;

/// The dtype rule of kernels written for f32 only.
pub(crate) fn f32_only(inputs: &[DType], output: DType) -> Result<(), &'static str> {
    if output == DType::F32 && inputs.iter().all(|&d| d == DType::F32) {
        Ok(())
    } else {
        Err("f32 tensors")
    }
}

#[cfg(test)]
mod tests;
