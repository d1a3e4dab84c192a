//! [`Kernels`]: the shader modules, pipeline layouts, pipelines and bind groups of one device,
//! made on first use and cached (pipelines keyed by [`PipelineKey`], every lookup counted as a
//! hit or a miss), and the entry that records an op's dispatches ([`Kernels::encode`]).

use std::collections::HashMap;

use super::encoder::BindKey;
use super::plan::Recorder;
use super::{
    attention, kernel_of, layout, Encoder, KernelError, Operand, PipelineKey, UniformArena,
};
use crate::gpu::{BufferUid, Gpu};
use crate::graph::Op;
use crate::shape::{DType, Shape};

/// Pipeline cache counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct CacheStats {
    /// Lookups that found a compiled pipeline.
    pub hits: u64,
    /// Lookups that found none in this cache: a pipeline was compiled (or, on GL, taken from
    /// the device's: see [`Kernels::new`]).
    pub misses: u64,
    /// Pipelines held.
    pub pipelines: usize,
}

/// Bind groups cached at most; the cache is emptied when it would grow past this, so a
/// caller that never calls [`Kernels::forget_bind_groups`] still holds a bounded number.
const MAX_CACHED_BIND_GROUPS: usize = 4096;

type Layouts = HashMap<&'static [u32], (wgpu::BindGroupLayout, wgpu::PipelineLayout)>;

/// Shader modules, layouts and the pipeline cache of one device.
pub struct Kernels {
    pub(crate) device: wgpu::Device,
    /// For the device lock and, on GL, the device's pipelines.
    gpu: Gpu,
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
    pub(crate) quant_layout: crate::gpu::QuantLayout,
    /// Workgroups an attention dispatch should have at least before it splits keys
    /// ([`Kernels::set_attention_workgroups`]).
    pub(crate) attention_workgroups: u64,
    pub(crate) storage_align_bytes: u64,
    pub(crate) max_binding_bytes: u64,
}

impl Kernels {
    /// The kernels of `gpu`'s device (shader modules and pipelines are created on first use).
    /// On GL the pipelines are the device's, shared by all its `Kernels` and kept until the
    /// device goes: destroying one takes the GL context, which must not happen outside
    /// [`Gpu::lock_device`] (docs/design.md, "Threads and the GL context").
    pub fn new(gpu: &Gpu) -> Self {
        let device = gpu.device();
        let limits = device.limits();
        let quant_layout = crate::gpu::QuantLayout::of(gpu);
        Kernels {
            device: device.clone(),
            gpu: gpu.clone(),
            modules: HashMap::new(),
            layouts: HashMap::new(),
            pipelines: HashMap::new(),
            stats: CacheStats::default(),
            bind_groups: HashMap::new(),
            generation: 0,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension.max(1),
            quant_layout,
            attention_workgroups: attention::workgroups_for(quant_layout),
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
    pub fn set_quant_layout(&mut self, layout: crate::gpu::QuantLayout) {
        self.quant_layout = layout;
        self.generation += 1;
    }

    /// Overrides how many workgroups an attention dispatch should have before the kernel
    /// cuts each row's keys into chunks (`attention::attention_splits`; chosen from the
    /// adapter by [`Kernels::new`]): tests use it to run the split path on every adapter, 1
    /// keeps the one-pass kernel.
    pub fn set_attention_workgroups(&mut self, workgroups: u64) {
        self.attention_workgroups = workgroups.max(1);
        self.generation += 1;
    }

    /// Workgroups an attention dispatch should have before it splits keys
    /// ([`Kernels::set_attention_workgroups`]).
    pub fn attention_workgroups(&self) -> u64 {
        self.attention_workgroups
    }

    /// How the quantized-weight kernels spread their work ([`Kernels::set_quant_layout`]).
    pub fn quant_layout(&self) -> crate::gpu::QuantLayout {
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

    /// Whether a pipeline of entry point `entry` was compiled (tests check that the kernel
    /// they mean to exercise ran).
    pub fn has_pipeline(&self, entry: &str) -> bool {
        self.pipelines.keys().any(|k| k.entry == entry)
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
        let gpu = self.gpu.clone();
        // Compiling takes the GL context.
        let _device = gpu.lock_device();
        if let Some(shared) = gpu.gl_pipelines() {
            if let Some(p) = lock(shared).get(key).cloned() {
                self.pipelines.insert(key.clone(), p.clone());
                return p;
            }
        }
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
            .constants
            .iter()
            .flatten()
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
        if let Some(shared) = gpu.gl_pipelines() {
            lock(shared).insert(key.clone(), (pipeline.clone(), bgl.clone()));
        }
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

    /// Records what `encode` writes through an encoder of this cache: a dispatch outside the
    /// op table (the device check of a gather's indices, a weight's reorder), its commands
    /// kept in `recorder`.
    pub(crate) fn encode_direct(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        uniforms: &mut UniformArena,
        recorder: &mut Recorder,
        encode: impl FnOnce(&mut Encoder<'_, '_>) -> Result<usize, KernelError>,
    ) -> Result<usize, KernelError> {
        let mut e = Encoder {
            kernels: self,
            pass,
            uniforms,
            recorder: Some(recorder),
        };
        encode(&mut e)
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
        if inputs.len() < min || inputs.len() > max + kernel.extra_operands() {
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

/// Locks a map of handles (consistent between statements: a panic elsewhere left it usable).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
