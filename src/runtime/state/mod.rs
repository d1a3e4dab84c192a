//! The device-free half of a request: shapes, sizing decisions and KV-cache bookkeeping.
//!
//! A [`RequestState`] runs `update_shape` and `realloc_if_needed` for every node of an iteration
//! (steps 1 and 3 of an iteration, docs/design.md) and keeps the KV-cache states (rows held,
//! bytes valid, growth),
//! over any [`Storage`]: the GPU executor ([`super::InferRequest`]) runs it on the engine's
//! buffers, and its property tests run it on host storage. It never touches a device: it
//! decides which buffer holds each node's output and how large, and tells the executor which
//! buffers it freed (so dispatch plans and bind groups that bind them are dropped).
//!
//! Files: this one (the state, its slots, commit and abort, the views the executor binds),
//! `prepare` (phase 1: `update_shape` and `realloc_if_needed` for every node), `alloc` (where
//! each output's memory comes from), `kv` (the KV-cache states).

use super::compile::{padded_bytes, Compiled, Role};
use super::options::{RunOptions, RunStats};
use super::placeholders::{Lease, PlaceholderPool};
use super::RunError;
use crate::graph::{ops, Dim, NodeId, Op};
use crate::memory::pool::{MemoryPool, PoolView, Storage};
use crate::memory::predictor::Sizer;
use crate::memory::AllocKind;
use crate::shape::{DType, Shape};
use crate::tensor::HostTensor;
use std::sync::{Arc, Mutex, MutexGuard};

mod alloc;
mod kv;
mod prepare;
#[cfg(test)]
mod tests;

pub(crate) use kv::{compact, CopyRange, MovedState, StateSlot};

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
    /// The one sizing path (`dynrt-bench predict` replays the same code).
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
                drop_front: 0,
            });
        }
        for node in &c.nodes {
            let mem = match node.role {
                Role::Constant => Mem::Constant,
                Role::Input { state: Some(st) }
                | Role::StateConcat { state: st }
                | Role::StateScatter { state: st }
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
            st.drop_front = 0;
            st.shape = st.next_shape.clone();
        }
    }

    /// Phase 1 alone: [`RequestState::prepare`] for `inputs`, then [`RequestState::abort`]. The
    /// outputs' buffers stay allocated for those shapes (the pool packs them as for an
    /// iteration), nothing counts as an iteration, and the next iteration infers every node
    /// again: a smaller one then runs on the buffers held.
    ///
    /// # Errors
    /// As [`RequestState::prepare`]; the state is as after [`RequestState::abort`] then.
    pub fn reserve(&mut self, inputs: &[(&str, &HostTensor)]) -> Result<(), RunError> {
        let prepared = self.prepare(inputs);
        self.abort();
        prepared
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
            st.drop_front = 0;
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

    /// Releases the buffer of every node output (the states' buffers, the constants and the
    /// static arena stay) and makes the next iteration infer every node again: after an
    /// iteration failed for lack of memory, the next one allocates for its own shapes only,
    /// not beside the buffers sized for the one that failed.
    pub fn release_outputs(&mut self) {
        for k in 0..self.slots.len() {
            self.release_slot(k);
            let slot = &mut self.slots[k];
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
