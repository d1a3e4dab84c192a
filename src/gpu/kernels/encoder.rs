//! What a kernel family's encode works with: [`Encoder::bind`] checks a tensor range and
//! splits its offset for the uniform, [`Encoder::dispatch`] records one dispatch in its own
//! uniform slot with a cached bind group.

use super::layout::u32_of;
use super::plan::{RecordedDispatch, Recorder};
use super::{KernelError, Kernels, PipelineKey, TensorRef, UniformArena, MAX_STORAGE_BINDINGS};
use crate::gpu::{Buffer, BufferUid};
use std::num::NonZeroU64;

/// One storage binding of a dispatch: a range of a buffer.
pub struct Bound<'a> {
    pub(crate) buffer: &'a Buffer,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// What a bind group is made of: the layout (through the pipeline key), the uniform chunk and
/// the (buffer, offset, size) of every storage binding.
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct BindKey {
    pub(crate) pipeline: PipelineKey,
    pub(crate) uniform: BufferUid,
    pub(crate) uniform_bytes: u64,
    pub(crate) bound: [Option<(BufferUid, u64, u64)>; MAX_STORAGE_BINDINGS],
}

/// The encode context handed to a [`super::Kernel`]: the pipeline cache, the open compute
/// pass, the uniform slots, and (when a dispatch plan is being recorded) the recorder.
pub struct Encoder<'a, 'p> {
    pub(crate) kernels: &'a mut Kernels,
    pub(crate) pass: &'a mut wgpu::ComputePass<'p>,
    pub(crate) uniforms: &'a mut UniformArena,
    pub(crate) recorder: Option<&'a mut Recorder>,
}

impl Encoder<'_, '_> {
    /// Checks a tensor range and splits its offset into an aligned binding offset and an
    /// element (32-bit word) offset for the uniform: binding offsets must be multiples of
    /// `min_storage_buffer_offset_alignment` (DESIGN §6), tensors only of 4 bytes.
    ///
    /// # Errors
    /// [`KernelError::Unaligned`], [`KernelError::TooSmall`], [`KernelError::BindingTooLarge`],
    /// [`KernelError::NotBindable`] naming `what`.
    pub fn bind<'t>(
        &self,
        what: &'static str,
        t: &TensorRef<'t>,
        needed_bytes: u64,
    ) -> Result<(Bound<'t>, u32), KernelError> {
        if !t.buffer.kind().bindable() {
            return Err(KernelError::NotBindable {
                what,
                kind: t.buffer.kind(),
            });
        }
        if t.offset_bytes % 4 != 0 {
            return Err(KernelError::Unaligned {
                what,
                offset_bytes: t.offset_bytes,
            });
        }
        let buffer_bytes = t.buffer.size_bytes();
        let too_small = KernelError::TooSmall {
            what,
            offset_bytes: t.offset_bytes,
            size_bytes: t
                .size_bytes
                .min(buffer_bytes.saturating_sub(t.offset_bytes)),
            needed_bytes,
        };
        if t.size_bytes < needed_bytes || t.offset_bytes.saturating_add(needed_bytes) > buffer_bytes
        {
            return Err(too_small);
        }
        let align = self.kernels.storage_align_bytes;
        let base = t.offset_bytes - t.offset_bytes % align;
        let skew = t.offset_bytes - base;
        let size = (skew + needed_bytes).max(4);
        if size > self.kernels.max_binding_bytes {
            return Err(KernelError::BindingTooLarge {
                what,
                size_bytes: size,
                max_bytes: self.kernels.max_binding_bytes,
            });
        }
        if base + size > buffer_bytes {
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

    /// Records one dispatch of `key` with `params` in a fresh uniform slot. Workgroup counts
    /// above `max_compute_workgroups_per_dimension` go to a 2-D grid (kernels linearise
    /// `wid.x + wid.y * num_workgroups.x`); 0 workgroups record nothing.
    ///
    /// # Errors
    /// [`KernelError::TooManyWorkgroups`] beyond the 2-D grid; uniform allocation errors.
    pub fn dispatch<P: bytemuck::Pod>(
        &mut self,
        key: PipelineKey,
        params: &P,
        bound: &[Bound<'_>],
        workgroups: u64,
    ) -> Result<(), KernelError> {
        if workgroups == 0 {
            return Ok(());
        }
        let max = u64::from(self.kernels.max_workgroups_per_dim);
        let x = workgroups.min(max);
        let y = workgroups.div_ceil(x);
        if y > max {
            return Err(KernelError::TooManyWorkgroups {
                workgroups,
                max: self.kernels.max_workgroups_per_dim,
            });
        }
        let (pipeline, bgl) = self.kernels.pipeline(&key);
        let (ubuf, uoffset) = self
            .uniforms
            .push(params)
            .map_err(|e| KernelError::Uniforms(e.to_string()))?;
        let storage = (key.family.bindings)(key.entry);
        let uniform_bytes = std::mem::size_of::<P>() as u64;
        let mut bound_key: [Option<(BufferUid, u64, u64)>; MAX_STORAGE_BINDINGS] =
            Default::default();
        for (slot, r) in bound_key.iter_mut().zip(bound.iter().take(storage.len())) {
            *slot = Some((r.buffer.uid(), r.offset, r.size));
        }
        let bind_key = BindKey {
            pipeline: key,
            uniform: ubuf.uid(),
            uniform_bytes,
            bound: bound_key,
        };
        let bg = match self.kernels.bind_groups.get(&bind_key) {
            Some(bg) => bg.clone(),
            None => {
                let mut entries = Vec::with_capacity(1 + storage.len());
                entries.push(wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: ubuf.raw(),
                        offset: 0,
                        size: NonZeroU64::new(uniform_bytes),
                    }),
                });
                for (&b, r) in storage.iter().zip(bound) {
                    entries.push(wgpu::BindGroupEntry {
                        binding: b,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: r.buffer.raw(),
                            offset: r.offset,
                            size: NonZeroU64::new(r.size),
                        }),
                    });
                }
                let bg = self
                    .kernels
                    .device
                    .create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(bind_key.pipeline.entry),
                        layout: &bgl,
                        entries: &entries,
                    });
                self.kernels.cache_bind_group(bind_key, bg.clone());
                bg
            }
        };
        match &mut self.recorder {
            Some(r) => {
                if r.current.as_ref() != Some(&pipeline) {
                    self.pass.set_pipeline(&pipeline);
                    r.current = Some(pipeline.clone());
                }
                self.pass.set_bind_group(0, &bg, &[uoffset]);
                r.dispatches.push(RecordedDispatch {
                    pipeline,
                    bind_group: bg,
                    uniform_chunk: ubuf.uid(),
                    uniform_raw: ubuf.raw().clone(),
                    uniform_offset: uoffset,
                    params: bytemuck::bytes_of(params).to_vec(),
                    workgroups: (x as u32, y as u32),
                });
            }
            None => {
                self.pass.set_pipeline(&pipeline);
                self.pass.set_bind_group(0, &bg, &[uoffset]);
            }
        }
        self.pass.dispatch_workgroups(x as u32, y as u32, 1);
        Ok(())
    }
}
