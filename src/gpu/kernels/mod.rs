//! Compute kernels for the graph ops: one file per kernel family, each holding its
//! `#[repr(C)]` uniform structs, its `include_str!` of `shaders/<family>.wgsl`, its
//! [`Family`] (entry points and their bindings) and the [`Kernel`] implementations of the ops
//! it serves; this file holds what they share and the one registry that maps an op to its
//! kernel ([`kernel_of`]).
//!
//! * [`Kernels`] owns the shader modules and a pipeline cache keyed by [`PipelineKey`]
//!   (family, entry point, specialisation constant); every lookup counts as a hit or a miss
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
//! grouped-query attention); [`layout`] (the kernels' own index arithmetic), [`encoder`],
//! [`plan`] (dispatch plans), [`uniforms`].

pub mod attention;
pub mod cnn;
pub mod elementwise;
pub mod encoder;
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
pub mod uniforms;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::gpu::{Buffer, BufferUid, Gpu};
use crate::graph::Op;
use crate::memory::AllocKind;
use crate::shape::{DType, Shape};
use encoder::BindKey;
pub use encoder::{Bound, Encoder};
pub use plan::DispatchPlan;
use plan::Recorder;
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
    /// The pipeline key of `entry` of this family, without a specialisation constant.
    pub fn key(&'static self, entry: &'static str) -> PipelineKey {
        PipelineKey {
            family: self,
            entry,
            constant: None,
        }
    }
}

/// Every kernel family: one line per family.
pub const FAMILIES: [&Family; 11] = [
    &elementwise::FAMILY,
    &logic::FAMILY,
    &matmul::FAMILY,
    &quant::FAMILY,
    &reduce::FAMILY,
    &movement::FAMILY,
    &mask::FAMILY,
    &generate::FAMILY,
    &cnn::FAMILY,
    &rotary::FAMILY,
    &attention::FAMILY,
];

/// The kernel of an op: one line per op (inputs and constants have none, their values are
/// uploaded). The compiler makes sure a new [`Op`] variant gets its line here.
pub fn kernel_of(op: &Op) -> Option<&dyn Kernel> {
    Some(match op {
        Op::Input(_) | Op::Constant(_) => return None,
        Op::MatMul(o) => o,
        Op::Linear(o) => o,
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
        Op::Compare(o) => o,
        Op::Logic(o) => o,
        Op::Not(o) => o,
        Op::Cast(o) => o,
        Op::Identity(o) => o,
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

/// What a compiled pipeline is keyed by: family, entry point, and the one pipeline-overridable
/// constant that specialises it (the elementwise operator), if any. Shapes are never part of
/// the key: they travel in the uniform.
#[derive(Debug, Clone)]
pub struct PipelineKey {
    /// The WGSL file.
    pub family: &'static Family,
    /// The entry point.
    pub entry: &'static str,
    /// `(override name, value)`.
    pub constant: Option<(&'static str, u32)>,
}

impl PartialEq for PipelineKey {
    fn eq(&self, o: &Self) -> bool {
        self.family.name == o.family.name && self.entry == o.entry && self.constant == o.constant
    }
}

impl Eq for PipelineKey {}

impl Hash for PipelineKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.family.name.hash(h);
        self.entry.hash(h);
        self.constant.hash(h);
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
}

impl<'a> Operand<'a> {
    /// A contiguous row-major operand.
    pub fn contiguous(tensor: TensorRef<'a>, shape: &'a Shape, dtype: DType) -> Self {
        Operand {
            tensor,
            shape,
            dtype,
            strides: None,
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
    /// A uniform chunk, the unused-slot pad or the scratch of aliased operands could not be
    /// allocated.
    #[error("uniform slots: {0}")]
    Uniforms(String),
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

/// Pipeline cache counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct CacheStats {
    /// Lookups that found a compiled pipeline.
    pub hits: u64,
    /// Lookups that compiled one.
    pub misses: u64,
    /// Pipelines held.
    pub pipelines: usize,
}

/// Most storage bindings of one entry point (batch norm: x, four statistics, the output;
/// WebGPU guarantees 8 per stage).
pub(crate) const MAX_STORAGE_BINDINGS: usize = 6;
/// Bind groups cached at most; the cache is emptied when it would grow past this, so a
/// caller that never calls [`Kernels::forget_bind_groups`] still holds a bounded number.
const MAX_CACHED_BIND_GROUPS: usize = 4096;

type Layouts = HashMap<&'static [u32], (wgpu::BindGroupLayout, wgpu::PipelineLayout)>;

/// Shader modules, layouts and the pipeline cache of one device.
pub struct Kernels {
    pub(crate) device: wgpu::Device,
    /// By family name and whether the module has wgpu's bounds checks.
    modules: HashMap<(&'static str, bool), wgpu::ShaderModule>,
    layouts: Layouts,
    pipelines: HashMap<PipelineKey, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
    stats: CacheStats,
    /// Bind groups made by earlier dispatches, reused while the same buffers are bound at the
    /// same ranges (decode re-records identical dispatches every iteration). A cached group
    /// keeps its buffers alive, which is why callers that free buffers call
    /// [`Kernels::forget_bind_groups_binding`] and the map is capped.
    pub(crate) bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// Bumped whenever a setting that shapes dispatches changes: recordings of an older
    /// generation must not be replayed.
    generation: u64,
    pub(crate) max_workgroups_per_dim: u32,
    pub(crate) quant_layout: quant::QuantLayout,
    pub(crate) storage_align_bytes: u64,
    pub(crate) max_binding_bytes: u64,
}

impl Kernels {
    /// The kernels of `gpu`'s device (shader modules and pipelines are created on first use).
    pub fn new(gpu: &Gpu) -> Self {
        let device = gpu.device();
        let limits = device.limits();
        Kernels {
            device: device.clone(),
            modules: HashMap::new(),
            layouts: HashMap::new(),
            pipelines: HashMap::new(),
            stats: CacheStats::default(),
            bind_groups: HashMap::new(),
            generation: 0,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension.max(1),
            quant_layout: quant::QuantLayout::for_device(gpu.adapter_info().device_type),
            storage_align_bytes: u64::from(limits.min_storage_buffer_offset_alignment).max(4),
            max_binding_bytes: limits.max_storage_buffer_binding_size,
        }
    }

    /// Lowers the per-dimension workgroup limit used to shape dispatch grids (never above the
    /// device's). Tests use it to exercise the 2-D grid on small tensors.
    pub fn set_max_workgroups_per_dim(&mut self, max: u32) {
        self.max_workgroups_per_dim =
            max.clamp(1, self.device.limits().max_compute_workgroups_per_dimension);
        self.generation += 1;
    }

    /// Overrides how the quantized-weight kernels spread their work (chosen from the adapter's
    /// device type by [`Kernels::new`]); tests use it to run both layouts on one adapter.
    pub fn set_quant_layout(&mut self, layout: quant::QuantLayout) {
        self.quant_layout = layout;
        self.generation += 1;
    }

    /// How the quantized-weight kernels spread their work ([`Kernels::set_quant_layout`]).
    pub fn quant_layout(&self) -> quant::QuantLayout {
        self.quant_layout
    }

    /// Changes whenever dispatches recorded earlier may no longer be what [`Kernels::encode`]
    /// would record for the same operands.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Counts `n` dispatches a caller recorded again from a [`DispatchPlan`] as pipeline cache
    /// hits (they reuse a cached pipeline without a lookup).
    pub(crate) fn count_replayed(&mut self, n: u64) {
        self.stats.hits += n;
    }

    /// Pipeline cache counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            pipelines: self.pipelines.len(),
            ..self.stats
        }
    }

    /// The pipeline for `key`, compiled on a miss.
    pub(crate) fn pipeline(
        &mut self,
        key: &PipelineKey,
    ) -> (wgpu::ComputePipeline, wgpu::BindGroupLayout) {
        if let Some(p) = self.pipelines.get(key) {
            self.stats.hits += 1;
            return p.clone();
        }
        self.stats.misses += 1;
        let storage = (key.family.bindings)(key.entry);
        let device = &self.device;
        let (bgl, layout) = self
            .layouts
            .entry(storage)
            .or_insert_with(|| make_layout(device, storage))
            .clone();
        let family = key.family;
        let checked = !family.unchecked.contains(&key.entry);
        let module = self
            .modules
            .entry((family.name, checked))
            .or_insert_with(|| {
                let desc = wgpu::ShaderModuleDescriptor {
                    label: Some(family.name),
                    source: wgpu::ShaderSource::Wgsl((family.source)().into()),
                };
                if checked {
                    device.create_shader_module(desc)
                } else {
                    let mut checks = wgpu::ShaderRuntimeChecks::checked();
                    checks.bounds_checks = false;
                    // SAFETY: only the entry points a family lists in `unchecked` are made
                    // from this module, and the family shows that every storage index they
                    // compute lies within the range its encode binds (every other runtime
                    // check stays on).
                    unsafe { device.create_shader_module_trusted(desc, checks) }
                }
            });
        let constants: Vec<(&str, f64)> = key
            .constant
            .iter()
            .map(|&(n, v)| (n, f64::from(v)))
            .collect();
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key.entry),
            layout: Some(&layout),
            module,
            entry_point: Some(key.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        self.pipelines
            .insert(key.clone(), (pipeline.clone(), bgl.clone()));
        (pipeline, bgl)
    }

    pub(crate) fn cache_bind_group(&mut self, key: BindKey, bg: wgpu::BindGroup) {
        if self.bind_groups.len() >= MAX_CACHED_BIND_GROUPS {
            self.bind_groups.clear();
        }
        self.bind_groups.insert(key, bg);
    }

    /// Drops every cached bind group (and with them the references they hold to bound
    /// buffers). Call after freeing or replacing buffers that dispatches bound, so freed
    /// memory is not kept alive by the cache.
    pub fn forget_bind_groups(&mut self) {
        self.bind_groups.clear();
    }

    /// Drops the cached bind groups that bind any of `buffers` (call before freeing or
    /// replacing them; groups of other buffers stay cached).
    pub fn forget_bind_groups_binding(&mut self, buffers: &[BufferUid]) {
        self.bind_groups.retain(|key, _| {
            !key.bound
                .iter()
                .flatten()
                .any(|(b, _, _)| buffers.contains(b))
        });
    }

    /// Bind groups currently cached.
    pub fn cached_bind_groups(&self) -> usize {
        self.bind_groups.len()
    }

    /// Records the dispatches computing `op` from `inputs` into `output` (shapes concrete,
    /// output shape as inferred; for a `reshape_to` input 1 is shape data and is not read).
    /// Returns the number of dispatches recorded (0 for an empty output).
    ///
    /// # Errors
    /// [`KernelError`]: no kernel for the op, operands that disagree with the op's shape or
    /// the kernel's dtype rule, ranges too small, limits exceeded.
    pub fn encode(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        uniforms: &mut UniformArena,
        op: &Op,
        inputs: &[Operand<'_>],
        output: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        self.encode_with(pass, uniforms, op, inputs, output, None)
    }

    /// [`Kernels::encode`], also appending every dispatch to `recorder.dispatches` so the
    /// caller can record them again while the operands stay the same, and skipping
    /// `set_pipeline` when `recorder.current` is already bound in `pass` (then updated).
    pub(crate) fn encode_recorded(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        uniforms: &mut UniformArena,
        op: &Op,
        inputs: &[Operand<'_>],
        output: &Operand<'_>,
        recorder: &mut Recorder,
    ) -> Result<usize, KernelError> {
        self.encode_with(pass, uniforms, op, inputs, output, Some(recorder))
    }

    /// Records [`movement::encode_index_check`]: the device check of a gather's indices
    /// `ids` against an axis of `rows` entries, its fault record at `fault`.
    pub(crate) fn encode_index_check(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        uniforms: &mut UniformArena,
        ids: &Operand<'_>,
        rows: u64,
        fault: &Operand<'_>,
        recorder: &mut Recorder,
    ) -> Result<usize, KernelError> {
        let mut e = Encoder {
            kernels: self,
            pass,
            uniforms,
            recorder: Some(recorder),
        };
        movement::encode_index_check(&mut e, ids, rows, fault)
    }

    fn encode_with(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        uniforms: &mut UniformArena,
        op: &Op,
        inputs: &[Operand<'_>],
        output: &Operand<'_>,
        recorder: Option<&mut Recorder>,
    ) -> Result<usize, KernelError> {
        let name = op.name();
        let kernel = kernel_of(op).ok_or(KernelError::NotAKernel { op: name })?;
        let (min, max) = op.arity();
        if inputs.len() < min || inputs.len() > max {
            return Err(KernelError::Arity {
                op: name,
                got: inputs.len(),
                expected: min,
            });
        }
        // Up to 4 inputs on the stack: this runs for every dispatch (no heap on the hot path);
        // only a wider concat collects into a Vec.
        let mut few_shapes: [&Shape; 4] = [output.shape; 4];
        let mut few_types = [output.dtype; 4];
        let many_shapes: Vec<&Shape>;
        let many_types: Vec<DType>;
        let (shapes, types): (&[&Shape], &[DType]) = if inputs.len() <= few_shapes.len() {
            for ((s, t), o) in few_shapes.iter_mut().zip(&mut few_types).zip(inputs) {
                *s = o.shape;
                *t = o.dtype;
            }
            (&few_shapes[..inputs.len()], &few_types[..inputs.len()])
        } else {
            many_shapes = inputs.iter().map(|o| o.shape).collect();
            many_types = inputs.iter().map(|o| o.dtype).collect();
            (&many_shapes, &many_types)
        };
        kernel
            .check_dtypes(types, output.dtype)
            .map_err(|expected| KernelError::DType {
                op: name,
                inputs: types.to_vec(),
                output: output.dtype,
                expected,
            })?;
        // Re-infer so a caller's shape mistake is an error, not a wrong dispatch (an op whose
        // shape rule needs input values, such as a reshape_to's target, was inferred by the
        // caller from host values the kernel never sees).
        if op.shape_data_inputs().is_empty() {
            let expected = op.infer(shapes, &[]).map_err(|source| KernelError::Infer {
                op: name,
                cause: source,
            })?;
            if &expected != output.shape {
                return Err(KernelError::OutputShape {
                    op: name,
                    expected,
                    got: output.shape.clone(),
                });
            }
        }
        for (i, o) in inputs.iter().enumerate() {
            if o.strides.is_some_and(|s| s.len() != o.shape.rank()) {
                return Err(KernelError::Strided {
                    op: name,
                    input: i,
                    reason: "strides do not match the rank",
                });
            }
            if o.is_strided() && !kernel.reads_strided(i) {
                return Err(KernelError::Strided {
                    op: name,
                    input: i,
                    reason: "the kernel reads this input contiguously",
                });
            }
        }
        if output.is_strided() {
            return Err(KernelError::Strided {
                op: name,
                input: inputs.len(),
                reason: "outputs are written contiguously",
            });
        }
        if layout::numel("output", output.shape)? == 0 {
            return Ok(0);
        }
        let mut e = Encoder {
            kernels: self,
            pass,
            uniforms,
            recorder,
        };
        kernel.encode(&mut e, inputs, output)
    }
}

fn make_layout(
    device: &wgpu::Device,
    storage: &[u32],
) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: true,
            min_binding_size: None,
        },
        count: None,
    }];
    entries.extend(storage.iter().map(|&b| wgpu::BindGroupLayoutEntry {
        binding: b,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only: false },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }));
    let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("dynrt kernel bind group layout"),
        entries: &entries,
    });
    let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("dynrt kernel pipeline layout"),
        bind_group_layouts: &[Some(&bgl)],
        immediate_size: 0,
    });
    (bgl, layout)
}

/// The dtype rule of kernels written for f32 only.
pub(crate) fn f32_only(inputs: &[DType], output: DType) -> Result<(), &'static str> {
    if output == DType::F32 && inputs.iter().all(|&d| d == DType::F32) {
        Ok(())
    } else {
        Err("f32 tensors")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_validates_with_naga_and_names_its_entries() {
        let mut entries = 0;
        for f in FAMILIES {
            let m = crate::gpu::validate_wgsl((f.source)())
                .unwrap_or_else(|e| panic!("{}: {e}", f.name));
            for ep in &m.entry_points {
                assert!(
                    ep.name.starts_with(&format!("{}_", f.name)),
                    "entry {} in {}",
                    ep.name,
                    f.name
                );
                assert!(!(f.bindings)(&ep.name).is_empty(), "{}", ep.name);
                entries += 1;
            }
        }
        assert!(entries >= 10, "found {entries} entry points");
    }

    /// Every uniform struct of every shader (`struct *Params`) with the Rust struct that
    /// fills it: the size naga's layouter gives the WGSL struct must be the Rust struct's, and
    /// a WGSL uniform struct missing from this list fails the test.
    #[test]
    fn every_uniform_struct_matches_its_wgsl_layout() {
        use std::mem::size_of;
        let rust: &[(&str, &str, usize)] = &[
            (
                "attention",
                "RopeParams",
                size_of::<attention::RopeParams>(),
            ),
            ("attention", "GqaParams", size_of::<attention::GqaParams>()),
            ("cnn", "PoolParams", size_of::<cnn::PoolParams>()),
            ("cnn", "BnParams", size_of::<cnn::BnParams>()),
            (
                "elementwise",
                "BroadcastParams",
                size_of::<elementwise::BroadcastParams>(),
            ),
            (
                "elementwise",
                "FlatParams",
                size_of::<elementwise::FlatParams>(),
            ),
            (
                "generate",
                "RangeParams",
                size_of::<generate::RangeParams>(),
            ),
            (
                "generate",
                "TriluParams",
                size_of::<generate::TriluParams>(),
            ),
            // The logic and mask families are filled with the elementwise struct.
            (
                "logic",
                "TypedParams",
                size_of::<elementwise::BroadcastParams>(),
            ),
            ("mask", "CausalParams", size_of::<mask::CausalParams>()),
            (
                "mask",
                "BroadcastParams",
                size_of::<elementwise::BroadcastParams>(),
            ),
            ("matmul", "MatMulParams", size_of::<matmul::MatMulParams>()),
            ("matmul", "ConvParams", size_of::<matmul::ConvParams>()),
            (
                "matmul",
                "EpilogueParams",
                size_of::<matmul::EpilogueParams>(),
            ),
            ("movement", "CopyParams", size_of::<movement::CopyParams>()),
            (
                "movement",
                "GatherParams",
                size_of::<movement::GatherParams>(),
            ),
            (
                "movement",
                "CheckIdsParams",
                size_of::<movement::CheckIdsParams>(),
            ),
            ("movement", "FillParams", size_of::<movement::FillParams>()),
            (
                "movement",
                "SplatParams",
                size_of::<movement::SplatParams>(),
            ),
            (
                "movement",
                "SliceParams",
                size_of::<movement::SliceParams>(),
            ),
            ("quant", "LinearParams", size_of::<quant::LinearParams>()),
            ("quant", "GatherParams", size_of::<quant::GatherParams>()),
            ("reduce", "RowParams", size_of::<reduce::RowParams>()),
            ("reduce", "AxesParams", size_of::<reduce::AxesParams>()),
            ("reduce", "CumParams", size_of::<reduce::CumParams>()),
            ("rotary", "RotaryParams", size_of::<rotary::RotaryParams>()),
            (
                "fill",
                "FillParams",
                size_of::<crate::gpu::pipeline::FillParams>(),
            ),
        ];
        let sources = FAMILIES
            .iter()
            .map(|f| (f.name, (f.source)()))
            .chain([("fill", crate::gpu::pipeline::FILL_WGSL)]);
        let mut seen = 0;
        for (family, source) in sources {
            let module = crate::gpu::validate_wgsl(source).unwrap();
            let mut layouter = naga::proc::Layouter::default();
            layouter.update(module.to_ctx()).unwrap();
            for (handle, ty) in module.types.iter() {
                let naga::TypeInner::Struct { span, .. } = ty.inner else {
                    continue;
                };
                let Some(name) = ty.name.as_deref().filter(|n| n.ends_with("Params")) else {
                    continue;
                };
                let &(_, _, bytes) = rust
                    .iter()
                    .find(|(f, n, _)| *f == family && *n == name)
                    .unwrap_or_else(|| {
                        panic!("{family}: WGSL struct {name} has no Rust struct in this list")
                    });
                assert_eq!(layouter[handle].size, span, "{family}: {name}");
                assert_eq!(
                    span as usize, bytes,
                    "{family}: WGSL struct {name} is {span} bytes, its Rust struct {bytes}"
                );
                // A uniform's size must be a multiple of 16 bytes.
                assert_eq!(bytes % 16, 0, "{family}: {name}");
                seen += 1;
            }
        }
        assert_eq!(
            seen,
            rust.len(),
            "every listed struct is found in its shader"
        );
    }
}
