//! Dispatch plans: what one node recorded (pipelines, bind groups, uniform bytes, workgroups),
//! replayed while its shapes and operand ranges stay the same. The runtime keeps one
//! [`DispatchPlan`] per kernel node and hands it to [`crate::gpu::Frame::encode_planned`].

use super::{Operand, WeightLayout};
use crate::gpu::BufferUid;

/// One dispatch as [`super::Kernels::encode_recorded`] recorded it: everything needed to
/// record it again without the shape checks, the parameter computation and the cache
/// lookups, as long as the operands are the same buffer ranges with the same shapes.
#[derive(Clone)]
pub(crate) struct RecordedDispatch {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) bind_group: wgpu::BindGroup,
    /// The uniform chunk the bind group binds; a replay must land its slot in this chunk.
    pub(crate) uniform_chunk: BufferUid,
    /// The same chunk's wgpu buffer (for command logs).
    pub(crate) uniform_raw: wgpu::Buffer,
    /// The dynamic offset of the slot when it was recorded.
    pub(crate) uniform_offset: u32,
    /// The uniform parameters (the bytes of the `#[repr(C)]` struct).
    pub(crate) params: Vec<u8>,
    /// Workgroups in x and y.
    pub(crate) workgroups: (u32, u32),
}

/// What [`super::Kernels::encode_recorded`] reads and updates: the pipeline bound in the pass
/// (`None` for a fresh pass; `set_pipeline` is skipped when a dispatch uses it) and the
/// dispatches recorded so far.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) current: Option<wgpu::ComputePipeline>,
    pub(crate) dispatches: Vec<RecordedDispatch>,
}

/// What a kernel node recorded: its operands' buffer ranges (inputs then output) and its
/// dispatches. Valid while the node's shapes are unchanged (the caller drops it when
/// update_shape runs), the operands are these ranges and the kernels' generation is the
/// same. The bind groups held here keep their buffers alive: drop the plan when one of
/// [`DispatchPlan::binds_any`]'s buffers is freed.
pub struct DispatchPlan {
    pub(crate) operands: Vec<(BufferUid, u64, u64)>,
    /// The operands' explicit strides (strided views), in the same order.
    pub(crate) strides: Vec<Option<Vec<u64>>>,
    /// The operands' weight layouts, in the same order (a weight converted in place keeps
    /// its range and changes its layout).
    pub(crate) layouts: Vec<WeightLayout>,
    pub(crate) dispatches: Vec<RecordedDispatch>,
    pub(crate) generation: u64,
}

impl std::fmt::Debug for DispatchPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchPlan")
            .field("operands", &self.operands)
            .field("dispatches", &self.dispatches.len())
            .finish()
    }
}

impl DispatchPlan {
    /// Whether the plan applies to these operands in this kernels generation.
    pub(crate) fn matches(&self, ins: &[Operand<'_>], out: &Operand<'_>, generation: u64) -> bool {
        self.generation == generation
            && self.operands.len() == ins.len() + 1
            && ins
                .iter()
                .chain(std::iter::once(out))
                .zip(&self.operands)
                .zip(&self.strides)
                .zip(&self.layouts)
                .all(|(((o, &(b, off, size)), st), &layout)| {
                    o.tensor.buffer.uid() == b
                        && o.tensor.offset_bytes == off
                        && o.tensor.size_bytes == size
                        && o.strides == st.as_deref()
                        && o.layout == layout
                })
    }

    /// Whether the plan binds any of `buffers` (then it must be dropped before they are).
    pub fn binds_any(&self, buffers: &[BufferUid]) -> bool {
        self.operands.iter().any(|(b, _, _)| buffers.contains(b))
    }

    /// Dispatches the plan records.
    pub fn dispatches(&self) -> usize {
        self.dispatches.len()
    }
}
