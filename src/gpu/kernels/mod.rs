//! Compute kernels for the graph ops: WGSL pipelines (created once, cached), their uniform
//! blocks, and one encode path per op family.
//!
//! * [`Kernels`] owns the shader modules and a pipeline cache keyed by [`PipelineKey`]
//!   (family, entry point, specialisation constant); every lookup counts as a hit or a miss
//!   ([`Kernels::stats`]) — the runtime's `update_impl`
//!   (`reference/openvino-gpu-dynamic-shape-preprocessing.md`).
//! * [`Kernels::encode`] records the dispatches of one op into a compute pass, given its
//!   operands as [`Operand`]s: a byte range of some buffer plus the concrete shape. Tensors are
//!   sub-ranges of arena buffers bound `read_write` (DESIGN.md §6). A binding offset must be a
//!   multiple of `min_storage_buffer_offset_alignment`, so the kernels bind the aligned-down
//!   offset and pass the remainder as an element offset in the uniform: any 4-byte aligned
//!   `offset_bytes` works.
//! * Every dispatch gets its own uniform slot from a [`UniformArena`]; call
//!   [`UniformArena::flush`] before submitting.
//! * Workgroup counts above `max_compute_workgroups_per_dimension` go to a 2-D grid; kernels
//!   linearise `wid.x + wid.y * num_workgroups.x`.
//! * Size-0 outputs record no dispatch.
//!
//! Files: `shaders/{elementwise,matmul,reduce,movement,mask}.wgsl`; uniform mirrors in
//! [`params`].

pub mod params;
#[cfg(not(target_arch = "wasm32"))]
pub mod run;
mod uniforms;

use std::collections::HashMap;
use std::num::NonZeroU64;

use crate::graph::ops::{elementwise::broadcast_strides, matmul, movement, norm, Op};
use crate::graph::BinaryOp;
use crate::graph::UnaryOp;
use crate::shape::{DType, Shape};
use params::*;
pub use uniforms::UniformArena;

/// `shaders/elementwise.wgsl`.
pub const ELEMENTWISE_WGSL: &str = include_str!("../../../shaders/elementwise.wgsl");
/// `shaders/matmul.wgsl`.
pub const MATMUL_WGSL: &str = include_str!("../../../shaders/matmul.wgsl");
/// `shaders/reduce.wgsl`.
pub const REDUCE_WGSL: &str = include_str!("../../../shaders/reduce.wgsl");
/// `shaders/movement.wgsl`.
pub const MOVEMENT_WGSL: &str = include_str!("../../../shaders/movement.wgsl");
/// `shaders/mask.wgsl`.
pub const MASK_WGSL: &str = include_str!("../../../shaders/mask.wgsl");

/// Device bytes of f32-carried values: f32 bits, or the integer's bits for i32/u32.
pub fn to_device_bytes(values: &[f32], dtype: DType) -> Vec<u8> {
    let words: Vec<u32> = match dtype {
        DType::I32 => values.iter().map(|&v| (v as i32) as u32).collect(),
        DType::U32 => values.iter().map(|&v| v as u32).collect(),
        _ => values.iter().map(|v| v.to_bits()).collect(),
    };
    bytemuck::cast_slice(&words).to_vec()
}

/// f32-carried values from device bytes (inverse of [`to_device_bytes`]).
pub fn from_device_bytes(bytes: &[u8], dtype: DType) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| {
            let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            match dtype {
                DType::I32 => w as i32 as f32,
                DType::U32 => w as f32,
                _ => f32::from_bits(w),
            }
        })
        .collect()
}

/// A kernel family: one WGSL file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Binary and unary elementwise ops.
    Elementwise,
    /// Tiled matmul.
    MatMul,
    /// Softmax, layer norm, RMS norm.
    Reduce,
    /// Copy (reshape, transpose, slice, concat), gather, fill.
    Movement,
    /// Causal mask, where.
    Mask,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 5] = [
        Family::Elementwise,
        Family::MatMul,
        Family::Reduce,
        Family::Movement,
        Family::Mask,
    ];

    /// The WGSL source.
    pub fn source(self) -> &'static str {
        match self {
            Family::Elementwise => ELEMENTWISE_WGSL,
            Family::MatMul => MATMUL_WGSL,
            Family::Reduce => REDUCE_WGSL,
            Family::Movement => MOVEMENT_WGSL,
            Family::Mask => MASK_WGSL,
        }
    }

    /// Lower-case name (the file stem).
    pub fn name(self) -> &'static str {
        match self {
            Family::Elementwise => "elementwise",
            Family::MatMul => "matmul",
            Family::Reduce => "reduce",
            Family::Movement => "movement",
            Family::Mask => "mask",
        }
    }
}

/// What a compiled pipeline is keyed by: family, entry point, and the one pipeline-overridable
/// constant that specialises it (the elementwise operator), if any. Shapes are never part of
/// the key: they travel in the uniform.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    /// The WGSL file.
    pub family: Family,
    /// The entry point.
    pub entry: &'static str,
    /// `(override name, value)`.
    pub constant: Option<(&'static str, u32)>,
}

/// A byte range of a buffer holding one tensor.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// The buffer (needs `STORAGE` usage).
    pub buffer: &'a wgpu::Buffer,
    /// Start of the tensor in the buffer, a multiple of 4.
    pub offset_bytes: u64,
    /// Bytes available from `offset_bytes` (at least the tensor's size).
    pub size_bytes: u64,
}

/// A tensor operand of a kernel: where it is, its concrete shape and element type.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    /// Where the values are.
    pub tensor: TensorRef<'a>,
    /// Concrete shape.
    pub shape: &'a Shape,
    /// Element type.
    pub dtype: DType,
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
    #[error("op `{op}`: {source}")]
    Infer {
        /// The op name.
        op: &'static str,
        /// Why.
        source: crate::graph::InferError,
    },
    /// A tensor offset is not a multiple of 4 bytes.
    #[error("{what} starts at byte {offset_bytes}, which is not a multiple of 4")]
    Unaligned {
        /// Which operand.
        what: &'static str,
        /// The offset given.
        offset_bytes: u64,
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

/// Most storage bindings of one entry point (see `storage_bindings`).
const MAX_STORAGE_BINDINGS: usize = 4;
/// Bind groups cached at most; the cache is emptied when it would grow past this, so a
/// caller that never calls [`Kernels::forget_bind_groups`] still holds a bounded number.
const MAX_CACHED_BIND_GROUPS: usize = 4096;

/// What a bind group is made of: the layout (through the pipeline key), the uniform chunk and
/// the (buffer, offset, size) of every storage binding.
#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    pipeline: PipelineKey,
    uniform: wgpu::Buffer,
    uniform_bytes: u64,
    bound: [Option<(wgpu::Buffer, u64, u64)>; MAX_STORAGE_BINDINGS],
}

struct Bound<'a> {
    buffer: &'a wgpu::Buffer,
    offset: u64,
    size: u64,
}

/// One dispatch as [`Kernels::encode_recorded`] recorded it: everything needed to record it
/// again without the shape checks, the parameter computation and the cache lookups, as long
/// as the operands are the same buffer ranges with the same shapes.
pub(crate) struct RecordedDispatch {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) bind_group: wgpu::BindGroup,
    /// The uniform chunk the bind group binds; a replay must land its slot in this chunk.
    pub(crate) uniform_chunk: wgpu::Buffer,
    /// The uniform parameters (the bytes of the `#[repr(C)]` struct).
    pub(crate) params: Vec<u8>,
    /// Workgroups in x and y.
    pub(crate) workgroups: (u32, u32),
}

/// What [`Kernels::encode_recorded`] reads and updates: the pipeline bound in the pass
/// (`None` for a fresh pass; `set_pipeline` is skipped when a dispatch uses it) and the
/// dispatches recorded so far.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) current: Option<wgpu::ComputePipeline>,
    pub(crate) dispatches: Vec<RecordedDispatch>,
}

/// Shader modules, layouts and the pipeline cache of one device.
pub struct Kernels {
    device: wgpu::Device,
    modules: HashMap<Family, wgpu::ShaderModule>,
    layouts: HashMap<&'static [u32], (wgpu::BindGroupLayout, wgpu::PipelineLayout)>,
    pipelines: HashMap<PipelineKey, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
    stats: CacheStats,
    /// Bind groups made by earlier dispatches, reused while the same buffers are bound at the
    /// same ranges (decode re-records identical dispatches every iteration). The key holds
    /// clones of the bound buffers, so an identity can never be reused by a new buffer while
    /// its entry exists; a cached group keeps its buffers alive, which is why callers that
    /// free buffers call [`Kernels::forget_bind_groups`] and the map is capped.
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// Set only inside [`Kernels::encode_recorded`].
    recorder: Option<Recorder>,
    /// Bumped whenever a setting that shapes dispatches changes: recordings of an older
    /// generation must not be replayed.
    generation: u64,
    max_workgroups_per_dim: u32,
    storage_align_bytes: u64,
    max_binding_bytes: u64,
}

/// Storage binding numbers each entry point uses (binding 0 is always the uniform).
fn storage_bindings(family: Family, entry: &str) -> &'static [u32] {
    match (family, entry) {
        (Family::Elementwise, "elementwise_unary" | "elementwise_unary4") => &[1, 2],
        (Family::Elementwise, _) | (Family::MatMul, _) => &[1, 2, 3],
        (Family::Reduce, "reduce_softmax") => &[1, 4],
        (Family::Reduce, "reduce_rms_norm") => &[1, 2, 4],
        (Family::Reduce, _) => &[1, 2, 3, 4],
        (Family::Movement, "movement_copy") => &[1, 3],
        (Family::Movement, "movement_gather") => &[1, 2, 3],
        (Family::Movement, _) => &[3],
        (Family::Mask, "mask_causal") => &[1, 4],
        (Family::Mask, _) => &[1, 2, 3, 4],
    }
}

fn u32_of(what: &'static str, v: u64) -> Result<u32, KernelError> {
    u32::try_from(v).map_err(|_| KernelError::TooManyElements {
        what,
        elements: v,
        max: u32::MAX as u64,
    })
}

fn u32s(what: &'static str, v: &[u64]) -> Result<Vec<u32>, KernelError> {
    v.iter().map(|&x| u32_of(what, x)).collect()
}

fn numel(what: &'static str, s: &Shape) -> Result<u64, KernelError> {
    let n = s
        .checked_num_elements()
        .ok_or(KernelError::TooManyElements {
            what,
            elements: u64::MAX,
            max: u32::MAX as u64,
        })?;
    u32_of(what, n)?;
    Ok(n)
}

fn check_rank(s: &Shape) -> Result<(), KernelError> {
    if s.rank() > MAX_RANK {
        return Err(KernelError::RankTooLarge {
            rank: s.rank(),
            max: MAX_RANK,
        });
    }
    Ok(())
}

/// Largest M for which [`Kernels`] uses `matmul_small_m` instead of the tiled kernel.
pub const SMALL_M_MAX: u64 = 8;

const INPUT_NAMES: [&str; 4] = ["input 0", "input 1", "input 2", "input 3+"];

impl Kernels {
    /// Compiles the five shader modules on `device` (pipelines are created on first use).
    pub fn new(device: &wgpu::Device) -> Self {
        let modules = Family::ALL
            .iter()
            .map(|&f| {
                let m = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(f.name()),
                    source: wgpu::ShaderSource::Wgsl(f.source().into()),
                });
                (f, m)
            })
            .collect();
        let limits = device.limits();
        Kernels {
            device: device.clone(),
            modules,
            layouts: HashMap::new(),
            pipelines: HashMap::new(),
            stats: CacheStats::default(),
            bind_groups: HashMap::new(),
            recorder: None,
            generation: 0,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension.max(1),
            storage_align_bytes: (limits.min_storage_buffer_offset_alignment as u64).max(4),
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

    /// Changes whenever dispatches recorded earlier may no longer be what [`Kernels::encode`]
    /// would record for the same operands.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Counts `n` dispatches a caller recorded again from [`Kernels::encode_recorded`]'s
    /// output as pipeline cache hits (they reuse a cached pipeline without a lookup).
    pub(crate) fn count_replayed(&mut self, n: u64) {
        self.stats.hits += n;
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
        self.recorder = Some(std::mem::take(recorder));
        let result = self.encode(pass, uniforms, op, inputs, output);
        if let Some(r) = self.recorder.take() {
            *recorder = r;
        }
        result
    }

    /// Pipeline cache counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            pipelines: self.pipelines.len(),
            ..self.stats
        }
    }

    /// The pipeline for `key`, compiled on a miss.
    fn pipeline(&mut self, key: &PipelineKey) -> (wgpu::ComputePipeline, wgpu::BindGroupLayout) {
        if let Some(p) = self.pipelines.get(key) {
            self.stats.hits += 1;
            return p.clone();
        }
        self.stats.misses += 1;
        let storage = storage_bindings(key.family, key.entry);
        let device = &self.device;
        let (bgl, layout) = self
            .layouts
            .entry(storage)
            .or_insert_with(|| {
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
            })
            .clone();
        let constants: Vec<(&str, f64)> =
            key.constant.iter().map(|&(n, v)| (n, v as f64)).collect();
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key.entry),
            layout: Some(&layout),
            module: &self.modules[&key.family],
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

    /// Checks a tensor range and splits its offset into an aligned binding offset and an
    /// element (32-bit word) offset for the uniform.
    fn bind<'a>(
        &self,
        what: &'static str,
        t: &TensorRef<'a>,
        needed_bytes: u64,
    ) -> Result<(Bound<'a>, u32), KernelError> {
        if t.offset_bytes % 4 != 0 {
            return Err(KernelError::Unaligned {
                what,
                offset_bytes: t.offset_bytes,
            });
        }
        let too_small = KernelError::TooSmall {
            what,
            offset_bytes: t.offset_bytes,
            size_bytes: t
                .size_bytes
                .min(t.buffer.size().saturating_sub(t.offset_bytes)),
            needed_bytes,
        };
        if t.size_bytes < needed_bytes
            || t.offset_bytes.saturating_add(needed_bytes) > t.buffer.size()
        {
            return Err(too_small);
        }
        let base = t.offset_bytes - t.offset_bytes % self.storage_align_bytes;
        let skew = t.offset_bytes - base;
        let size = (skew + needed_bytes).max(4);
        if size > self.max_binding_bytes {
            return Err(KernelError::BindingTooLarge {
                what,
                size_bytes: size,
                max_bytes: self.max_binding_bytes,
            });
        }
        if base + size > t.buffer.size() {
            return Err(too_small);
        }
        Ok((
            Bound {
                buffer: t.buffer,
                offset: base,
                size,
            },
            u32_of(what, skew / 4)?,
        ))
    }

    /// Records one dispatch of `key` with `params` in a fresh uniform slot.
    fn dispatch<P: bytemuck::Pod>(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        uniforms: &mut UniformArena,
        key: PipelineKey,
        params: &P,
        bound: &[Bound<'_>],
        workgroups: u64,
    ) -> Result<(), KernelError> {
        if workgroups == 0 {
            return Ok(());
        }
        let max = self.max_workgroups_per_dim as u64;
        let x = workgroups.min(max);
        let y = workgroups.div_ceil(x);
        if y > max {
            return Err(KernelError::TooManyWorkgroups {
                workgroups,
                max: self.max_workgroups_per_dim,
            });
        }
        let (pipeline, bgl) = self.pipeline(&key);
        let (ubuf, uoffset) = uniforms.push(params);
        let storage = storage_bindings(key.family, key.entry);
        let uniform_bytes = std::mem::size_of::<P>() as u64;
        let mut bound_key: [Option<(wgpu::Buffer, u64, u64)>; MAX_STORAGE_BINDINGS] =
            Default::default();
        for (slot, r) in bound_key.iter_mut().zip(bound.iter().take(storage.len())) {
            *slot = Some((r.buffer.clone(), r.offset, r.size));
        }
        let bind_key = BindKey {
            pipeline: key,
            uniform: ubuf.clone(),
            uniform_bytes,
            bound: bound_key,
        };
        let bg = match self.bind_groups.get(&bind_key) {
            Some(bg) => bg.clone(),
            None => {
                let mut entries = Vec::with_capacity(1 + storage.len());
                entries.push(wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &bind_key.uniform,
                        offset: 0,
                        size: NonZeroU64::new(uniform_bytes),
                    }),
                });
                for (&b, r) in storage.iter().zip(bound) {
                    entries.push(wgpu::BindGroupEntry {
                        binding: b,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: r.buffer,
                            offset: r.offset,
                            size: NonZeroU64::new(r.size),
                        }),
                    });
                }
                let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(bind_key.pipeline.entry),
                    layout: &bgl,
                    entries: &entries,
                });
                if self.bind_groups.len() >= MAX_CACHED_BIND_GROUPS {
                    self.bind_groups.clear();
                }
                self.bind_groups.insert(bind_key, bg.clone());
                bg
            }
        };
        match &mut self.recorder {
            Some(r) => {
                if r.current.as_ref() != Some(&pipeline) {
                    pass.set_pipeline(&pipeline);
                    r.current = Some(pipeline.clone());
                }
                pass.set_bind_group(0, &bg, &[uoffset]);
                r.dispatches.push(RecordedDispatch {
                    pipeline,
                    bind_group: bg,
                    uniform_chunk: ubuf,
                    params: bytemuck::bytes_of(params).to_vec(),
                    workgroups: (x as u32, y as u32),
                });
            }
            None => {
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bg, &[uoffset]);
            }
        }
        pass.dispatch_workgroups(x as u32, y as u32, 1);
        Ok(())
    }

    /// Drops every cached bind group (and with them the references they hold to bound
    /// buffers). Call after freeing or replacing buffers that dispatches bound, so freed
    /// memory is not kept alive by the cache.
    pub fn forget_bind_groups(&mut self) {
        self.bind_groups.clear();
    }

    /// Drops the cached bind groups that bind any of `buffers` (call after freeing or
    /// replacing them; groups of other buffers stay cached).
    pub fn forget_bind_groups_binding(&mut self, buffers: &[wgpu::Buffer]) {
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
    /// output shape as inferred; for [`Op::ReshapeTo`] input 1 is shape data and is not read).
    /// Returns the number of dispatches recorded (0 for an empty output).
    ///
    /// # Errors
    /// [`KernelError`]: no kernel for the op, operands that disagree with the op's shape rule,
    /// ranges too small, limits exceeded.
    pub fn encode(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        uniforms: &mut UniformArena,
        op: &Op,
        inputs: &[Operand<'_>],
        output: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let name = op.name();
        let (min, max) = op.arity();
        if inputs.len() < min || inputs.len() > max {
            return Err(KernelError::Arity {
                op: name,
                got: inputs.len(),
                expected: min,
            });
        }
        // Re-infer so a caller's shape mistake is an error, not a wrong dispatch.
        if !matches!(op, Op::Input { .. } | Op::Constant { .. } | Op::ReshapeTo) {
            // Up to 4 inputs on the stack: this runs for every dispatch (no heap on the hot
            // path); only a wider concat collects into a Vec.
            let mut few: [&Shape; 4] = [output.shape; 4];
            let many: Vec<&Shape>;
            let shapes: &[&Shape] = if inputs.len() <= few.len() {
                for (s, o) in few.iter_mut().zip(inputs) {
                    *s = o.shape;
                }
                &few[..inputs.len()]
            } else {
                many = inputs.iter().map(|o| o.shape).collect();
                &many
            };
            let expected = op
                .infer(shapes, &[])
                .map_err(|source| KernelError::Infer { op: name, source })?;
            if &expected != output.shape {
                return Err(KernelError::OutputShape {
                    op: name,
                    expected,
                    got: output.shape.clone(),
                });
            }
        }
        if numel("output", output.shape)? == 0 {
            return Ok(0);
        }
        match op {
            Op::Input { .. } | Op::Constant { .. } => Err(KernelError::NotAKernel { op: name }),
            Op::Binary(b) => self.binary(pass, uniforms, *b, &inputs[0], &inputs[1], output),
            Op::Unary(u) => self.unary(pass, uniforms, *u, &inputs[0], output),
            Op::MatMul { transpose_b } => {
                self.matmul(pass, uniforms, &inputs[0], &inputs[1], output, *transpose_b)
            }
            Op::Softmax => self.rows(pass, uniforms, "reduce_softmax", inputs, output, 0.0),
            Op::LayerNorm { eps } => {
                self.rows(pass, uniforms, "reduce_layer_norm", inputs, output, *eps)
            }
            Op::RmsNorm { eps } => {
                self.rows(pass, uniforms, "reduce_rms_norm", inputs, output, *eps)
            }
            Op::Reshape { .. } | Op::ReshapeTo => {
                let n = numel("output", output.shape)?;
                if numel("input 0", inputs[0].shape)? != n {
                    return Err(KernelError::OutputShape {
                        op: name,
                        expected: inputs[0].shape.clone(),
                        got: output.shape.clone(),
                    });
                }
                let flat = Shape::new(vec![n]);
                self.copy(pass, uniforms, &inputs[0], &flat, &[1], 0, output, &[1], 0)
            }
            Op::Transpose { perm } => {
                let st = movement::strides(inputs[0].shape);
                let in_strides: Vec<u64> = perm.iter().map(|&p| st[p]).collect();
                let out_strides = movement::strides(output.shape);
                self.copy(
                    pass,
                    uniforms,
                    &inputs[0],
                    output.shape,
                    &in_strides,
                    0,
                    output,
                    &out_strides,
                    0,
                )
            }
            Op::Slice {
                axes,
                starts,
                ends,
                steps,
            } => {
                let ranges = movement::slice_ranges(inputs[0].shape, axes, starts, ends, steps)
                    .map_err(|source| KernelError::Infer { op: name, source })?;
                let st = movement::strides(inputs[0].shape);
                let base: u64 = ranges.iter().zip(&st).map(|(r, s)| r.start * s).sum();
                let in_strides: Vec<u64> =
                    ranges.iter().zip(&st).map(|(r, s)| r.step * s).collect();
                let out_strides = movement::strides(output.shape);
                self.copy(
                    pass,
                    uniforms,
                    &inputs[0],
                    output.shape,
                    &in_strides,
                    base,
                    output,
                    &out_strides,
                    0,
                )
            }
            Op::Concat { axis } => {
                let mut at = 0u64;
                let mut n = 0;
                for inp in inputs {
                    n += self.encode_concat_part(pass, uniforms, inp, output, *axis, at)?;
                    at += inp.shape.0[*axis];
                }
                Ok(n)
            }
            Op::Gather => self.gather(pass, uniforms, &inputs[0], &inputs[1], output),
            Op::Where => self.where_(pass, uniforms, inputs, output),
            Op::CausalMask => self.causal(pass, uniforms, &inputs[0], output),
            Op::ShapeOf => {
                let dims: Vec<u64> = inputs[0].shape.dims().to_vec();
                self.fill(pass, uniforms, &dims, output)
            }
        }
    }

    /// Writes `input` into its slab of a concatenation `output` along `axis`, starting at index
    /// `axis_offset` of that axis. The runtime uses it to append only the new part of a KV
    /// cache whose older part is already in place (DESIGN.md §3).
    ///
    /// # Errors
    /// As [`Kernels::encode`]; also when the slab does not fit the output.
    pub fn encode_concat_part(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        uniforms: &mut UniformArena,
        input: &Operand<'_>,
        output: &Operand<'_>,
        axis: usize,
        axis_offset: u64,
    ) -> Result<usize, KernelError> {
        let os = output.shape;
        let fits = input.shape.rank() == os.rank()
            && axis < os.rank()
            && (0..os.rank()).all(|i| {
                if i == axis {
                    axis_offset + input.shape.0[i] <= os.0[i]
                } else {
                    input.shape.0[i] == os.0[i]
                }
            });
        if !fits {
            return Err(KernelError::OutputShape {
                op: "concat",
                expected: input.shape.clone(),
                got: os.clone(),
            });
        }
        let out_strides = movement::strides(os);
        let in_strides = movement::strides(input.shape);
        let base = axis_offset * out_strides[axis];
        self.copy(
            pass,
            uniforms,
            input,
            input.shape,
            &in_strides,
            0,
            output,
            &out_strides,
            base,
        )
    }

    fn binary(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        op: BinaryOp,
        a: &Operand<'_>,
        b: &Operand<'_>,
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = numel("output", out.shape)?;
        let (ba, oa) = self.bind("input 0", &a.tensor, numel("input 0", a.shape)? * 4)?;
        let (bb, ob) = self.bind("input 1", &b.tensor, numel("input 1", b.shape)? * 4)?;
        let (bo, oo) = self.bind("output", &out.tensor, n * 4)?;
        let constant = Some(("BINARY_OP", op.code()));
        if a.shape == out.shape && b.shape == out.shape {
            let vec4 = n % 4 == 0 && oa % 4 == 0 && ob % 4 == 0 && oo % 4 == 0;
            let (entry, k) = if vec4 {
                ("elementwise_binary_flat4", 4)
            } else {
                ("elementwise_binary_flat", 1)
            };
            let p = FlatParams {
                numel: (n / k) as u32,
                in0_offset: oa / k as u32,
                in1_offset: ob / k as u32,
                out_offset: oo / k as u32,
            };
            let key = PipelineKey {
                family: Family::Elementwise,
                entry,
                constant,
            };
            self.dispatch(pass, u, key, &p, &[ba, bb, bo], (n / k).div_ceil(256))?;
            return Ok(1);
        }
        check_rank(out.shape)?;
        let p = BroadcastParams {
            numel: n as u32,
            rank: out.shape.rank() as u32,
            out_offset: oo,
            flags: 0,
            offsets: [oa, ob, 0, 0],
            shape: pack8(&u32s("output", out.shape.dims())?),
            strides0: pack8(&u32s("input 0", &broadcast_strides(a.shape, out.shape))?),
            strides1: pack8(&u32s("input 1", &broadcast_strides(b.shape, out.shape))?),
            strides2: [[0; 4]; 2],
        };
        let key = PipelineKey {
            family: Family::Elementwise,
            entry: "elementwise_binary",
            constant,
        };
        self.dispatch(pass, u, key, &p, &[ba, bb, bo], n.div_ceil(256))?;
        Ok(1)
    }

    fn unary(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        op: UnaryOp,
        x: &Operand<'_>,
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = numel("output", out.shape)?;
        let (bx, ox) = self.bind("input 0", &x.tensor, n * 4)?;
        let (bo, oo) = self.bind("output", &out.tensor, n * 4)?;
        let vec4 = n % 4 == 0 && ox % 4 == 0 && oo % 4 == 0;
        let (entry, k) = if vec4 {
            ("elementwise_unary4", 4)
        } else {
            ("elementwise_unary", 1)
        };
        let p = FlatParams {
            numel: (n / k) as u32,
            in0_offset: ox / k as u32,
            in1_offset: 0,
            out_offset: oo / k as u32,
        };
        let key = PipelineKey {
            family: Family::Elementwise,
            entry,
            constant: Some(("UNARY_OP", op.code())),
        };
        self.dispatch(pass, u, key, &p, &[bx, bo], (n / k).div_ceil(256))?;
        Ok(1)
    }

    fn matmul(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        a: &Operand<'_>,
        b: &Operand<'_>,
        out: &Operand<'_>,
        transpose_b: bool,
    ) -> Result<usize, KernelError> {
        let d =
            matmul::dims(a.shape, b.shape, transpose_b).map_err(|source| KernelError::Infer {
                op: "matmul",
                source,
            })?;
        if d.batch.rank() > 4 {
            return Err(KernelError::RankTooLarge {
                rank: d.batch.rank() + 2,
                max: 6,
            });
        }
        let n_out = numel("output", out.shape)?;
        let (ba, oa) = self.bind("input 0", &a.tensor, numel("input 0", a.shape)? * 4)?;
        let (bb, ob) = self.bind("input 1", &b.tensor, numel("input 1", b.shape)? * 4)?;
        let (bo, oo) = self.bind("output", &out.tensor, n_out * 4)?;
        let batch_a = Shape::new(a.shape.0[..a.shape.rank() - 2].to_vec());
        let batch_b = Shape::new(b.shape.0[..b.shape.rank() - 2].to_vec());
        let sa: Vec<u64> = broadcast_strides(&batch_a, &d.batch)
            .iter()
            .map(|s| s * d.m * d.k)
            .collect();
        let sb: Vec<u64> = broadcast_strides(&batch_b, &d.batch)
            .iter()
            .map(|s| s * d.k * d.n)
            .collect();
        let mut p = MatMulParams {
            m: u32_of("output", d.m)?,
            k: u32_of("input 0", d.k)?,
            n: u32_of("output", d.n)?,
            batch: u32_of("output", d.batch.checked_num_elements().unwrap_or(0))?,
            tiles_m: u32_of("output", d.m.div_ceil(64))?,
            tiles_n: u32_of("output", d.n.div_ceil(64))?,
            batch_rank: d.batch.rank() as u32,
            _pad0: 0,
            a_offset: oa,
            b_offset: ob,
            out_offset: oo,
            _pad1: 0,
            a_stride_m: d.k as u32,
            a_stride_k: 1,
            b_stride_k: if transpose_b { 1 } else { d.n as u32 },
            b_stride_n: if transpose_b { d.k as u32 } else { 1 },
            batch_shape: [1; 4],
            a_batch_strides: [0; 4],
            b_batch_strides: [0; 4],
        };
        for i in 0..d.batch.rank() {
            p.batch_shape[i] = d.batch.0[i] as u32;
            p.a_batch_strides[i] = u32_of("input 0", sa[i])?;
            p.b_batch_strides[i] = u32_of("input 1", sb[i])?;
        }
        // Specialisation by shape: below 9 rows (decode steps) a 64-row tile would mostly
        // compute padding, so one workgroup covers one row and 256 columns instead.
        let entry = if d.m <= SMALL_M_MAX {
            p.tiles_m = p.m;
            p.tiles_n = u32_of("output", d.n.div_ceil(256))?;
            "matmul_small_m"
        } else {
            "matmul_tiled"
        };
        let workgroups = p.batch as u64 * p.tiles_m as u64 * p.tiles_n as u64;
        let key = PipelineKey {
            family: Family::MatMul,
            entry,
            constant: None,
        };
        self.dispatch(pass, u, key, &p, &[ba, bb, bo], workgroups)?;
        Ok(1)
    }

    fn rows(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        entry: &'static str,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
        eps: f32,
    ) -> Result<usize, KernelError> {
        let (rows, d) = norm::rows(out.shape);
        let n = numel("output", out.shape)?;
        let (bx, ox) = self.bind("input 0", &inputs[0].tensor, n * 4)?;
        let mut bound = vec![bx];
        let mut offs = [0u32; 2];
        for (k, inp) in inputs.iter().enumerate().skip(1) {
            let (bp, op) = self.bind(INPUT_NAMES[k.min(3)], &inp.tensor, d * 4)?;
            bound.push(bp);
            offs[k - 1] = op;
        }
        let (bo, oo) = self.bind("output", &out.tensor, n * 4)?;
        bound.push(bo);
        let p = RowParams {
            rows: u32_of("output", rows)?,
            d: u32_of("output", d)?,
            x_offset: ox,
            out_offset: oo,
            gamma_offset: offs[0],
            beta_offset: offs[1],
            eps,
            _pad: 0,
        };
        let key = PipelineKey {
            family: Family::Reduce,
            entry,
            constant: None,
        };
        self.dispatch(pass, u, key, &p, &bound, rows)?;
        Ok(1)
    }

    /// Strided copy of `shape` elements: `src[in_base + idx . in_strides]` to
    /// `dst[out_base + idx . out_strides]` (word offsets on top of the operands' own).
    #[allow(clippy::too_many_arguments)]
    fn copy(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        src: &Operand<'_>,
        shape: &Shape,
        in_strides: &[u64],
        in_base: u64,
        dst: &Operand<'_>,
        out_strides: &[u64],
        out_base: u64,
    ) -> Result<usize, KernelError> {
        check_rank(shape)?;
        let n = numel("copy", shape)?;
        if n == 0 {
            return Ok(0);
        }
        let (bs, os) = self.bind("input 0", &src.tensor, numel("input 0", src.shape)? * 4)?;
        let (bd, od) = self.bind("output", &dst.tensor, numel("output", dst.shape)? * 4)?;
        let p = CopyParams {
            numel: n as u32,
            rank: shape.rank() as u32,
            in_offset: u32_of("input 0", os as u64 + in_base)?,
            out_offset: u32_of("output", od as u64 + out_base)?,
            shape: pack8(&u32s("copy", shape.dims())?),
            in_strides: pack8(&u32s("input 0", in_strides)?),
            out_strides: pack8(&u32s("output", out_strides)?),
        };
        let key = PipelineKey {
            family: Family::Movement,
            entry: "movement_copy",
            constant: None,
        };
        self.dispatch(pass, u, key, &p, &[bs, bd], n.div_ceil(256))?;
        Ok(1)
    }

    fn gather(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        table: &Operand<'_>,
        ids: &Operand<'_>,
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = numel("output", out.shape)?;
        let num_ids = numel("input 1", ids.shape)?;
        let rows = table.shape.0.first().copied().unwrap_or(0);
        let row: u64 = table.shape.0[1..].iter().product();
        let (bt, ot) = self.bind(
            "input 0",
            &table.tensor,
            (numel("input 0", table.shape)? * 4).max(4),
        )?;
        let (bi, oi) = self.bind("input 1", &ids.tensor, num_ids * 4)?;
        let (bo, oo) = self.bind("output", &out.tensor, n * 4)?;
        let p = GatherParams {
            num_ids: num_ids as u32,
            row: u32_of("input 0", row)?,
            rows: u32_of("input 0", rows)?,
            table_offset: ot,
            ids_offset: oi,
            out_offset: oo,
            _pad: [0; 2],
        };
        let key = PipelineKey {
            family: Family::Movement,
            entry: "movement_gather",
            constant: None,
        };
        self.dispatch(pass, u, key, &p, &[bt, bi, bo], n.div_ceil(256))?;
        Ok(1)
    }

    fn fill(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        values: &[u64],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        if values.len() > MAX_RANK {
            return Err(KernelError::RankTooLarge {
                rank: values.len(),
                max: MAX_RANK,
            });
        }
        let (bo, oo) = self.bind("output", &out.tensor, values.len() as u64 * 4)?;
        let v: Vec<u32> = values
            .iter()
            .map(|&d| d.min(i32::MAX as u64) as u32)
            .collect();
        let p = FillParams {
            n: v.len() as u32,
            out_offset: oo,
            _pad: [0; 2],
            values: pack8(&v),
        };
        let key = PipelineKey {
            family: Family::Movement,
            entry: "movement_fill",
            constant: None,
        };
        self.dispatch(pass, u, key, &p, &[bo], 1)?;
        Ok(1)
    }

    fn where_(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        inputs: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        check_rank(out.shape)?;
        let n = numel("output", out.shape)?;
        let mut bound = Vec::new();
        let mut offs = [0u32; 4];
        let mut strides = [[[0u32; 4]; 2]; 3];
        for (k, inp) in inputs.iter().enumerate() {
            let (b, o) = self.bind(
                INPUT_NAMES[k],
                &inp.tensor,
                numel(INPUT_NAMES[k], inp.shape)? * 4,
            )?;
            bound.push(b);
            offs[k] = o;
            strides[k] = pack8(&u32s(
                INPUT_NAMES[k],
                &broadcast_strides(inp.shape, out.shape),
            )?);
        }
        let (bo, oo) = self.bind("output", &out.tensor, n * 4)?;
        bound.push(bo);
        let p = BroadcastParams {
            numel: n as u32,
            rank: out.shape.rank() as u32,
            out_offset: oo,
            flags: u32::from(inputs[0].dtype == DType::F32),
            offsets: offs,
            shape: pack8(&u32s("output", out.shape.dims())?),
            strides0: strides[0],
            strides1: strides[1],
            strides2: strides[2],
        };
        let key = PipelineKey {
            family: Family::Mask,
            entry: "mask_where",
            constant: None,
        };
        self.dispatch(pass, u, key, &p, &bound, n.div_ceil(256))?;
        Ok(1)
    }

    fn causal(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        u: &mut UniformArena,
        x: &Operand<'_>,
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        let n = numel("output", out.shape)?;
        let r = out.shape.rank();
        let (s, t) = (out.shape.0[r - 2], out.shape.0[r - 1]);
        let (bx, ox) = self.bind("input 0", &x.tensor, n * 4)?;
        let (bo, oo) = self.bind("output", &out.tensor, n * 4)?;
        let p = CausalParams {
            numel: n as u32,
            s: s as u32,
            t: t as u32,
            past: (t - s) as u32,
            x_offset: ox,
            out_offset: oo,
            _pad: [0; 2],
        };
        let key = PipelineKey {
            family: Family::Mask,
            entry: "mask_causal",
            constant: None,
        };
        self.dispatch(pass, u, key, &p, &[bx, bo], n.div_ceil(256))?;
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shader_validates_with_naga() {
        for f in Family::ALL {
            let src = f.source();
            let m = naga::front::wgsl::parse_str(src)
                .unwrap_or_else(|e| panic!("{}: {}", f.name(), e.emit_to_string(src)));
            let mut v = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            );
            v.validate(&m)
                .unwrap_or_else(|e| panic!("{}: {e:?}", f.name()));
            // Every entry point the Rust side names exists in its file.
            for ep in &m.entry_points {
                assert!(
                    ep.name.starts_with(f.name()),
                    "entry {} in {}",
                    ep.name,
                    f.name()
                );
                assert!(!storage_bindings(f, &ep.name).is_empty());
            }
        }
    }
}
