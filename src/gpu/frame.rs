//! One submit's worth of commands: what the runtime's executor records an iteration into.
//!
//! A [`Frame`] holds the command encoder, the open compute pass (consecutive kernels share
//! one; a copy closes it, since wgpu locks the encoder while a pass is open), the kernels and
//! their uniform slots, and a validation error scope around all of it. The runtime reaches
//! wgpu only through this type and the [`Engine`]: it records copies and dispatches here,
//! then [`Frame::submit`]s and awaits [`Submitted::check`].
//!
//! On an application's device ([`super::Gpu::from_device`]) a frame is cut into slices
//! between nodes (see [`super::embed`]): a slice is submitted once it holds the dispatches
//! the slicer allows, and the slice before it is waited for, so that the app's frames get
//! the queue between slices. The slices run in recording order, so results do not change.

use super::kernels::plan::{RecordedDispatch, Recorder};
use super::kernels::{
    movement, quant, DispatchPlan, Encoder, KernelError, Kernels, Operand, UniformArena,
};
use super::{Buffer, Engine};
use crate::graph::Op;

/// One command of a frame, as a [`CommandLog`] keeps it.
#[derive(Clone)]
enum Logged {
    Dispatch(RecordedDispatch),
    Copy {
        src: wgpu::Buffer,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    },
    Write {
        dst: wgpu::Buffer,
        offset: u64,
        bytes: Vec<u8>,
    },
}

/// Every command a [`Frame`] recorded, in order, with the objects it used (pipelines, bind
/// groups, uniform slots, buffers): what a hand-written wgpu loop doing the same work would
/// issue with everything created beforehand. `dynrt-bench decode` replays it to measure the
/// runtime's host overhead on the dynamic decode step. The log keeps the buffers it names
/// alive; replay it only while they are in use by the request that recorded it.
#[derive(Clone, Default)]
pub struct CommandLog {
    cmds: Vec<Logged>,
}

/// One command of a [`CommandLog`], for a caller that issues it with wgpu itself.
pub enum LoggedCommand<'a> {
    /// A compute dispatch: its pipeline, its bind group (uniform slot at `uniform_offset` of
    /// `uniform`, whose bytes are `params`), and its workgroups.
    Dispatch {
        /// The pipeline.
        pipeline: &'a wgpu::ComputePipeline,
        /// The bind group (binding 0 is the uniform, with a dynamic offset).
        bind_group: &'a wgpu::BindGroup,
        /// The uniform buffer the bind group binds.
        uniform: &'a wgpu::Buffer,
        /// The dynamic offset of this dispatch's slot.
        uniform_offset: u32,
        /// The slot's bytes.
        params: &'a [u8],
        /// Workgroups in x and y.
        workgroups: (u32, u32),
    },
    /// A buffer copy.
    Copy {
        /// Source buffer.
        src: &'a wgpu::Buffer,
        /// Source offset, bytes.
        src_offset: u64,
        /// Destination buffer.
        dst: &'a wgpu::Buffer,
        /// Destination offset, bytes.
        dst_offset: u64,
        /// Bytes.
        size: u64,
    },
    /// A queue write made before the submit.
    Write {
        /// The buffer written.
        dst: &'a wgpu::Buffer,
        /// Offset, bytes.
        offset: u64,
        /// The bytes.
        bytes: &'a [u8],
    },
}

impl CommandLog {
    /// The commands, in recording order.
    pub fn commands(&self) -> impl Iterator<Item = LoggedCommand<'_>> {
        self.cmds.iter().map(|c| match c {
            Logged::Dispatch(d) => LoggedCommand::Dispatch {
                pipeline: &d.pipeline,
                bind_group: &d.bind_group,
                uniform: &d.uniform_raw,
                uniform_offset: d.uniform_offset,
                params: &d.params,
                workgroups: d.workgroups,
            },
            Logged::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                size,
            } => LoggedCommand::Copy {
                src,
                src_offset: *src_offset,
                dst,
                dst_offset: *dst_offset,
                size: *size,
            },
            Logged::Write { dst, offset, bytes } => LoggedCommand::Write {
                dst,
                offset: *offset,
                bytes,
            },
        })
    }

    /// Dispatches logged.
    pub fn dispatches(&self) -> usize {
        self.cmds
            .iter()
            .filter(|c| matches!(c, Logged::Dispatch(_)))
            .count()
    }
}

/// The open compute pass and the pipeline bound in it.
struct OpenPass {
    pass: wgpu::ComputePass<'static>,
    pipeline: Option<wgpu::ComputePipeline>,
}

/// Commands of one submit being recorded (see the module docs).
pub struct Frame<'k> {
    engine: Engine,
    scope: wgpu::ErrorScopeGuard,
    encoder: wgpu::CommandEncoder,
    pass: Option<OpenPass>,
    kernels: &'k mut Kernels,
    uniforms: UniformArena,
    /// Dynamic offsets of a replay (kept to avoid an allocation per node).
    offsets: Vec<u32>,
    /// Queue writes made just before the submit.
    writes: Vec<(wgpu::Buffer, u64, Vec<u8>)>,
    /// Dispatches and copies recorded since the last slice was submitted.
    since_slice: u32,
    /// The last slice submitted and not yet waited for: its index, when it was submitted,
    /// and how many dispatches it held.
    in_flight: Option<(wgpu::SubmissionIndex, web_time::Instant, u32)>,
    /// Every command, when logging ([`Frame::log_commands`]).
    log: Option<CommandLog>,
}

/// Most bytes [`Frame`] packs into one upload per submit (the upload buffer's size); larger
/// writes go to the queue on their own.
const UPLOAD_PACK_BYTES: u64 = 1 << 20;

/// How [`Frame::encode_planned`] recorded a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Dispatches recorded.
    pub dispatches: usize,
    /// Whether they were replayed from the node's plan (no shape checks, no parameter
    /// computation, no cache lookups).
    pub replayed: bool,
}

/// A submitted frame whose error scope is still to be read.
pub struct Submitted {
    scope: wgpu::ErrorScopeGuard,
    index: wgpu::SubmissionIndex,
    finish_ns: u64,
    submit_ns: u64,
}

impl Submitted {
    /// The queue's index of the submit (what a readback waits for).
    pub(crate) fn index(&self) -> wgpu::SubmissionIndex {
        self.index.clone()
    }

    /// Nanoseconds of wgpu's `CommandEncoder::finish` (where wgpu validates the recorded
    /// commands and encodes them for the driver) and of the queue's submit call.
    pub fn host_ns(&self) -> (u64, u64) {
        (self.finish_ns, self.submit_ns)
    }

    /// Waits for the validation scope of the submit.
    ///
    /// # Errors
    /// wgpu's validation message.
    pub async fn check(self) -> Result<(), String> {
        match self.scope.pop().await {
            Some(e) => Err(e.to_string()),
            None => Ok(()),
        }
    }
}

impl<'k> Frame<'k> {
    /// Starts recording: opens a validation scope and an encoder; `uniforms` is reset and
    /// given back by [`Frame::submit`] (its chunks are reused from iteration to iteration).
    pub fn begin(
        engine: &Engine,
        kernels: &'k mut Kernels,
        mut uniforms: UniformArena,
        label: &str,
    ) -> Frame<'k> {
        let device = engine.gpu().device();
        // A validation error would otherwise only be logged and the whole submit silently
        // skipped; the scope turns it into an error of the caller.
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let encoder =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        uniforms.reset();
        Frame {
            engine: engine.clone(),
            scope,
            encoder,
            pass: None,
            kernels,
            uniforms,
            offsets: Vec::new(),
            writes: Vec::new(),
            since_slice: 0,
            in_flight: None,
            log: None,
        }
    }

    /// On a sliced (shared) device, submits what is recorded once it holds a slice's worth
    /// of dispatches, then waits for the slice submitted before it. Called between nodes.
    fn slice_if_due(&mut self) {
        let gpu = self.engine.gpu().clone();
        let Some(slicer) = gpu.slicer() else {
            return;
        };
        if self.since_slice < slicer.dispatches() {
            return;
        }
        self.pass = None;
        // Uniform slots and queue writes recorded so far must land before this slice's
        // commands; later ones land before the next slice (their buffers are not read by
        // the commands already submitted: see `write_before_submit`).
        let head = self.pack_writes();
        let next = gpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("dynrt iteration slice"),
            });
        let done = std::mem::replace(&mut self.encoder, next);
        let index = {
            let _device = gpu.lock_device();
            gpu.queue().submit(head.into_iter().chain([done.finish()]))
        };
        let slice = (index, web_time::Instant::now(), self.since_slice);
        self.since_slice = 0;
        if let Some((prev, at, n)) = self.in_flight.replace(slice) {
            gpu.wait_for(prev);
            slicer.observe(n, at.elapsed());
        }
    }

    /// Logs every command recorded from now on ([`Frame::submit`] returns the log).
    pub fn log_commands(&mut self) {
        self.log.get_or_insert_with(CommandLog::default);
    }

    /// The kernels (for their generation and counters).
    pub fn kernels(&mut self) -> &mut Kernels {
        self.kernels
    }

    /// Records a buffer copy (closing the open compute pass). Offsets and size must be
    /// multiples of 4 and the buffers distinct (WebGPU forbids a copy within one buffer).
    pub fn copy(
        &mut self,
        src: &Buffer,
        src_offset_bytes: u64,
        dst: &Buffer,
        dst_offset_bytes: u64,
        size_bytes: u64,
    ) {
        self.slice_if_due();
        self.since_slice += 1;
        self.pass = None;
        self.encoder.copy_buffer_to_buffer(
            src.raw(),
            src_offset_bytes,
            dst.raw(),
            dst_offset_bytes,
            size_bytes,
        );
        if let Some(log) = &mut self.log {
            log.cmds.push(Logged::Copy {
                src: src.raw().clone(),
                src_offset: src_offset_bytes,
                dst: dst.raw().clone(),
                dst_offset: dst_offset_bytes,
                size: size_bytes,
            });
        }
    }

    /// Schedules a queue write that lands before every command of this frame's submit (so the
    /// buffer must not be read by an earlier command of the same frame). On a sliced device
    /// it lands before the current slice: after earlier slices, which do not read it either.
    pub fn write_before_submit(&mut self, dst: &Buffer, offset_bytes: u64, bytes: Vec<u8>) {
        if let Some(log) = &mut self.log {
            log.cmds.push(Logged::Write {
                dst: dst.raw().clone(),
                offset: offset_bytes,
                bytes: bytes.clone(),
            });
        }
        self.writes.push((dst.raw().clone(), offset_bytes, bytes));
    }

    fn open_pass(&mut self) -> &mut OpenPass {
        let encoder = &mut self.encoder;
        self.pass.get_or_insert_with(|| OpenPass {
            pass: encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("dynrt kernels"),
                    timestamp_writes: None,
                })
                .forget_lifetime(),
            pipeline: None,
        })
    }

    /// Records `op` into the open compute pass (opening one if needed), keeping nothing for a
    /// plan. Returns the dispatch count.
    ///
    /// # Errors
    /// As [`Kernels::encode`].
    pub fn encode(
        &mut self,
        op: &Op,
        ins: &[Operand<'_>],
        out: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        self.slice_if_due();
        self.open_pass();
        let Frame {
            pass,
            kernels,
            uniforms,
            log,
            ..
        } = self;
        let Some(open) = pass.as_mut() else {
            return Ok(0);
        };
        // `encode` sets its own pipelines: which one is bound afterwards is not tracked.
        open.pipeline = None;
        let n = match log {
            None => kernels.encode(&mut open.pass, uniforms, op, ins, out)?,
            Some(log) => {
                let mut recorder = Recorder::default();
                let n = kernels.encode_recorded(
                    &mut open.pass,
                    uniforms,
                    op,
                    ins,
                    out,
                    &mut recorder,
                )?;
                log.cmds
                    .extend(recorder.dispatches.into_iter().map(Logged::Dispatch));
                n
            }
        };
        self.since_slice += n as u32;
        Ok(n)
    }

    /// Records the device check of a gather's indices `ids` against an axis of `rows`
    /// entries, writing its fault record at `fault`
    /// ([`crate::gpu::kernels::movement::encode_index_check`]). Encoded afresh each time (no
    /// plan: only gathers whose indices a kernel computes have one). Returns the dispatch
    /// count.
    ///
    /// # Errors
    /// As [`crate::gpu::kernels::movement::encode_index_check`].
    pub fn check_indices(
        &mut self,
        ids: &Operand<'_>,
        rows: u64,
        fault: &Operand<'_>,
    ) -> Result<usize, KernelError> {
        self.encode_direct(|e| movement::encode_index_check(e, ids, rows, fault))
    }

    /// Records the reorder of the weight `src` into the grouped layout of its format in
    /// `dst` ([`crate::gpu::kernels::quant::encode_regroup`]). Returns the dispatch count.
    ///
    /// # Errors
    /// As [`crate::gpu::kernels::quant::encode_regroup`].
    pub fn regroup(&mut self, src: &Operand<'_>, dst: &Operand<'_>) -> Result<usize, KernelError> {
        self.encode_direct(|e| quant::encode_regroup(e, src, dst))
    }

    /// Records what `encode` writes into the open compute pass (opening one if needed): a
    /// dispatch outside the op table, encoded afresh each time and logged like any other.
    fn encode_direct(
        &mut self,
        encode: impl FnOnce(&mut Encoder<'_, '_>) -> Result<usize, KernelError>,
    ) -> Result<usize, KernelError> {
        self.slice_if_due();
        self.open_pass();
        let Frame {
            pass,
            kernels,
            uniforms,
            log,
            ..
        } = self;
        let Some(open) = pass.as_mut() else {
            return Ok(0);
        };
        let mut recorder = Recorder {
            current: open.pipeline.take(),
            dispatches: Vec::new(),
        };
        let result = kernels.encode_direct(&mut open.pass, uniforms, &mut recorder, encode);
        open.pipeline = recorder.current;
        let n = result?;
        if let Some(log) = log {
            log.cmds
                .extend(recorder.dispatches.into_iter().map(Logged::Dispatch));
        }
        self.since_slice += n as u32;
        Ok(n)
    }

    /// Records a node: replays `plan` when it matches these operands (one uniform slot,
    /// `set_bind_group`, `dispatch`, and `set_pipeline` only when the pass holds another
    /// pipeline), else encodes afresh and stores the new plan in `plan`.
    ///
    /// # Errors
    /// As [`Kernels::encode`].
    pub fn encode_planned(
        &mut self,
        op: &Op,
        ins: &[Operand<'_>],
        out: &Operand<'_>,
        plan: &mut Option<DispatchPlan>,
    ) -> Result<Planned, KernelError> {
        self.slice_if_due();
        let generation = self.kernels.generation();
        if let Some(p) = plan.as_ref() {
            if p.matches(ins, out, generation) && self.replay(p)? {
                let n = p.dispatches.len();
                self.since_slice += n as u32;
                self.kernels.count_replayed(n as u64);
                if let Some(log) = &mut self.log {
                    for (d, &offset) in p.dispatches.iter().zip(&self.offsets) {
                        let mut d = d.clone();
                        d.uniform_offset = offset;
                        log.cmds.push(Logged::Dispatch(d));
                    }
                }
                return Ok(Planned {
                    dispatches: n,
                    replayed: true,
                });
            }
        }
        self.open_pass();
        let Frame {
            pass,
            kernels,
            uniforms,
            ..
        } = self;
        let Some(open) = pass.as_mut() else {
            return Ok(Planned {
                dispatches: 0,
                replayed: false,
            });
        };
        let mut recorder = Recorder {
            current: open.pipeline.take(),
            dispatches: Vec::new(),
        };
        let result = kernels.encode_recorded(&mut open.pass, uniforms, op, ins, out, &mut recorder);
        open.pipeline = recorder.current;
        let n = result?;
        self.since_slice += n as u32;
        if let Some(log) = &mut self.log {
            log.cmds
                .extend(recorder.dispatches.iter().cloned().map(Logged::Dispatch));
        }
        let operands = ins
            .iter()
            .chain(std::iter::once(out))
            .map(|o| {
                (
                    o.tensor.buffer.uid(),
                    o.tensor.offset_bytes,
                    o.tensor.size_bytes,
                )
            })
            .collect();
        let strides = ins
            .iter()
            .chain(std::iter::once(out))
            .map(|o| o.strides.map(<[u64]>::to_vec))
            .collect();
        let layouts = ins
            .iter()
            .chain(std::iter::once(out))
            .map(|o| o.layout)
            .collect();
        *plan = Some(DispatchPlan {
            operands,
            strides,
            layouts,
            dispatches: recorder.dispatches,
            generation,
        });
        Ok(Planned {
            dispatches: n,
            replayed: false,
        })
    }

    /// Records a plan's dispatches again in fresh uniform slots. Returns false, recording
    /// nothing, when a slot lands in another uniform chunk than the bind group binds (the
    /// caller then encodes afresh; the slots taken stay unused).
    fn replay(&mut self, plan: &DispatchPlan) -> Result<bool, KernelError> {
        self.offsets.clear();
        for d in &plan.dispatches {
            let (chunk, offset) = self
                .uniforms
                .push_bytes(&d.params)
                .map_err(KernelError::Uniforms)?;
            if chunk.uid() != d.uniform_chunk {
                return Ok(false);
            }
            self.offsets.push(offset);
        }
        self.open_pass();
        let Frame { pass, offsets, .. } = self;
        let Some(open) = pass.as_mut() else {
            return Ok(false);
        };
        for (d, &offset) in plan.dispatches.iter().zip(offsets.iter()) {
            if open.pipeline.as_ref() != Some(&d.pipeline) {
                open.pass.set_pipeline(&d.pipeline);
                open.pipeline = Some(d.pipeline.clone());
            }
            open.pass.set_bind_group(0, &d.bind_group, &[offset]);
            open.pass
                .dispatch_workgroups(d.workgroups.0, d.workgroups.1, 1);
        }
        Ok(true)
    }

    /// Writes the uniform slots and the scheduled queue writes, submits the commands, and
    /// gives the uniform arena back (and the command log, when logging). Await
    /// [`Submitted::check`] for validation errors.
    pub fn submit(mut self) -> (Submitted, UniformArena, Option<CommandLog>) {
        self.pass = None;
        let head = self.pack_writes();
        let gpu = self.engine.gpu();
        let started = web_time::Instant::now();
        let commands = self.encoder.finish();
        let finished = web_time::Instant::now();
        let index = {
            // On llvmpipe the submit runs the frame's kernels before it returns, holding the
            // GL context all along (see `Gpu::lock_device`).
            let _device = gpu.lock_device();
            gpu.queue().submit(head.into_iter().chain([commands]))
        };
        let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        (
            Submitted {
                scope: self.scope,
                index,
                finish_ns: nanos(finished.duration_since(started)),
                submit_ns: nanos(finished.elapsed()),
            },
            self.uniforms,
            self.log,
        )
    }

    /// Gets the changed uniform slots and the scheduled writes onto the device before the
    /// next submit's commands. Several of them are packed into the arena's upload buffer with
    /// one queue write and copied to their places by the command buffer returned, which the
    /// caller submits first: wgpu creates a staging buffer for every `write_buffer`, so a
    /// decode step of the exported SmolLM2 created one per changed uniform chunk and input
    /// (6 per step) and now creates one. All written directly, in order, as before: writes
    /// past [`UPLOAD_PACK_BYTES`] in all, a single write, a length the copy alignment does not
    /// divide, or when the upload buffer cannot be had (never some of each: writes may
    /// overlap, the later must win, and a direct write lands before every copy of the head).
    fn pack_writes(&mut self) -> Option<wgpu::CommandBuffer> {
        // All or nothing, in order: the writes may overlap (a later one must win), and a
        // direct write lands before every copy of the head.
        let mut pieces: Vec<(wgpu::Buffer, u64, u64, u64)> = Vec::new();
        let mut packed: Vec<u8> = Vec::new();
        let mut add = |buf: &wgpu::Buffer, offset: u64, bytes: &[u8]| {
            pieces.push((buf.clone(), offset, packed.len() as u64, bytes.len() as u64));
            packed.extend_from_slice(bytes);
        };
        self.uniforms.take_changes(&mut add);
        for (buf, offset, bytes) in std::mem::take(&mut self.writes) {
            add(&buf, offset, &bytes);
        }
        let aligned = pieces
            .iter()
            .all(|p| p.3 % wgpu::COPY_BUFFER_ALIGNMENT == 0);
        // A large total (a fed KV cache, a first iteration's uniforms) is written directly:
        // packing it would keep an upload buffer its size.
        let small = packed.len() as u64 <= UPLOAD_PACK_BYTES;
        let upload = match (pieces.len() > 1 && aligned && small, packed.len() as u64) {
            (true, bytes) => self.uniforms.upload(bytes).ok(),
            (false, _) => None,
        };
        let Some(upload) = upload else {
            for (buf, offset, start, len) in &pieces {
                let range = *start as usize..(*start + *len) as usize;
                self.engine.queue_write_raw(buf, *offset, &packed[range]);
            }
            return None;
        };
        self.engine.queue_write_raw(upload.raw(), 0, &packed);
        let mut head =
            self.engine
                .gpu()
                .device()
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("dynrt uploads"),
                });
        for (buf, offset, start, len) in &pieces {
            head.copy_buffer_to_buffer(upload.raw(), *start, buf, *offset, *len);
        }
        Some(head.finish())
    }

    /// Drops the recorded commands without submitting them and gives the uniform arena back
    /// (after an encode error: nothing more of this frame reaches the device; on a sliced
    /// device the slices already submitted have run).
    pub fn abandon(mut self) -> UniformArena {
        self.pass = None;
        drop(self.scope.pop());
        self.uniforms
    }
}
