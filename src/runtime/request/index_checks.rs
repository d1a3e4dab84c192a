//! The gathers whose indices only the device sees, checked there: one fault record each,
//! read back after the submit.

use super::{alloc_err, InferRequest};
use crate::gpu::kernels::{movement, Operand, TensorRef};
use crate::gpu::{Buffer, BufferDesc, Engine};
use crate::graph::{ops, NodeId, Op};
use crate::memory::regions::Region;
use crate::memory::AllocKind;
use crate::runtime::compile::{Compiled, Role};
use crate::runtime::RunError;
use crate::shape::{DType, Shape};

/// The gathers whose indices a kernel computes, so only the device sees them: each gets a
/// fault record ([`movement::FAULT_RECORD_BYTES`]) in one buffer, zeroed before every
/// submit, written by [`movement::encode_index_check`] and read back after the submit. Other
/// gathers' indices are checked on the host (fed inputs and constants by the request state, host
/// values by the gather's shape rule), so a graph without such a gather (the LLM paths,
/// whose ids are fed) never reads back more than its outputs.
pub(super) struct IndexChecks {
    /// Processing positions of the checked gathers, ascending; record `i` is the `i`th's.
    nodes: Vec<usize>,
    pub(super) buffer: Buffer,
    /// The shape of one record as an operand (four u32 words).
    record: Shape,
}

impl IndexChecks {
    /// The checks `compiled` needs, their buffer allocated from `engine`; `None` when no
    /// gather's indices are computed on the device.
    pub(super) fn new(
        engine: &Engine,
        compiled: &Compiled,
    ) -> Result<Option<IndexChecks>, RunError> {
        let host_known = |id: NodeId| {
            matches!(
                compiled.node(compiled.pos(id)).role,
                Role::Input { state: None } | Role::Constant | Role::ShapeOnly | Role::HostValue
            )
        };
        let nodes: Vec<usize> = compiled
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let node = compiled.graph.node(c.id);
                c.role == Role::Kernel
                    && matches!(node.op, Op::Gather(_))
                    && node.inputs.get(1).is_some_and(|&ids| !host_known(ids))
            })
            .map(|(k, _)| k)
            .collect();
        if nodes.is_empty() {
            return Ok(None);
        }
        let buffer = engine
            .allocate_in(
                Region::Internal,
                &BufferDesc {
                    label: "dynrt gather index checks",
                    size_bytes: nodes.len() as u64 * movement::FAULT_RECORD_BYTES,
                    kind: AllocKind::UsmDevice,
                },
            )
            .map_err(alloc_err("gather index checks"))?;
        Ok(Some(IndexChecks {
            nodes,
            buffer,
            record: Shape::new(vec![movement::FAULT_RECORD_BYTES / 4]),
        }))
    }

    /// The fault record of node `k` as an operand, when it is checked on the device.
    pub(super) fn record_of(&self, k: usize) -> Option<Operand<'_>> {
        let i = self.nodes.binary_search(&k).ok()?;
        Some(Operand {
            tensor: TensorRef {
                buffer: &self.buffer,
                offset_bytes: i as u64 * movement::FAULT_RECORD_BYTES,
                size_bytes: movement::FAULT_RECORD_BYTES,
            },
            shape: &self.record,
            dtype: DType::U32,
            strides: None,
            layout: crate::gpu::kernels::WeightLayout::File,
        })
    }
}

impl InferRequest {
    /// Reads the fault records of the gathers checked on the device (after the submit: this
    /// waits for it) and reports the first gather, in processing order, that met an index out
    /// of range.
    ///
    /// # Errors
    /// [`RunError::IndexOutOfRange`] naming the node; [`RunError::Alloc`] when the readback
    /// fails.
    pub(super) async fn read_index_checks(&self) -> Result<(), RunError> {
        let Some(checks) = &self.index_checks else {
            return Ok(());
        };
        let bytes = self
            .engine()
            .read(&checks.buffer, 0, checks.buffer.size_bytes())
            .await
            .map_err(alloc_err("reading the gather index checks"))?;
        let compiled = &self.net.inner.compiled;
        for (record, &k) in bytes
            .chunks_exact(movement::FAULT_RECORD_BYTES as usize)
            .zip(&checks.nodes)
        {
            let word = |i: usize| {
                u32::from_le_bytes([
                    record[4 * i],
                    record[4 * i + 1],
                    record[4 * i + 2],
                    record[4 * i + 3],
                ])
            };
            if word(0) == 0 {
                continue;
            }
            let node = compiled.graph.node(compiled.nodes[k].id);
            let Op::Gather(g) = &node.op else {
                continue;
            };
            let table = self.state.shape(node.inputs[0]);
            let bound = ops::axis_index(g.axis, table.rank())
                .map(|a| table.dims()[a])
                .unwrap_or(0);
            return Err(RunError::IndexOutOfRange {
                node: node.label.clone(),
                op: node.op.name(),
                position: u64::from(word(1)),
                index: (u64::from(word(2)) | u64::from(word(3)) << 32) as i64,
                bound,
            });
        }
        Ok(())
    }
}
