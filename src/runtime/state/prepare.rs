//! Phase 1 of an iteration ([`RequestState::prepare`]): the inputs checked, the symbols bound,
//! then `update_shape` and `realloc_if_needed` for every node in processing order, with the
//! host's checks of gather indices and the strides of the padded states' views.

use std::sync::Arc;

use super::{kv, RequestState};
use crate::graph::{ops, shape_data, Bindings, Dim, NodeId, Op};
use crate::memory::pool::Storage;
use crate::runtime::compile::Role;
use crate::runtime::RunError;
use crate::shape::Shape;
use crate::tensor::{encode_i64, HostTensor};

impl<S: Storage + Clone> RequestState<S> {
    /// Checks that `t` can be input `label` of the network: an input, with the node's element
    /// type and as many bytes as its shape needs. Returns the state whose past it is, if any.
    ///
    /// # Errors
    /// [`RunError::BadInput`] naming the input; [`RunError::Graph`] for a shape whose size
    /// overflows.
    pub fn check_input(&self, label: &str, t: &HostTensor) -> Result<Option<usize>, RunError> {
        let c = &self.compiled;
        let graph = &c.graph;
        let not_input = || RunError::BadInput {
            input: label.to_string(),
            reason: "not an input of the network".into(),
        };
        let id = graph.find(label).ok_or_else(not_input)?;
        let Role::Input { state } = c.node(c.pos(id)).role else {
            return Err(not_input());
        };
        let dtype = graph.node(id).dtype;
        let expect = t.shape.size_bytes(dtype)?;
        if t.dtype != dtype || t.bytes.len() as u64 != expect {
            return Err(RunError::BadInput {
                input: label.to_string(),
                reason: format!(
                    "expected {expect} bytes of {dtype} for shape {}, got {} bytes of {}",
                    t.shape,
                    t.bytes.len(),
                    t.dtype
                ),
            });
        }
        Ok(state)
    }

    /// Phase 1 of an iteration: checks the given inputs, binds the symbols, then for every
    /// node in processing order `update_shape` (skipped when no input shape changed) and
    /// `realloc_if_needed`. Marks the nodes re-inferred (their dispatch plans are stale).
    ///
    /// # Errors
    /// [`RunError::BadInput`] / [`RunError::Graph`] for inputs that do not fit the graph;
    /// [`RunError::OutOfMemory`] naming the node whose output cannot be allocated.
    pub fn prepare(&mut self, inputs: &[(&str, &HostTensor)]) -> Result<(), RunError> {
        let c = Arc::clone(&self.compiled);
        let graph = &c.graph;
        for st in &mut self.states {
            st.append_rows = 0;
            st.next_shape = st.shape.clone();
        }
        for slot in &mut self.slots {
            slot.reinferred = false;
        }
        // Check the given inputs; a state's past given by the caller replaces the rows held.
        let mut uploads: Vec<Option<&HostTensor>> = vec![None; self.states.len()];
        for &(label, t) in inputs {
            if let Some(si) = self.check_input(label, t)? {
                uploads[si] = Some(t);
            }
        }
        // Bind the symbols from the given inputs and the states' pasts: the rows held, the
        // past given, or, for an empty past, the dimensions the other inputs bind.
        let mut past_shapes = Vec::with_capacity(self.states.len());
        for (si, st) in self.states.iter().enumerate() {
            past_shapes.push(match uploads[si] {
                Some(t) => t.shape.clone(),
                None if st.rows() > 0 => st.shape.clone(),
                None => self.empty_past_shape(si, inputs)?,
            });
        }
        let mut given: Vec<(&str, &Shape)> = Vec::new();
        for &(label, t) in inputs {
            if !matches!(
                graph.find(label).map(|id| c.node(c.pos(id)).role),
                Some(Role::Input { state: Some(_) })
            ) {
                given.push((label, &t.shape));
            }
        }
        for (si, s) in c.states.iter().enumerate() {
            given.push((graph.node(s.past).label.as_str(), &past_shapes[si]));
        }
        let mut bindings: Bindings = graph.bind(&given)?;
        for (k, v) in &c.fixed {
            bindings.entry(k.clone()).or_insert(*v);
        }
        for ((st, shape), up) in self.states.iter_mut().zip(past_shapes).zip(&uploads) {
            if let Some(t) = up {
                // The given past replaces the rows, dropped ones included.
                st.upload = Some(t.bytes.clone());
                let held = std::mem::replace(&mut st.shape, shape);
                st.restore = Some(st.restore.take().unwrap_or(held));
                st.drop_front = 0;
            } else {
                st.shape = shape;
            }
            st.next_shape = st.shape.clone();
        }

        self.value_changed.iter_mut().for_each(|v| *v = false);
        for k in 0..c.nodes.len() {
            let node = &c.nodes[k];
            let id = node.id;
            let gn = graph.node(id);
            // update_shape: skip when no input shape and no input's host value changed (host
            // values are functions of shapes and of the small integer inputs). Compared in
            // place: this runs for every node of every iteration.
            let input_shape = match &gn.op {
                Op::Input(_) => Some(graph.input_shape(id, &bindings)?),
                _ => None,
            };
            // A small integer input's values are host values too (a reshape target fed as an
            // input is shape data).
            let fed = match (&gn.op, self.feeds_shape[id.index()]) {
                (Op::Input(_), true) => inputs
                    .iter()
                    .find(|(l, _)| *l == gn.label)
                    .and_then(|(_, t)| shape_data::decode_constant(gn.dtype, &t.bytes)),
                _ => None,
            };
            if matches!(gn.op, Op::Input(_)) && fed != self.values[id.index()] {
                self.value_changed[id.index()] = true;
            }
            let values_changed = self.value_changed[id.index()]
                || gn.inputs.iter().any(|i| self.value_changed[i.index()]);
            // A state's in-place append is sized every iteration: the rows it appends after
            // depend on what the state holds, which changes without its inputs' shapes doing
            // so (a cache moved in from a sibling request, rows dropped or rolled back).
            let changed = values_changed
                || matches!(node.role, Role::StateConcat { .. })
                || match (&self.slots[k].in_shapes, &input_shape) {
                    (None, _) => true,
                    (Some(prev), Some(s)) => prev.len() != 1 || &prev[0] != s,
                    (Some(prev), None) => {
                        prev.len() != gn.inputs.len()
                            || gn
                                .inputs
                                .iter()
                                .zip(prev)
                                .any(|(i, p)| &self.shapes[i.index()] != p)
                    }
                };
            if let Op::Gather(g) = &gn.op {
                self.check_gather_indices(id, g, inputs, changed)?;
            }
            if !changed {
                self.stats.shape_updates_skipped += 1;
                if node.role == Role::HostValue && self.options.poison {
                    self.queue_host_value(k, id);
                }
                continue;
            }
            let in_shapes: Vec<Shape> = match input_shape {
                Some(s) => vec![s],
                None => gn
                    .inputs
                    .iter()
                    .map(|i| self.shapes[i.index()].clone())
                    .collect(),
            };
            self.stats.shape_updates += 1;
            let (shape, value) = graph.infer_node(id, &bindings, &self.shapes, &self.values)?;
            let value = fed.or(value);
            if value != self.values[id.index()] {
                self.value_changed[id.index()] = true;
            }
            // update_impl happens when the dispatch is recorded (module docs).
            match node.role {
                Role::Constant
                | Role::ShapeOnly
                | Role::KvRows
                | Role::Input { state: Some(_) }
                | Role::StateView { .. } => {}
                Role::StateConcat { state } | Role::StateScatter { state } => {
                    self.realloc_state(k, state, &shape)?
                }
                Role::Input { state: None }
                | Role::Copy
                | Role::ConcatCopy
                | Role::Kernel
                | Role::HostValue => self.realloc_if_needed(k, &shape)?,
            }
            self.shapes[id.index()] = shape;
            self.values[id.index()] = value;
            let slot = &mut self.slots[k];
            slot.in_shapes = Some(in_shapes);
            slot.reinferred = true;
            if node.role == Role::HostValue {
                self.queue_host_value(k, id);
            }
        }
        self.update_strides();
        Ok(())
    }

    /// Checks the indices of gather `id` that the host holds but the shape rule does not see:
    /// a fed input's (at every iteration: its values change without its shape) and a
    /// constant's too large to be a host value (when the node is inferred again, `changed`:
    /// only the gathered axis can have moved). Indices with host values are the shape rule's
    /// ([`ops::Gather`]); those a kernel computes are checked on the device.
    ///
    /// # Errors
    /// [`RunError::IndexOutOfRange`] naming the node, the index and the axis' extent.
    fn check_gather_indices(
        &self,
        id: NodeId,
        g: &ops::Gather,
        inputs: &[(&str, &HostTensor)],
        changed: bool,
    ) -> Result<(), RunError> {
        let c = &self.compiled;
        let gn = c.graph.node(id);
        let [table, ids] = gn.inputs[..] else {
            return Ok(());
        };
        if self.values[ids.index()].is_some() {
            return Ok(());
        }
        let idn = c.graph.node(ids);
        let values = match (&idn.op, c.node(c.pos(ids)).role) {
            (Op::Input(_), Role::Input { state: None }) => inputs
                .iter()
                .find(|(l, _)| *l == idn.label)
                .and_then(|(_, t)| crate::tensor::decode_i64(t.dtype, &t.bytes).ok()),
            (Op::Constant(k), _) if changed => {
                crate::tensor::decode_i64(k.dtype, k.data.bytes()).ok()
            }
            _ => None,
        };
        let Some(values) = values else {
            return Ok(());
        };
        let shape = &self.shapes[table.index()];
        let Ok(axis) = ops::axis_index(g.axis, shape.rank()) else {
            return Ok(());
        };
        let bound = shape.dims()[axis];
        match ops::movement::first_out_of_range(&values, bound) {
            Some((position, index)) => Err(RunError::IndexOutOfRange {
                node: gn.label.clone(),
                op: gn.op.name(),
                position,
                index,
                bound,
            }),
            None => Ok(()),
        }
    }

    /// The shape of state `si`'s empty past for this iteration: no rows, the other
    /// dimensions fixed, fixed at compile time or bound by the inputs given.
    fn empty_past_shape(
        &self,
        si: usize,
        inputs: &[(&str, &HostTensor)],
    ) -> Result<Shape, RunError> {
        let c = &self.compiled;
        let graph = &c.graph;
        let axis = self.states[si].axis;
        let past = graph.node(c.states[si].past);
        let Op::Input(ops::Input { dims, .. }) = &past.op else {
            return Ok(self.states[si].shape.clone());
        };
        let bound_by_inputs = |sym: &str| {
            inputs.iter().find_map(|&(label, t)| {
                let node = graph.node(graph.find(label)?);
                let Op::Input(ops::Input { dims, .. }) = &node.op else {
                    return None;
                };
                let at = dims
                    .iter()
                    .position(|d| matches!(d, Dim::Sym(s) if s == sym))?;
                t.shape.dims().get(at).copied()
            })
        };
        let mut shape = Vec::with_capacity(dims.len());
        // An in-place state (a pool) holds all its rows from the start.
        let empty_axis = !c.states[si].in_place;
        for (a, d) in dims.iter().enumerate() {
            shape.push(match d {
                _ if a == axis && empty_axis => 0,
                Dim::Fixed(v) => *v,
                Dim::Sym(sym) => match c.fixed(sym).or_else(|| bound_by_inputs(sym)) {
                    Some(v) => v,
                    None => {
                        return Err(RunError::BadState {
                            past: past.label.clone(),
                            present: graph.node(c.states[si].present).label.clone(),
                            reason: format!(
                                "dimension `{sym}` of the empty past is bound by no input given"
                            ),
                        })
                    }
                },
            });
        }
        Ok(Shape(shape))
    }

    /// Strides of the outputs that are strided views of padded state buffers (pasts,
    /// presents, views), for this iteration's shapes and buffers.
    fn update_strides(&mut self) {
        let c = Arc::clone(&self.compiled);
        for (k, node) in c.nodes.iter().enumerate() {
            let strides = match node.role {
                Role::Input { state: Some(s) } | Role::StateConcat { state: s }
                    if c.states[s].padded() =>
                {
                    let st = &self.states[s];
                    let is_past = matches!(node.role, Role::Input { .. }) && st.upload.is_none();
                    let buf = if is_past {
                        st.buffer.as_ref()
                    } else {
                        st.current()
                    };
                    buf.map(|b| st.strides(&self.shapes[node.id.index()], S::size_bytes(b)))
                }
                Role::StateView { .. } => {
                    let gn = c.graph.node(node.id);
                    let from = gn.inputs.first().map(|i| c.pos(*i).index());
                    from.and_then(|i| self.slots[i].strides.as_deref())
                        .and_then(|st| kv::view_strides(&gn.op, st))
                }
                _ => continue,
            };
            self.slots[k].strides = strides;
        }
    }

    fn queue_host_value(&mut self, k: usize, id: NodeId) {
        let dtype = self.compiled.nodes[k].dtype;
        if let Some(v) = &self.values[id.index()] {
            self.slots[k].upload = encode_i64(dtype, v).ok();
        }
    }
}
