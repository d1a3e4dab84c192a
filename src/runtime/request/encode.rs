//! Encoding one node into the iteration's [`Frame`]: its poison fill, then its copies (state
//! growth and appends, copies, concats by copy) or its dispatches.

use super::{alloc_err, pad4, tensor_of, InferRequest};
use crate::gpu::kernels::Operand;
use crate::gpu::{Buffer, BufferDesc, Frame};
use crate::graph::{ops, NodeId, Op};
use crate::memory::regions::Region;
use crate::memory::AllocKind;
use crate::runtime::compile::{padded_bytes, Role};
use crate::runtime::network::Inner;
use crate::runtime::options::RunStats;
use crate::runtime::state::CopyRange;
use crate::runtime::RunError;

impl InferRequest {
    pub(super) fn ensure_nan_source(&mut self) -> Result<(), RunError> {
        if !self.state.options().poison {
            return Ok(());
        }
        let need = self.state.poison_need();
        if need == 0
            || self
                .nan_source
                .as_ref()
                .is_some_and(|b| b.size_bytes() >= need)
        {
            return Ok(());
        }
        let size = need.next_power_of_two().max(256);
        // All bits set is a quiet NaN in f32 (and -1 in i32): any read of unwritten bytes shows.
        let buf = self
            .engine()
            .allocate_in(
                Region::Internal,
                &BufferDesc {
                    label: "dynrt poison source",
                    size_bytes: size,
                    kind: AllocKind::UsmDevice,
                },
            )
            .map_err(alloc_err("poison source"))?;
        // All bits set: written through staging (the buffer is in order before any fill).
        self.engine()
            .write(&buf, 0, &vec![0xFFu8; size as usize])
            .map_err(alloc_err("poison source"))?;
        self.nan_source = Some(buf);
        Ok(())
    }

    /// Records what state `state` needs before this iteration writes it: a grown buffer
    /// (NaN-filled in poison mode) gets the rows held, block by block, and a past given by
    /// the caller is written into `target`, the buffer the state is in after this iteration.
    /// Returns the copies of this iteration's append (`(source offset, destination offset,
    /// size)` in bytes), for a concat state to record.
    fn encode_state_move(
        &self,
        state: usize,
        target: &Buffer,
        frame: &mut Frame<'_>,
        stats: &mut RunStats,
    ) -> Vec<CopyRange> {
        let st = &self.state.states[state];
        let old_bytes = st.buffer.as_ref().map_or(0, Buffer::size_bytes);
        let (growth, append) = st.copies(old_bytes, target.size_bytes());
        if let Some(grown) = &st.grown {
            if self.state.options().poison && st.upload.is_none() {
                if let Some(src) = self
                    .nan_source
                    .as_ref()
                    .filter(|s| s.size_bytes() >= grown.size_bytes())
                {
                    frame.copy(src, 0, grown, 0, grown.size_bytes());
                    stats.poison_fills += 1;
                }
            }
            if let Some(old) = &st.buffer {
                // Growth: the old rows move once, block by block.
                for &(from, to, size) in &growth {
                    frame.copy(old, from, grown, to, size);
                    stats.copies += 1;
                    stats.copy_bytes += size;
                }
            }
        }
        if let Some(bytes) = &st.upload {
            // A past given by the caller: written before the submit into the buffer it is
            // read from (nothing earlier in this submit reads it).
            for (from, to, size) in st.upload_writes(target.size_bytes()) {
                let (from, size) = (from as usize, size as usize);
                let part = bytes.get(from..from + size).unwrap_or_default();
                stats.input_bytes_written += part.len() as u64;
                frame.write_before_submit(target, to, part.to_vec());
            }
        }
        append
    }

    /// Records node `k`: the NaN fill in poison mode, then its copies or its dispatches.
    pub(super) fn encode_node(
        &mut self,
        inner: &Inner,
        k: usize,
        frame: &mut Frame<'_>,
    ) -> Result<(), RunError> {
        let c = &inner.compiled.nodes[k];
        let node = inner.compiled.graph.node(c.id);
        let kernel_err = |reason: String| RunError::Kernel {
            node: node.label.clone(),
            op: node.op.name(),
            reason,
        };
        let encode_err = |e| RunError::from_kernel(&node.label, node.op.name(), e);
        let poison = self.state.options().poison;
        // Poison what was handed out, before the node writes it (and after every earlier
        // command, which may still have read the previous contents).
        // Not host values: their upload is a queue write, which lands before every command
        // of the submit, so a fill here would overwrite it (they own their buffer anyway).
        let poison_now = self.state.take_poison(k)
            && poison
            && !matches!(
                c.role,
                Role::Input { .. }
                    | Role::Constant
                    | Role::KvRows
                    | Role::StateConcat { .. }
                    | Role::StateScatter { .. }
                    | Role::StateView { .. }
                    | Role::ShapeOnly
                    | Role::HostValue
            );
        let mut stats = RunStats::default();
        if poison_now {
            if let (Some((buf, off)), Some(src)) = (self.state.slot_buffer(k), &self.nan_source) {
                let cap = self.state.capacity(k).min(buf.size_bytes() - off);
                if cap > 0 && src.size_bytes() >= cap {
                    frame.copy(src, 0, buf, off, cap);
                    stats.poison_fills += 1;
                }
            }
        }
        match c.role {
            Role::Input { .. }
            | Role::Constant
            | Role::ShapeOnly
            | Role::StateView { .. }
            | Role::KvRows => {}
            // Rows a fused projection wrote (its encode moved the state first).
            Role::StateScatter { state } | Role::StateConcat { state }
                if inner.compiled.states[state].written_by.is_some() => {}
            Role::HostValue => {
                if let Some(bytes) = self.state.take_upload(k) {
                    // HostValue nodes own their buffer (never pooled), so this write cannot
                    // land in a buffer that another command of this submit still reads.
                    if let Some((buf, off)) = self.state.slot_buffer(k) {
                        frame.write_before_submit(buf, off, pad4(&bytes));
                    }
                }
            }
            Role::StateScatter { state } => {
                let target = self.state.states[state]
                    .current()
                    .ok_or_else(|| kernel_err("state has no buffer".into()))?;
                // An in-place state appends nothing: its kernel writes the rows.
                self.encode_state_move(state, target, frame, &mut stats);
                let out = tensor_of(&self.state, inner, c.id)
                    .ok_or_else(|| kernel_err("output has no buffer".into()))?;
                let [_, rows, slots] = node.inputs[..] else {
                    return Err(kernel_err(
                        "a state scatter takes the pool, the rows and the slots".into(),
                    ));
                };
                let operand = |i: NodeId| {
                    tensor_of(&self.state, inner, i)
                        .ok_or_else(|| kernel_err(format!("input {i} has no buffer")))
                };
                // Input 0 is the pool as it is after this iteration's growth: the output.
                let ins = [out, operand(rows)?, operand(slots)?];
                let planned = frame
                    .encode_planned(&node.op, &ins, &out, &mut self.plans[k])
                    .map_err(encode_err)?;
                stats.dispatches += planned.dispatches as u64;
                if planned.replayed {
                    stats.dispatches_replayed += planned.dispatches as u64;
                }
            }
            Role::StateConcat { state } => {
                let st = &self.state.states[state];
                let target = st
                    .current()
                    .ok_or_else(|| kernel_err("state has no buffer".into()))?;
                let append = self.encode_state_move(state, target, frame, &mut stats);
                if node.inputs.len() != 2 {
                    return Err(kernel_err(
                        "a state concat takes exactly the past and the new rows".into(),
                    ));
                }
                let src = tensor_of(&self.state, inner, node.inputs[1])
                    .ok_or_else(|| kernel_err("new rows have no buffer".into()))?;
                if src.is_strided() {
                    return Err(kernel_err(
                        "the new rows of a state must be contiguous".into(),
                    ));
                }
                // Only the new rows are written (in-place concatenation).
                for (from, to, size) in append {
                    frame.copy(
                        src.tensor.buffer,
                        src.tensor.offset_bytes + from,
                        target,
                        to,
                        size,
                    );
                    stats.copies += 1;
                    stats.copy_bytes += size;
                }
            }
            Role::Copy => {
                let src = tensor_of(&self.state, inner, node.inputs[0])
                    .ok_or_else(|| kernel_err("input has no buffer".into()))?;
                let out = tensor_of(&self.state, inner, c.id)
                    .ok_or_else(|| kernel_err("output has no buffer".into()))?;
                let bytes = padded_bytes(out.shape, c.dtype)?;
                if bytes > 0 {
                    if src.tensor.buffer.uid() == out.tensor.buffer.uid() {
                        // WebGPU forbids a buffer copy within one buffer (arena neighbours):
                        // the copy kernel does it instead.
                        let op = Op::Reshape(ops::Reshape {
                            target: out.shape.dims().iter().map(|&d| d as i64).collect(),
                        });
                        let n = frame.encode(&op, &[src], &out).map_err(encode_err)?;
                        stats.dispatches += n as u64;
                    } else {
                        frame.copy(
                            src.tensor.buffer,
                            src.tensor.offset_bytes,
                            out.tensor.buffer,
                            out.tensor.offset_bytes,
                            bytes,
                        );
                        stats.copies += 1;
                        stats.copy_bytes += bytes;
                    }
                }
            }
            Role::ConcatCopy => {
                let ins: Vec<Operand<'_>> = node
                    .inputs
                    .iter()
                    .map(|&i| {
                        tensor_of(&self.state, inner, i)
                            .ok_or_else(|| kernel_err(format!("input {i} has no buffer")))
                    })
                    .collect::<Result<_, _>>()?;
                let out = tensor_of(&self.state, inner, c.id)
                    .ok_or_else(|| kernel_err("output has no buffer".into()))?;
                let aligned = ins
                    .iter()
                    .all(|t| t.shape.size_bytes(t.dtype).is_ok_and(|b| b % 4 == 0));
                let shares = ins
                    .iter()
                    .any(|t| t.tensor.buffer.uid() == out.tensor.buffer.uid());
                if !aligned || shares {
                    let n = frame.encode(&node.op, &ins, &out).map_err(encode_err)?;
                    stats.dispatches += n as u64;
                } else {
                    let mut at = out.tensor.offset_bytes;
                    for t in &ins {
                        let bytes = t.shape.size_bytes(t.dtype)?;
                        if bytes > 0 {
                            frame.copy(
                                t.tensor.buffer,
                                t.tensor.offset_bytes,
                                out.tensor.buffer,
                                at,
                                bytes,
                            );
                            stats.copies += 1;
                            stats.copy_bytes += bytes;
                        }
                        at += bytes;
                    }
                }
            }
            Role::Kernel => {
                // A projection that writes KV states: each state's move (growth, an uploaded
                // past) before the kernel writes its rows.
                let kv_shapes: Vec<crate::shape::Shape> = c
                    .kv_states
                    .iter()
                    .flatten()
                    .map(|&st| self.state.kv_rows_shape(st))
                    .collect();
                let mut kv_rows: Vec<Operand<'_>> = Vec::new();
                for (i, &st) in c.kv_states.iter().flatten().enumerate() {
                    let target = self.state.states[st]
                        .current()
                        .ok_or_else(|| kernel_err("state has no buffer".into()))?;
                    let append = self.encode_state_move(st, target, frame, &mut stats);
                    let present = inner.compiled.states[st].present;
                    let mut rows = tensor_of(&self.state, inner, present)
                        .ok_or_else(|| kernel_err("a KV state has no buffer".into()))?;
                    if !inner.compiled.states[st].in_place {
                        // Appended rows: the kernel writes the step's rows in their place.
                        let [(_, to, size)] = append[..] else {
                            return Err(kernel_err(format!(
                                "KV state {i} appends {} ranges (one expected)",
                                append.len()
                            )));
                        };
                        rows.tensor.offset_bytes = to;
                        rows.tensor.size_bytes = size;
                        rows.shape = &kv_shapes[i];
                    }
                    kv_rows.push(rows);
                }
                let graph = &inner.compiled.graph;
                // update_impl picks the implementation for these shapes; the weight it reads
                // comes from update_weights in the layout that implementation reads best
                // (crate::runtime::weights), reordered into the frame on a miss. The three
                // weights of a KV split are bound as one range, so they are read where they
                // lie, in their resident layout (a copy of one would leave the others).
                let reordered = match (&node.op, node.inputs.get(1)) {
                    (Op::Linear(_), Some(&w))
                    | (Op::FusedLinear(ops::FusedLinear { kv: None, .. }), Some(&w)) => {
                        let m =
                            crate::gpu::kernels::layout::rows(self.state.shape(node.inputs[0])).0;
                        let dtype = graph.node(w).dtype;
                        let want = frame.kernels().quant_layout().weight_layout(m, dtype);
                        inner.data.weight(w, dtype, want, frame)?.map(|r| (w, r))
                    }
                    _ => None,
                };
                let out = tensor_of(&self.state, inner, c.id)
                    .ok_or_else(|| kernel_err("output has no buffer".into()))?;
                let def = node.op.def();
                // An input the kernel never reads (shape data computed on the host, such as an
                // expand's target) may have no buffer: it gets a placeholder that names the
                // output's range with the input's shape and type, which the kernel never binds.
                let input = |pos: usize, i: NodeId| match tensor_of(&self.state, inner, i) {
                    Some(o) => Ok(match &reordered {
                        Some((w, r)) if pos == 1 && i == *w => Operand {
                            tensor: crate::gpu::kernels::TensorRef {
                                buffer: &r.buffer,
                                offset_bytes: r.offset_bytes,
                                size_bytes: r.size_bytes,
                            },
                            layout: r.layout,
                            ..o
                        },
                        _ => o,
                    }),
                    None if !def.reads_input(pos) => Ok(Operand {
                        tensor: out.tensor,
                        shape: self.state.shape(i),
                        dtype: graph.node(i).dtype,
                        strides: None,
                        layout: crate::gpu::kernels::WeightLayout::File,
                    }),
                    None => Err(kernel_err(format!("input {i} has no buffer"))),
                };
                // Up to 4 operands on the stack (every dispatch of every iteration passes
                // here); a wider node collects into a Vec.
                let mut few: [Option<Operand<'_>>; 4] = [None; 4];
                let many: Vec<Operand<'_>>;
                let gathered: [Operand<'_>; 4];
                let ins: &[Operand<'_>] = match node.inputs.as_slice() {
                    [first, rest @ ..] if rest.len() < few.len() && kv_rows.is_empty() => {
                        let first = input(0, *first)?;
                        few[0] = Some(first);
                        for (pos, (slot, &i)) in few[1..].iter_mut().zip(rest).enumerate() {
                            *slot = Some(input(pos + 1, i)?);
                        }
                        gathered = few.map(|o| o.unwrap_or(first));
                        &gathered[..node.inputs.len()]
                    }
                    all => {
                        many = all
                            .iter()
                            .enumerate()
                            .map(|(pos, &i)| input(pos, i))
                            .chain(kv_rows.iter().map(|&o| Ok(o)))
                            .collect::<Result<_, _>>()?;
                        &many
                    }
                };
                if let (Some(record), Op::Gather(g)) = (
                    self.index_checks.as_ref().and_then(|c| c.record_of(k)),
                    &node.op,
                ) {
                    let table = ins[0].shape;
                    let axis = ops::axis_index(g.axis, table.rank())
                        .map_err(|e| kernel_err(e.to_string()))?;
                    stats.dispatches += frame
                        .check_indices(&ins[1], table.dims()[axis], &record)
                        .map_err(encode_err)? as u64;
                }
                let planned = frame
                    .encode_planned(&node.op, ins, &out, &mut self.plans[k])
                    .map_err(encode_err)?;
                stats.dispatches += planned.dispatches as u64;
                if planned.replayed {
                    stats.dispatches_replayed += planned.dispatches as u64;
                }
            }
        }
        let s = self.state.stats_mut();
        s.dispatches += stats.dispatches;
        s.dispatches_replayed += stats.dispatches_replayed;
        s.copies += stats.copies;
        s.copy_bytes += stats.copy_bytes;
        s.poison_fills += stats.poison_fills;
        s.input_bytes_written += stats.input_bytes_written;
        Ok(())
    }
}
