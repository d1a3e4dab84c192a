//! The device-free half of a request: shapes, sizing decisions and KV-cache bookkeeping.
//!
//! A [`RequestState`] runs `update_shape` and `realloc_if_needed` for every node of an iteration
//! (steps 1 and 3 of an iteration, docs/design.md) and keeps the KV-cache states (rows held,
//! bytes valid, growth),
//! over any [`Storage`]: the GPU executor ([`super::InferRequest`]) runs it on the engine's
//! buffers, and its property tests run it on host storage. It never touches a device: it
//! decides which buffer holds each node's output and how large, and tells the executor which
//! buffers it freed (so dispatch plans and bind groups that bind them are dropped).

use super::compile::{padded_bytes, Compiled, Role};
use super::options::{RunOptions, RunStats};
use super::placeholders::{Lease, PlaceholderPool};
use super::RunError;
use crate::graph::{ops, shape_data, Bindings, Dim, NodeId, Op, Position};
use crate::memory::pool::{MemoryPool, PoolRequest, PoolView, Storage};
use crate::memory::predictor::{MemoryLimits, Sizer};
use crate::memory::AllocKind;
use crate::shape::{DType, Shape};
use crate::tensor::{encode_i64, HostTensor};
use std::sync::{Arc, Mutex, MutexGuard};

mod kv;
#[cfg(test)]
mod tests;

pub(crate) use kv::{compact, MovedState, StateSlot};

/// A network family's placeholder pool, shared by its requests.
pub(crate) type SharedPlaceholders<B> = Arc<Mutex<PlaceholderPool<B>>>;

/// Where a node's output lives.
pub(crate) enum Mem<B> {
    None,
    Pool(PoolView),
    /// A placeholder slot (network inputs and outputs).
    Placeholder(Lease<B>),
    Own(B),
    Arena(u64),
    /// The state buffer (past inputs and in-place concats).
    State(usize),
    Constant,
}

pub(crate) struct Slot<B> {
    /// Input shapes seen by the last `update_shape` (`None` before the first).
    in_shapes: Option<Vec<Shape>>,
    pub mem: Mem<B>,
    pub capacity_bytes: u64,
    /// Fill with NaN before the node writes (poison mode).
    poison: bool,
    /// Host value to upload this iteration ([`Role::HostValue`]).
    upload: Option<Vec<u8>>,
    /// update_shape ran for the node this iteration (its dispatch plan is stale).
    pub reinferred: bool,
    /// Element strides of the output when it is a strided view of a padded state buffer
    /// (a state's past and present, a [`Role::StateView`]); `None`: contiguous.
    strides: Option<Vec<u64>>,
}

/// The placeholder pool (a poisoned lock only means a panic elsewhere; the pool's state is
/// consistent between statements).
fn lock<B>(p: &SharedPlaceholders<B>) -> MutexGuard<'_, PlaceholderPool<B>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S: Storage> Drop for RequestState<S> {
    /// Gives the placeholder slots back to the network's pool for its next requests.
    fn drop(&mut self) {
        let mut pool = lock(&self.placeholders);
        for slot in &mut self.slots {
            if let Mem::Placeholder(lease) = std::mem::replace(&mut slot.mem, Mem::None) {
                self.freed.extend(pool.release(&self.io_storage, lease));
            }
        }
    }
}

/// What one try of [`RequestState::obtain`] got: the memory, its capacity, and the bytes of a
/// fresh allocation (none when a pool record was reused).
type Attempt<B> = Result<(Mem<B>, u64, Option<u64>), String>;

/// A node's output as the executor binds it: a range of a storage buffer, its shape and type.
pub(crate) struct View<'a, B> {
    pub buffer: &'a B,
    pub offset_bytes: u64,
    pub size_bytes: u64,
    pub shape: &'a Shape,
    pub dtype: DType,
    /// Element strides of a strided view (a padded state's tensors); `None`: contiguous.
    pub strides: Option<&'a [u64]>,
}

/// The device-free state of one stream of inferences (see the module docs).
pub(crate) struct RequestState<S: Storage> {
    pub compiled: Arc<Compiled>,
    options: RunOptions,
    /// The one sizing path (`dynrt predict` replays the same code).
    sizer: Sizer,
    /// Allocations of the internal region (activations, the arena, host values).
    storage: S,
    /// Allocations of the placeholders region (placeholder buffers, KV-cache in-outs).
    io_storage: S,
    /// The network family's placeholder pool and this request's inference in it.
    placeholders: SharedPlaceholders<S::Buffer>,
    inference: u32,
    pool: MemoryPool<S>,
    arena: Option<S::Buffer>,
    slots: Vec<Slot<S::Buffer>>,
    pub states: Vec<StateSlot<S::Buffer>>,
    /// Output shape per node id (valid for nodes updated at least once).
    shapes: Vec<Shape>,
    /// Host values per node id (shape data; small integer inputs included, so a shape rule
    /// can read a target fed as an input).
    values: Vec<Option<Vec<i64>>>,
    /// Per node id: whether its host value changed in the current iteration (a node whose
    /// input values changed is inferred again even when no input shape did).
    value_changed: Vec<bool>,
    /// Per node id: whether its values reach a shape rule (through host-evaluable integer
    /// nodes); only such inputs' values are read on the host.
    feeds_shape: Vec<bool>,
    stats: RunStats,
    /// Whether the current iteration is the first (allocations then are not reallocations).
    first_iteration: bool,
    /// Ids of buffers freed since the executor last asked ([`RequestState::take_freed`]).
    freed: Vec<u64>,
}

/// Per node id: whether the node's values reach a shape rule ([`ops::OpDef::shape_data_inputs`])
/// directly or through host-evaluable integer nodes.
fn feeds_shape(graph: &crate::graph::Graph) -> Vec<bool> {
    let mut feeds = vec![false; graph.len()];
    for &id in graph.order().iter().rev() {
        let node = graph.node(id);
        let def = node.op.def();
        let passes = feeds[id.index()] && node.dtype.is_int() && def.host_evaluable();
        for (pos, &i) in node.inputs.iter().enumerate() {
            if passes || def.shape_data_inputs().contains(&pos) {
                feeds[i.index()] = true;
            }
        }
    }
    feeds
}

impl<S: Storage + Clone> RequestState<S> {
    /// A request state on `compiled` allocating from `storage`: the static arena (planner on) or the
    /// static outputs from the pool in descending order of size (planner off).
    ///
    /// # Errors
    /// [`RunError::BadState`] for a state whose rows are not fixed; allocation failures.
    pub fn new(
        compiled: Arc<Compiled>,
        options: RunOptions,
        storage: S,
        io_storage: S,
        placeholders: SharedPlaceholders<S::Buffer>,
    ) -> Result<RequestState<S>, RunError> {
        let n = compiled.graph.len();
        let inference = lock(&placeholders).begin_inference();
        let mut s = RequestState {
            options,
            sizer: Self::fresh_sizer(&options),
            pool: MemoryPool::new(storage.clone()),
            storage,
            io_storage,
            placeholders,
            inference,
            arena: None,
            slots: Vec::with_capacity(n),
            states: Vec::new(),
            shapes: vec![Shape::default(); n],
            values: vec![None; n],
            value_changed: vec![false; n],
            feeds_shape: feeds_shape(&compiled.graph),
            stats: RunStats::default(),
            first_iteration: true,
            freed: Vec::new(),
            compiled,
        };
        let c = Arc::clone(&s.compiled);
        for st in &c.states {
            let Op::Input(ops::Input { dims, .. }) = &c.graph.node(st.past).op else {
                continue;
            };
            // The past starts empty; dimensions other than the growing axis that are not
            // fixed are bound by the first iteration's inputs.
            let shape = Shape(
                dims.iter()
                    .enumerate()
                    .map(|(a, d)| match d {
                        Dim::Fixed(v) if a != st.axis => *v,
                        Dim::Sym(sym) if a != st.axis => c.fixed(sym).unwrap_or(0),
                        _ => 0,
                    })
                    .collect(),
            );
            s.states.push(StateSlot {
                buffer: None,
                shape: shape.clone(),
                axis: st.axis,
                dtype: c.graph.node(st.past).dtype,
                grown: None,
                append_rows: 0,
                next_shape: shape,
                upload: None,
                restore: None,
            });
        }
        for node in &c.nodes {
            let mem = match node.role {
                Role::Constant => Mem::Constant,
                Role::Input { state: Some(st) }
                | Role::StateConcat { state: st }
                | Role::StateView { state: st } => Mem::State(st),
                _ => match node.arena_offset {
                    Some(off) => Mem::Arena(off),
                    None => Mem::None,
                },
            };
            let capacity_bytes = match (&mem, &node.static_shape) {
                (Mem::Arena(_), Some(shape)) => padded_bytes(shape, node.dtype)?,
                _ => 0,
            };
            s.slots.push(Slot {
                in_shapes: None,
                poison: matches!(mem, Mem::Arena(_)),
                mem,
                capacity_bytes,
                upload: None,
                reinferred: false,
                strides: None,
            });
        }
        if c.arena_bytes > 0 {
            let arena = s
                .storage
                .allocate(c.arena_bytes, AllocKind::UsmDevice, "dynrt static arena")
                .map_err(|e| RunError::OutOfMemory {
                    node: "static arena".into(),
                    requested_bytes: c.arena_bytes,
                    reason: e.to_string(),
                })?;
            s.count_allocation(S::size_bytes(&arena));
            s.arena = Some(arena);
        }
        // Static outputs not in the arena: allocated now, largest first (the reference
        // creates primitive_insts in descending output size for better reuse).
        let mut statics: Vec<(u64, usize)> = Vec::new();
        for (k, node) in c.nodes.iter().enumerate() {
            let allocatable = matches!(node.role, Role::Kernel | Role::Copy | Role::ConcatCopy);
            if let (true, None, Some(shape)) = (allocatable, node.arena_offset, &node.static_shape)
            {
                statics.push((padded_bytes(shape, node.dtype)?, k));
            }
        }
        statics.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (size, k) in statics {
            let kind = s.kind_of(k);
            s.obtain(k, size.max(4), size.max(4), kind, false)?;
        }
        Ok(s)
    }

    /// The request's options.
    pub fn options(&self) -> RunOptions {
        self.options
    }

    fn fresh_sizer(options: &RunOptions) -> Sizer {
        let mut sizer = Sizer::new(options.policy, options.predictor);
        if options.trace {
            sizer.record_trace();
        }
        sizer
    }

    /// The sizer: its decisions' summary and, when recording, their trace.
    pub fn sizer(&self) -> &Sizer {
        &self.sizer
    }

    /// What the sizer may assume about memory: the storage's limits, with what this
    /// the state's own sized buffers hold counted once (the ledger adds its own).
    fn limits(&self) -> MemoryLimits {
        let l = self.storage.limits();
        MemoryLimits {
            max_buffer_bytes: l.max_buffer_bytes,
            budget_bytes: l.budget_bytes,
            other_in_use_bytes: l
                .in_use_bytes
                .saturating_sub(self.sizer.ledger().total_reserved_bytes()),
        }
    }

    /// Counters since creation.
    pub fn stats(&self) -> RunStats {
        self.stats
    }

    /// The counters, for the executor's own (dispatches, copies, submits).
    pub fn stats_mut(&mut self) -> &mut RunStats {
        &mut self.stats
    }

    /// Ids ([`Storage::id`]) of the buffers freed since the last call.
    pub fn take_freed(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.freed)
    }

    fn count_allocation(&mut self, size_bytes: u64) {
        self.stats.allocations += 1;
        self.stats.bytes_allocated_total += size_bytes;
        if !self.first_iteration {
            self.stats.reallocations += 1;
        }
    }

    /// Network inputs and outputs are host-reachable (`io_kind`); the rest is `usm_device`.
    fn kind_of(&self, k: usize) -> AllocKind {
        let node = &self.compiled.nodes[k];
        if node.is_output || matches!(node.role, Role::Input { state: None }) {
            self.compiled.io_kind
        } else {
            AllocKind::UsmDevice
        }
    }

    /// Gives node `k` a buffer of `size_bytes` (at least `needed_bytes`): from the pool or the
    /// storage. A preallocation that fails falls back to `needed_bytes`; when that fails too,
    /// the node is left without memory and the error names it.
    fn obtain(
        &mut self,
        k: usize,
        size_bytes: u64,
        needed_bytes: u64,
        kind: AllocKind,
        dynamic: bool,
    ) -> Result<(), RunError> {
        let c = Arc::clone(&self.compiled);
        let node = &c.nodes[k];
        let label = &c.graph.node(node.id).label;
        // The old buffer is dead (this node recomputes its output), so it is released first:
        // the pool may then hand its record to someone else, and peak memory stays lower.
        self.release_slot(k);
        // Network inputs and outputs are placeholders: slots of the network's placeholder
        // pool, never shared with another node of the same inference. Host values are written
        // by the host before the submit (their writes land before every command of it), so
        // they must never share memory with a node that runs earlier in the same submit: they
        // own their buffers.
        let io = node.is_output || matches!(node.role, Role::Input { .. });
        let pooled = self.options.pool && !io && node.role != Role::HostValue;
        let placeholders = Arc::clone(&self.placeholders);
        let inference = self.inference;
        let mut attempt = |size: u64| -> Attempt<S::Buffer> {
            if io {
                let lease = lock(&placeholders).acquire(
                    &mut self.io_storage,
                    c.network_id,
                    inference,
                    size,
                    kind,
                    label,
                )?;
                let cap = lease.size_bytes;
                // A slot taken from the pool's free copies is no new allocation.
                Ok((Mem::Placeholder(lease), cap, Some(cap)))
            } else if pooled {
                let req = PoolRequest {
                    size_bytes: size,
                    kind,
                    network: c.network_id,
                    requester: Position(k as u32),
                    restrictions: &node.restrictions,
                    dynamic,
                };
                let view = self.pool.acquire(&req).map_err(|e| match e {
                    crate::memory::pool::PoolError::Allocate { source, .. } => source.to_string(),
                    other => other.to_string(),
                })?;
                let rec = self
                    .pool
                    .buffer(&view)
                    .map(|b| S::size_bytes(b))
                    .unwrap_or(size);
                let fresh = (!view.reused).then_some(rec);
                Ok((Mem::Pool(view), rec, fresh))
            } else {
                let buf = self
                    .storage
                    .allocate(size, kind, label)
                    .map_err(|e| e.to_string())?;
                let s = S::size_bytes(&buf);
                Ok((Mem::Own(buf), s, Some(s)))
            }
        };
        let result = match attempt(size_bytes) {
            Ok(r) => {
                if size_bytes > needed_bytes {
                    self.stats.preallocations += 1;
                }
                Ok(r)
            }
            Err(_) if size_bytes > needed_bytes => {
                self.stats.preallocation_fallbacks += 1;
                attempt(needed_bytes)
            }
            Err(e) => Err(e),
        };
        match result {
            Ok((mem, capacity, fresh)) => {
                if let Some(bytes) = fresh {
                    self.count_allocation(bytes);
                }
                let slot = &mut self.slots[k];
                slot.mem = mem;
                slot.capacity_bytes = capacity;
                slot.poison = true;
                Ok(())
            }
            Err(reason) => Err(RunError::OutOfMemory {
                node: label.clone(),
                requested_bytes: needed_bytes,
                reason,
            }),
        }
    }

    fn release_slot(&mut self, k: usize) {
        let slot = &mut self.slots[k];
        match std::mem::replace(&mut slot.mem, Mem::None) {
            Mem::Pool(view) => {
                if let Ok(b) = self.pool.buffer(&view) {
                    self.freed.push(S::id(b));
                }
                self.pool
                    .release(self.compiled.network_id, Position(k as u32));
            }
            Mem::Own(b) => {
                self.freed.push(S::id(&b));
                drop(b);
            }
            Mem::Placeholder(lease) => {
                let freed = lock(&self.placeholders).release(&self.io_storage, lease);
                self.freed.extend(freed);
            }
            other => slot.mem = other,
        }
        if matches!(self.slots[k].mem, Mem::None) {
            self.slots[k].capacity_bytes = 0;
        }
    }

    /// `realloc_if_needed` for an ordinary node (step 3, docs/design.md): the sizer decides
    /// (reuse, predicted growth, reclaim), the storage provides.
    fn realloc_if_needed(&mut self, k: usize, shape: &Shape) -> Result<(), RunError> {
        let c = Arc::clone(&self.compiled);
        let node = &c.nodes[k];
        if node.static_shape.is_some() && !matches!(self.slots[k].mem, Mem::None) {
            return Ok(()); // allocated at creation with its final size
        }
        let label = &c.graph.node(node.id).label;
        let needed = padded_bytes(shape, node.dtype)?.max(4);
        let limits = self.limits();
        let d = self
            .sizer
            .realloc_if_needed(label, shape, node.dtype, &limits)?;
        self.count_prediction(&d, node.dtype)?;
        let slot = &self.slots[k];
        if !d.reallocated && !matches!(slot.mem, Mem::None) && slot.capacity_bytes >= needed {
            self.stats.reuses += 1;
            if self.options.poison {
                self.slots[k].poison = true;
            }
            return Ok(());
        }
        // A reallocation as decided; or no buffer yet for a shape the ledger already holds
        // room for (a size-0 output, a sequence adopted from another request): exactly.
        let size = if d.reallocated {
            self.stats.reclaims += u64::from(d.reclaimed);
            d.reserved_bytes.div_ceil(4).saturating_mul(4).max(needed)
        } else {
            needed
        };
        let kind = self.kind_of(k);
        self.obtain(k, size, needed, kind, true)?;
        if d.reallocated && self.slots[k].capacity_bytes < d.reserved_bytes {
            // The decided size could not be had: the exact size was taken.
            self.sizer
                .correct(label, shape, d.needed_bytes, self.slots[k].capacity_bytes)?;
        }
        Ok(())
    }

    /// Counts a prediction `can_preallocate` refused (the decision fell back to the need).
    fn count_prediction(
        &mut self,
        d: &crate::memory::predictor::Decision,
        dtype: DType,
    ) -> Result<(), RunError> {
        if d.reallocated
            && d.predicted
            && d.reserved_bytes == d.needed_bytes
            && d.prediction.size_bytes(dtype)? > d.needed_bytes
        {
            self.stats.preallocations_refused += 1;
        }
        Ok(())
    }

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
                st.upload = Some(t.bytes.clone());
                st.restore = Some(std::mem::replace(&mut st.shape, shape));
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
            let changed = values_changed
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
                | Role::Input { state: Some(_) }
                | Role::StateView { .. } => {}
                Role::StateConcat { state } => self.realloc_state(k, state, &shape)?,
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
        for (a, d) in dims.iter().enumerate() {
            shape.push(match d {
                _ if a == axis => 0,
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

    /// After a successful submit: the grown buffers replace the old ones (freed once the
    /// copies ran), the appended rows become the past.
    pub fn commit(&mut self) {
        self.stats.iterations += 1;
        self.first_iteration = false;
        for st in &mut self.states {
            if let Some(g) = st.grown.take() {
                if let Some(old) = st.buffer.replace(g) {
                    self.freed.push(S::id(&old));
                }
            }
            st.append_rows = 0;
            st.upload = None;
            st.restore = None;
            st.shape = st.next_shape.clone();
        }
    }

    /// After a failed iteration (nothing was submitted): forget the growths prepared for it,
    /// and make the next iteration infer every node again (some took new shapes and buffers).
    pub fn abort(&mut self) {
        for st in &mut self.states {
            if let Some(g) = st.grown.take() {
                self.freed.push(S::id(&g));
            }
            st.append_rows = 0;
            st.upload = None;
            if let Some(shape) = st.restore.take() {
                st.shape = shape;
            }
            st.next_shape = st.shape.clone();
        }
        for slot in &mut self.slots {
            slot.in_shapes = None;
            slot.upload = None;
            slot.reinferred = true;
        }
    }

    /// Whether node `k` is to be filled with NaN before it writes (poison mode), clearing the
    /// flag.
    pub fn take_poison(&mut self, k: usize) -> bool {
        std::mem::take(&mut self.slots[k].poison)
    }

    /// The host value node `k` uploads this iteration, if any.
    pub fn take_upload(&mut self, k: usize) -> Option<Vec<u8>> {
        self.slots[k].upload.take()
    }

    /// Whether update_shape ran for node `k` this iteration.
    pub fn reinferred(&self, k: usize) -> bool {
        self.slots[k].reinferred
    }

    /// Bytes node `k` may use from its offset.
    pub fn capacity(&self, k: usize) -> u64 {
        self.slots[k].capacity_bytes
    }

    /// The largest range a poison fill may need now (slots marked, grown states).
    pub fn poison_need(&self) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.poison)
            .map(|s| s.capacity_bytes)
            .chain(
                self.states
                    .iter()
                    .filter_map(|s| s.grown.as_ref().map(|b| S::size_bytes(b))),
            )
            .max()
            .unwrap_or(0)
    }

    /// The buffer and offset node `k`'s output lives at (constants are the network's: the
    /// executor resolves them).
    pub fn slot_buffer(&self, k: usize) -> Option<(&S::Buffer, u64)> {
        match &self.slots[k].mem {
            Mem::None | Mem::Constant => None,
            Mem::Pool(v) => self.pool.buffer(v).ok().map(|b| (b, v.offset_bytes)),
            Mem::Own(b) => Some((b, 0)),
            Mem::Placeholder(l) => Some((&*l.buffer, l.offset_bytes)),
            Mem::Arena(off) => self.arena.as_ref().map(|a| (a, *off)),
            Mem::State(s) => self.states[*s].current().map(|b| (b, 0)),
        }
    }

    /// Whether node `k`'s output is a constant of the network.
    pub fn is_constant(&self, k: usize) -> bool {
        matches!(self.slots[k].mem, Mem::Constant)
    }

    /// The shape of node `id`'s output this iteration.
    pub fn shape(&self, id: NodeId) -> &Shape {
        &self.shapes[id.index()]
    }

    /// Node `id`'s output as a kernel or a copy reads or writes it (constants: `None`).
    pub fn view(&self, id: NodeId) -> Option<View<'_, S::Buffer>> {
        let c = &self.compiled;
        let k = c.pos(id).index();
        // A state's past is read from the buffer that holds it now; the append of this
        // iteration goes to the same (or the grown) buffer after it.
        let (buffer, offset_bytes) = match (&self.slots[k].mem, c.nodes[k].role) {
            (Mem::State(s), Role::Input { .. }) => (self.states[*s].past_buffer()?, 0),
            _ => self.slot_buffer(k)?,
        };
        let available = S::size_bytes(buffer).saturating_sub(offset_bytes);
        let size_bytes = match self.slots[k].mem {
            Mem::Arena(_) | Mem::Pool(_) | Mem::Placeholder(_) => {
                self.slots[k].capacity_bytes.min(available)
            }
            _ => available,
        };
        Some(View {
            buffer,
            offset_bytes,
            size_bytes,
            shape: &self.shapes[id.index()],
            dtype: c.nodes[k].dtype,
            strides: self.slots[k].strides.as_deref(),
        })
    }
}
