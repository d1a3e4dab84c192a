//! What a kernel family's encode works with: [`Encoder::bind`] checks a tensor range and
//! splits its offset for the uniform, [`Encoder::dispatch`] records one dispatch in its own
//! uniform slot with a cached bind group.
//!
//! No two storage bindings of a dispatch overlap. Every storage binding is `read_write`
//! (tensors are sub-ranges of shared arena buffers, and a buffer may not be read-only and
//! writable storage in one dispatch), and WebGPU implementations that validate (Dawn: the
//! browsers, ONNX Runtime's WebGPU EP) reject a dispatch with two writable bindings of one
//! buffer whose ranges overlap ("writable storage buffer binding aliasing"); native wgpu does
//! not check it. So [`Encoder::dispatch`]:
//! * binds the arena's pad (`UniformArena::pad`) in slots a kernel marks unused
//!   ([`Encoder::unused`]);
//! * copies an input that overlaps another binding (the same tensor given twice, `Mul(x, x)`;
//!   an input overlapping the output) into the arena's scratch
//!   (`UniformArena::scratch`) with a `movement_copy` dispatch recorded just before,
//!   and binds the copy. Copying rather than binding the range once keeps every shader as it
//!   is (each declares one variable per operand), and the copy only happens in graphs that
//!   alias operands;
//! * then checks that no two bindings overlap, always (release builds included, so native
//!   tests catch what Dawn would reject): [`KernelError::AliasedBindings`] otherwise.

use super::layout::u32_of;
use super::plan::{RecordedDispatch, Recorder};
use super::{KernelError, Kernels, PipelineKey, TensorRef, UniformArena, MAX_STORAGE_BINDINGS};
use crate::gpu::{Buffer, BufferUid};
use std::num::NonZeroU64;

/// One storage binding of a dispatch: a range of a buffer, or an unused slot.
#[derive(Clone, Copy)]
pub struct Bound<'a> {
    /// `None`: a slot the dispatch does not use ([`Encoder::unused`]).
    pub(crate) buffer: Option<&'a Buffer>,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    /// The operand's name ([`Encoder::bind`]'s `what`); the kernel writes `"output"` and
    /// [`WRITTEN`]'s others.
    pub(crate) what: &'static str,
    /// With no buffer: the arena's kernel workspace ([`Encoder::workspace`]) rather than an
    /// unused slot.
    pub(crate) workspace: bool,
}

/// The names of operands other than `"output"` that a kernel writes: a fused projection's key
/// and value rows, which it stores into the KV cache.
pub(crate) const WRITTEN: [&str; 2] = ["key rows", "value rows"];

impl Bound<'_> {
    /// Whether the kernel writes this binding (kernels bind what they write as `"output"` or
    /// one of [`WRITTEN`]).
    fn writes(&self) -> bool {
        self.what == "output" || WRITTEN.contains(&self.what)
    }

    /// The buffer range it binds (`None` for an unused slot).
    fn range(&self) -> Option<(BufferUid, u64, u64)> {
        self.buffer.map(|b| (b.uid(), self.offset, self.size))
    }
}

/// Whether two `(buffer, offset, size)` ranges share a byte: the one aliasing rule, used to
/// decide which operands to copy apart and to check every dispatch.
fn overlap(a: (BufferUid, u64, u64), b: (BufferUid, u64, u64)) -> bool {
    a.0 == b.0 && a.1 < b.1 + b.2 && b.1 < a.1 + a.2
}

/// A storage binding resolved to a buffer.
struct Slot {
    raw: wgpu::Buffer,
    uid: BufferUid,
    offset: u64,
    size: u64,
    what: &'static str,
}

impl Slot {
    fn overlaps(&self, o: &Slot) -> bool {
        overlap(
            (self.uid, self.offset, self.size),
            (o.uid, o.offset, o.size),
        )
    }
}

/// The first pair of `slots` whose ranges overlap, as their names.
fn first_overlap(slots: &[Slot]) -> Option<(&'static str, &'static str)> {
    slots.iter().enumerate().find_map(|(k, b)| {
        slots[..k]
            .iter()
            .find(|a| a.overlaps(b))
            .map(|a| (a.what, b.what))
    })
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
    /// `min_storage_buffer_offset_alignment` (a wgpu rule), tensors only of 4 bytes.
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
                buffer: Some(t.buffer),
                offset: base,
                size,
                what,
                workspace: false,
            },
            u32_of(what, skew / 4)?,
        ))
    }

    /// The binding of a storage slot the entry point declares and this dispatch leaves
    /// unused: [`Encoder::dispatch`] binds the arena's pad there, which overlaps nothing.
    pub fn unused(&self) -> Bound<'static> {
        Bound {
            buffer: None,
            offset: 0,
            size: 4,
            what: "unused slot",
            workspace: false,
        }
    }

    /// A binding of the first `bytes` of the arena's kernel workspace
    /// (`UniformArena::workspace`), grown now if smaller, for a kernel that passes data
    /// between its own dispatches: every dispatch given it binds the same buffer until the
    /// next call. It overlaps no tensor. Kernels bind it as `"output"` where they write it.
    ///
    /// # Errors
    /// [`KernelError::Uniforms`] when the workspace cannot be allocated;
    /// [`KernelError::BindingTooLarge`] beyond the device's binding limit.
    pub fn workspace(
        &mut self,
        what: &'static str,
        bytes: u64,
    ) -> Result<Bound<'static>, KernelError> {
        let size = bytes.max(4);
        if size > self.kernels.max_binding_bytes {
            return Err(KernelError::BindingTooLarge {
                what,
                size_bytes: size,
                max_bytes: self.kernels.max_binding_bytes,
            });
        }
        self.uniforms
            .workspace(size)
            .map_err(KernelError::Uniforms)?;
        Ok(Bound {
            buffer: None,
            offset: 0,
            size,
            what,
            workspace: true,
        })
    }

    /// Records one dispatch of `key` with `params` in a fresh uniform slot. Workgroup counts
    /// above `max_compute_workgroups_per_dimension` go to a 2-D grid (kernels linearise it with
    /// `workgroup_index` of `shaders/common/prelude.wgsl`); 0 workgroups record nothing.
    /// Unused slots get the pad, inputs overlapping another binding are copied to scratch first
    /// (module docs).
    ///
    /// # Errors
    /// [`KernelError::TooManyWorkgroups`] beyond the 2-D grid; [`KernelError::AliasedBindings`]
    /// when two outputs overlap; uniform, pad or scratch allocation errors.
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
        let alloc = KernelError::Uniforms;
        let storage = (key.family.bindings)(key.entry);
        let bound = &bound[..bound.len().min(storage.len()).min(MAX_STORAGE_BINDINGS)];
        // Which inputs to copy: of two overlapping bindings, the one the kernel does not write
        // (the later if it writes neither); copied ones overlap nothing any more. Fixed-size
        // tables: this runs for every dispatch that is encoded, and allocates nothing.
        let mut copied = [false; MAX_STORAGE_BINDINGS];
        for k in 0..bound.len() {
            for j in 0..k {
                if copied[j] || copied[k] {
                    continue;
                }
                let (a, b) = (&bound[j], &bound[k]);
                let aliased = match (a.range(), b.range()) {
                    (Some(x), Some(y)) => overlap(x, y),
                    _ => false,
                };
                if !aliased {
                    continue;
                }
                match (a.writes(), b.writes()) {
                    (true, true) => {
                        return Err(KernelError::AliasedBindings {
                            entry: key.entry,
                            first: a.what,
                            second: b.what,
                        })
                    }
                    (false, true) => copied[j] = true,
                    _ => copied[k] = true,
                }
            }
        }
        let align = self.kernels.storage_align_bytes;
        let mut at = [0u64; MAX_STORAGE_BINDINGS];
        let mut total = 0u64;
        for ((b, &c), at) in bound.iter().zip(&copied).zip(&mut at) {
            *at = total;
            if c {
                total += b.size.div_ceil(align) * align;
            }
        }
        let scratch = if total > 0 {
            let s = self.uniforms.scratch(total).map_err(alloc)?;
            Some((s.raw().clone(), s.uid()))
        } else {
            None
        };
        let mut slots = Vec::with_capacity(bound.len());
        let mut unused = 0;
        for ((b, &c), &off) in bound.iter().zip(&copied).zip(&at) {
            let original = |raw: &wgpu::Buffer, uid| Slot {
                raw: raw.clone(),
                uid,
                offset: b.offset,
                size: b.size,
                what: b.what,
            };
            let slot = match (b.buffer, &scratch) {
                (Some(buf), Some((raw, uid))) if c => {
                    let to = Slot {
                        raw: raw.clone(),
                        uid: *uid,
                        offset: off,
                        size: b.size,
                        what: b.what,
                    };
                    self.copy_words(original(buf.raw(), buf.uid()), &to)?;
                    to
                }
                (Some(buf), _) => original(buf.raw(), buf.uid()),
                (None, _) if b.workspace => {
                    let w = self.uniforms.workspace(b.size).map_err(alloc)?;
                    original(w.raw(), w.uid())
                }
                (None, _) => {
                    // Each unused slot its own alignment unit of the pad.
                    let p = self
                        .uniforms
                        .pad(align * MAX_STORAGE_BINDINGS as u64)
                        .map_err(alloc)?;
                    let slot = Slot {
                        raw: p.raw().clone(),
                        uid: p.uid(),
                        offset: unused * align,
                        size: b.size,
                        what: b.what,
                    };
                    unused += 1;
                    slot
                }
            };
            slots.push(slot);
        }
        self.record(key, bytemuck::bytes_of(params), &slots, workgroups)
    }

    /// Records a `movement_copy` of the whole words of `from` (its size) into `to`.
    fn copy_words(&mut self, from: Slot, to: &Slot) -> Result<(), KernelError> {
        let n = from.size / 4;
        let words = u32_of("copied operand", n)?;
        let p = super::movement::CopyParams {
            numel: words,
            rank: 1,
            in_offset: 0,
            out_offset: 0,
            shape: super::layout::pack8(&[words]),
            in_strides: super::layout::pack8(&[1]),
            out_strides: super::layout::pack8(&[1]),
        };
        let to = Slot {
            raw: to.raw.clone(),
            uid: to.uid,
            offset: to.offset,
            size: to.size,
            what: "output",
        };
        self.record(
            super::movement::FAMILY.key("movement_copy"),
            bytemuck::bytes_of(&p),
            &[from, to],
            n.div_ceil(256),
        )
    }

    /// Records one dispatch of resolved bindings, after checking that none overlap.
    fn record(
        &mut self,
        key: PipelineKey,
        params: &[u8],
        slots: &[Slot],
        workgroups: u64,
    ) -> Result<(), KernelError> {
        if workgroups == 0 {
            return Ok(());
        }
        if let Some((first, second)) = first_overlap(slots) {
            return Err(KernelError::AliasedBindings {
                entry: key.entry,
                first,
                second,
            });
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
            .push_bytes(params)
            .map_err(KernelError::Uniforms)?;
        let storage = (key.family.bindings)(key.entry);
        let uniform_bytes = params.len() as u64;
        let mut bound_key: [Option<(BufferUid, u64, u64)>; MAX_STORAGE_BINDINGS] =
            Default::default();
        for (slot, r) in bound_key.iter_mut().zip(slots.iter().take(storage.len())) {
            *slot = Some((r.uid, r.offset, r.size));
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
                for (&b, r) in storage.iter().zip(slots) {
                    entries.push(wgpu::BindGroupEntry {
                        binding: b,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &r.raw,
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
                    params: params.to_vec(),
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
