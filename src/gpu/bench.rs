//! What the benchmarks of `dynrt-bench` record by hand, so that they measure the runtime
//! against plain wgpu without importing wgpu themselves (only this module tree does):
//!
//! * [`Recording`] — one submit of commands a benchmark records itself (kernels through
//!   [`super::kernels::Kernels::encode`], buffer copies), timed from the submit until the
//!   device is idle;
//! * [`replay_log`] — the commands the runtime recorded for one iteration ([`CommandLog`])
//!   issued again by hand, with the pipelines and bind groups it holds;
//! * [`HandwrittenChain`] — a chain of adds with its pipeline and bind groups made once: the
//!   least host work a dispatch can cost.
//!
//! With the feature `bench` (on by default, natively) only; what they measure is in
//! docs/cli.md (`dynrt-bench kernels`, `dynrt-bench decode`).

use super::{AllocError, Buffer, BufferDesc, CommandLog, Engine, Gpu, LoggedCommand};
use crate::memory::AllocKind;
use web_time::Instant;

/// Errors of a benchmark's own submit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// wgpu refused the wait for the submitted work.
    #[error("device poll failed: {reason}")]
    Poll {
        /// wgpu's message.
        reason: String,
    },
}

/// The commands of one submit that a benchmark records itself: its own command encoder,
/// apart from the runtime's [`super::Frame`]. Dropping it unsubmitted discards the commands.
pub struct Recording {
    gpu: Gpu,
    encoder: wgpu::CommandEncoder,
}

impl Recording {
    /// An empty recording on `gpu`'s device; `label` names its command encoder.
    pub fn new(gpu: &Gpu, label: &str) -> Recording {
        let encoder = gpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        Recording {
            gpu: gpu.clone(),
            encoder,
        }
    }

    /// Records a copy of the first `size_bytes` of `src` into `dst` (both offsets 0;
    /// `size_bytes` a multiple of 4 within both buffers, as wgpu requires).
    pub fn copy(&mut self, src: &Buffer, dst: &Buffer, size_bytes: u64) {
        self.encoder
            .copy_buffer_to_buffer(src.raw(), 0, dst.raw(), 0, size_bytes);
    }

    /// Opens a compute pass labelled `label`, for [`super::kernels::Kernels::encode`]; the
    /// recording takes other commands again once the pass is dropped.
    pub fn compute_pass(&mut self, label: &str) -> wgpu::ComputePass<'_> {
        self.encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(label),
                timestamp_writes: None,
            })
    }

    /// Finishes the commands, submits them and waits until the device is idle; returns the
    /// wall-clock seconds from before the finish until idle (recording is outside them).
    ///
    /// # Errors
    /// [`BenchError::Poll`] when wgpu refuses the wait.
    pub fn submit_and_wait(self) -> Result<f64, BenchError> {
        let t0 = Instant::now();
        self.gpu.queue().submit([self.encoder.finish()]);
        self.gpu
            .device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| BenchError::Poll {
                reason: e.to_string(),
            })?;
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// Issues by hand exactly the commands of `log` (what the runtime recorded for one
/// iteration) with the pipelines and bind groups it holds: the queue writes (inputs, then one
/// image per uniform buffer of its slots), one encoder, `set_pipeline` when it changes,
/// `set_bind_group` + `dispatch_workgroups` per dispatch, the copies, one submit. Does not
/// wait for the device.
pub fn replay_log(gpu: &Gpu, log: &CommandLog) {
    let (device, queue) = (gpu.device(), gpu.queue());
    // The uniform slots of the step, one image per uniform buffer.
    let mut images: Vec<(&wgpu::Buffer, Vec<u8>)> = Vec::new();
    for c in log.commands() {
        match c {
            LoggedCommand::Dispatch {
                uniform,
                uniform_offset,
                params,
                ..
            } => {
                let i = match images.iter().position(|(b, _)| *b == uniform) {
                    Some(i) => i,
                    None => {
                        images.push((uniform, Vec::new()));
                        images.len() - 1
                    }
                };
                let image = &mut images[i].1;
                let at = uniform_offset as usize;
                if image.len() < at + params.len() {
                    image.resize(at + params.len(), 0);
                }
                image[at..at + params.len()].copy_from_slice(params);
            }
            LoggedCommand::Write { dst, offset, bytes } => queue.write_buffer(dst, offset, bytes),
            LoggedCommand::Copy { .. } => {}
        }
    }
    for (b, image) in &images {
        queue.write_buffer(b, 0, image);
    }
    let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("hand-written decode step"),
    });
    let mut pass: Option<wgpu::ComputePass<'static>> = None;
    let mut current: Option<&wgpu::ComputePipeline> = None;
    for c in log.commands() {
        match c {
            LoggedCommand::Dispatch {
                pipeline,
                bind_group,
                uniform_offset,
                workgroups,
                ..
            } => {
                let p = pass.get_or_insert_with(|| {
                    current = None;
                    enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: None,
                    })
                    .forget_lifetime()
                });
                if current != Some(pipeline) {
                    p.set_pipeline(pipeline);
                    current = Some(pipeline);
                }
                p.set_bind_group(0, bind_group, &[uniform_offset]);
                p.dispatch_workgroups(workgroups.0, workgroups.1, 1);
            }
            LoggedCommand::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                size,
            } => {
                pass = None;
                enc.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size);
            }
            LoggedCommand::Write { .. } => {}
        }
    }
    drop(pass);
    queue.submit([enc.finish()]);
}

const ADD_ONE: &str = r#"
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&dst)) { dst[g.x] = src[g.x] + 1.0; }
}
"#;

const ADD_TENSOR: &str = r#"
struct Params { n: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < p.n) { out[g.x] = a[g.x] + b[0]; }
}
"#;

/// Uniform slot stride of [`ChainLayout::SameAsRuntime`] (`min_uniform_buffer_offset_alignment`
/// is at most 256).
const SLOT_BYTES: u64 = 256;

/// Which kernel and bind-group layout a [`HandwrittenChain`] dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainLayout {
    /// `x + 1.0`, 2 storage bindings, pipeline layout from the shader: the least a kernel can
    /// bind.
    Minimal,
    /// `x + one` with the runtime elementwise kernel's layout: binding 0 a uniform with a
    /// dynamic offset (one slot per dispatch, written once), bindings 1-3 storage.
    SameAsRuntime,
}

/// A chain of `chain` adds on f32 tensors of `elements`, node i reading tensor i and writing
/// tensor i + 1, with its pipeline, buffers and bind groups created once: an iteration only
/// records the dispatches and submits. The host cost per dispatch it shows is the floor the
/// runtime's own loop is compared with (`dynrt-bench decode`).
pub struct HandwrittenChain {
    gpu: Gpu,
    layout: ChainLayout,
    elements: u64,
    pipeline: wgpu::ComputePipeline,
    groups: Vec<wgpu::BindGroup>,
    /// Keeps the bound buffers (and their accounting) alive.
    _buffers: Vec<Buffer>,
    _uniforms: Option<Buffer>,
}

impl HandwrittenChain {
    /// Builds the chain: `chain + 2` `usm_device` tensors of `elements` f32 (the chain, then
    /// the one-element addend of [`ChainLayout::SameAsRuntime`]) and, for that layout, a
    /// `cl_mem` buffer of one uniform slot per dispatch, all from `engine`.
    ///
    /// # Errors
    /// An [`AllocError`] when a buffer cannot be allocated.
    pub fn new(
        engine: &Engine,
        layout: ChainLayout,
        chain: usize,
        elements: u64,
    ) -> Result<HandwrittenChain, AllocError> {
        let gpu = engine.gpu();
        let device = gpu.device();
        let source = match layout {
            ChainLayout::Minimal => ADD_ONE,
            ChainLayout::SameAsRuntime => ADD_TENSOR,
        };
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("bench chain"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let buffers = (0..=chain + 1)
            .map(|_| {
                engine.allocate(&BufferDesc {
                    label: "bench chain",
                    size_bytes: elements * 4,
                    kind: AllocKind::UsmDevice,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let whole = |i: usize| buffers[i].raw().as_entire_binding();
        let pipeline_of = |label, layout| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(label),
                layout,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        let (pipeline, bgl, uniforms) = match layout {
            ChainLayout::Minimal => {
                let pipeline = pipeline_of("bench add_one", None);
                let bgl = pipeline.get_bind_group_layout(0);
                (pipeline, bgl, None)
            }
            ChainLayout::SameAsRuntime => {
                let buffer_entry = |binding, ty, dynamic| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty,
                        has_dynamic_offset: dynamic,
                        min_binding_size: None,
                    },
                    count: None,
                };
                let storage = wgpu::BufferBindingType::Storage { read_only: false };
                let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("bench same layout"),
                    entries: &[
                        buffer_entry(0, wgpu::BufferBindingType::Uniform, true),
                        buffer_entry(1, storage, false),
                        buffer_entry(2, storage, false),
                        buffer_entry(3, storage, false),
                    ],
                });
                let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some("bench same layout"),
                    bind_group_layouts: &[Some(&bgl)],
                    immediate_size: 0,
                });
                let pipeline = pipeline_of("bench add_tensor", Some(&pl));
                // Through the engine like every buffer (cl_mem is the kind with UNIFORM).
                let uniforms = engine.allocate(&BufferDesc {
                    label: "bench same layout uniforms",
                    size_bytes: SLOT_BYTES * chain as u64,
                    kind: AllocKind::ClMem,
                })?;
                let mut slots = vec![0u8; (SLOT_BYTES * chain as u64) as usize];
                for slot in slots.chunks_mut(SLOT_BYTES as usize) {
                    slot[..4].copy_from_slice(&(elements as u32).to_le_bytes());
                }
                engine.queue_write(&uniforms, 0, &slots);
                (pipeline, bgl, Some(uniforms))
            }
        };
        // Node i reads tensor i (and the addend, last) and writes tensor i + 1.
        let groups = (0..chain)
            .map(|i| {
                let entry = |binding, resource| wgpu::BindGroupEntry { binding, resource };
                let entries = match &uniforms {
                    None => vec![entry(0, whole(i)), entry(1, whole(i + 1))],
                    Some(u) => vec![
                        entry(
                            0,
                            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: u.raw(),
                                offset: 0,
                                size: std::num::NonZeroU64::new(16),
                            }),
                        ),
                        entry(1, whole(i)),
                        entry(2, whole(chain + 1)),
                        entry(3, whole(i + 1)),
                    ],
                };
                device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("bench chain"),
                    layout: &bgl,
                    entries: &entries,
                })
            })
            .collect();
        Ok(HandwrittenChain {
            gpu: gpu.clone(),
            layout,
            elements,
            pipeline,
            groups,
            _buffers: buffers,
            _uniforms: uniforms,
        })
    }

    /// One iteration: every dispatch of the chain in one pass, one submit. Returns the host
    /// seconds; the wait for the device that follows (to keep the queue short) is not counted.
    pub fn iteration(&self) -> f64 {
        let device = self.gpu.device();
        let t = Instant::now();
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("bench"),
        });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            pass.set_pipeline(&self.pipeline);
            for (i, g) in self.groups.iter().enumerate() {
                match self.layout {
                    ChainLayout::Minimal => {
                        pass.set_bind_group(0, g, &[]);
                        pass.dispatch_workgroups(self.elements.div_ceil(64) as u32, 1, 1);
                    }
                    ChainLayout::SameAsRuntime => {
                        pass.set_bind_group(0, g, &[(i as u64 * SLOT_BYTES) as u32]);
                        pass.dispatch_workgroups(self.elements.div_ceil(256) as u32, 1, 1);
                    }
                }
            }
        }
        self.gpu.queue().submit([enc.finish()]);
        let host = t.elapsed().as_secs_f64();
        self.gpu.poll_wait();
        host
    }
}
