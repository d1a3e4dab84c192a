//! One inference request: its predictor, pool, buffers and states, and the per-iteration loop
//! (`update_shape`, `update_impl`, `realloc_if_needed`, `dispatch`). See [`crate::runtime`].

use super::network::{padded_bytes, Inner, Network, Role};
use super::RunError;
use crate::gpu::kernels::{Operand, RecordedDispatch, Recorder, TensorRef, UniformArena};
use crate::gpu::pool_storage::EngineStorage;
use crate::gpu::{wgpu, AllocError, Buffer, BufferDesc, Engine};
use crate::graph::{Bindings, NodeId, Op};
use crate::memory::pool::{MemoryPool, PoolRequest, PoolView};
use crate::memory::predictor::{Policy, PredictorOptions, ShapePredictor};
use crate::memory::AllocKind;
use crate::shape::{DType, Shape};
use std::sync::Arc;

/// How a request manages memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunOptions {
    /// Preallocation policy of the request's shape predictor.
    pub policy: Policy,
    /// Predictor options (`DYNRT_MEM_PREALLOCATION_OPTIONS`).
    pub predictor: PredictorOptions,
    /// Share buffers between nodes without memory dependencies through the memory pool. Off:
    /// every node owns its buffer.
    pub pool: bool,
    /// Fill every buffer handed out for reuse or preallocation with NaN before use
    /// (`DYNRT_POISON=1`).
    pub poison: bool,
}

impl RunOptions {
    /// `policy` with the reference predictor options, the pool on and poison off.
    pub fn new(policy: Policy) -> Self {
        RunOptions {
            policy,
            predictor: PredictorOptions::reference_defaults(),
            pool: true,
            poison: false,
        }
    }

    /// [`RunOptions::new`] with `DYNRT_POISON` and `DYNRT_MEM_PREALLOCATION_OPTIONS` applied.
    ///
    /// # Errors
    /// [`RunError::BadEnv`] for a `DYNRT_POISON` other than `0`/`1`; [`RunError::Predictor`]
    /// for malformed preallocation options.
    pub fn from_env(policy: Policy) -> Result<Self, RunError> {
        let mut o = RunOptions::new(policy);
        if let Some(p) = PredictorOptions::from_env()? {
            o.predictor = p;
        }
        if let Ok(v) = std::env::var("DYNRT_POISON") {
            o.poison = match v.trim() {
                "" | "0" | "false" => false,
                "1" | "true" => true,
                _ => {
                    return Err(RunError::BadEnv {
                        name: "DYNRT_POISON",
                        value: v,
                        reason: "expected 0 or 1",
                    })
                }
            };
        }
        Ok(o)
    }
}

/// Counters of a request since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunStats {
    /// Iterations run.
    pub iterations: u64,
    /// Nodes whose shape was inferred again because an input shape changed.
    pub shape_updates: u64,
    /// Nodes skipped by `update_shape` because no input shape changed.
    pub shape_updates_skipped: u64,
    /// Real allocations the request made (pool records, owned buffers, KV growth, arena).
    pub allocations: u64,
    /// Real allocations after the first iteration, because a buffer was too small (or
    /// reclaimed).
    pub reallocations: u64,
    /// Sum of the sizes of the real allocations, bytes.
    pub bytes_allocated_total: u64,
    /// Buffers reused because the output fitted.
    pub reuses: u64,
    /// Allocations sized by a prediction larger than the actual output.
    pub preallocations: u64,
    /// Predicted sizes that could not be allocated; the exact size was used instead.
    pub preallocation_fallbacks: u64,
    /// Predictions refused by `can_preallocate` (over 90% of the budget or larger than the
    /// largest buffer): the exact size was allocated.
    pub preallocations_refused: u64,
    /// Buffers shrunk because they stayed mostly empty (adaptive policy).
    pub reclaims: u64,
    /// KV-cache growths (old contents copied once into a larger buffer).
    pub state_growths: u64,
    /// Kernel dispatches encoded.
    pub dispatches: u64,
    /// Of those, dispatches recorded again from a node's dispatch plan (shapes and operand
    /// ranges unchanged: no shape checks, parameter computation or cache lookups).
    pub dispatches_replayed: u64,
    /// Buffer copies encoded (reshapes, in-place appends, growth copies).
    pub copies: u64,
    /// Queue submits.
    pub submits: u64,
    /// NaN fills encoded (`DYNRT_POISON`).
    pub poison_fills: u64,
}

impl RunStats {
    /// Field-wise sum (counters of several requests of one run, e.g. prefill then decode).
    pub fn merged(&self, o: &RunStats) -> RunStats {
        RunStats {
            iterations: self.iterations + o.iterations,
            shape_updates: self.shape_updates + o.shape_updates,
            shape_updates_skipped: self.shape_updates_skipped + o.shape_updates_skipped,
            allocations: self.allocations + o.allocations,
            reallocations: self.reallocations + o.reallocations,
            bytes_allocated_total: self.bytes_allocated_total + o.bytes_allocated_total,
            reuses: self.reuses + o.reuses,
            preallocations: self.preallocations + o.preallocations,
            preallocation_fallbacks: self.preallocation_fallbacks + o.preallocation_fallbacks,
            preallocations_refused: self.preallocations_refused + o.preallocations_refused,
            reclaims: self.reclaims + o.reclaims,
            state_growths: self.state_growths + o.state_growths,
            dispatches: self.dispatches + o.dispatches,
            dispatches_replayed: self.dispatches_replayed + o.dispatches_replayed,
            copies: self.copies + o.copies,
            submits: self.submits + o.submits,
            poison_fills: self.poison_fills + o.poison_fills,
        }
    }
}

/// A tensor on the host: shape, element type, little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Shape.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
    /// Row-major little-endian bytes (`shape.size_bytes(dtype)` of them).
    pub bytes: Vec<u8>,
}

impl HostTensor {
    /// An f32 tensor.
    pub fn f32(shape: Shape, data: &[f32]) -> Self {
        HostTensor {
            shape,
            dtype: DType::F32,
            bytes: bytemuck::cast_slice(data).to_vec(),
        }
    }

    /// An i32 tensor.
    pub fn i32(shape: Shape, data: &[i32]) -> Self {
        HostTensor {
            shape,
            dtype: DType::I32,
            bytes: bytemuck::cast_slice(data).to_vec(),
        }
    }

    /// The values as f32 (integers converted exactly below 2^24), e.g. for the CPU reference.
    pub fn to_f32(&self) -> Vec<f32> {
        let words = self.bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        match self.dtype {
            DType::I32 => words.map(|w| i32::from_le_bytes(w) as f32).collect(),
            DType::U32 => words.map(|w| u32::from_le_bytes(w) as f32).collect(),
            _ => words.map(f32::from_le_bytes).collect(),
        }
    }
}

/// One KV-cache tensor moving between requests: its buffer and the rows it holds.
#[derive(Debug)]
struct KvState {
    buffer: Option<Buffer>,
    valid_bytes: u64,
    shape: Shape,
}

/// The KV cache of a request, taken out with [`InferRequest::take_states`] and given to a
/// request of a sibling network with [`InferRequest::put_states`]. Dropping it frees the
/// buffers.
#[derive(Debug)]
pub struct KvStates {
    states: Vec<KvState>,
}

impl KvStates {
    /// Shape of each state (rows held along axis 0).
    pub fn shapes(&self) -> Vec<Shape> {
        self.states.iter().map(|s| s.shape.clone()).collect()
    }
}

/// Where a node's output lives.
enum Mem {
    None,
    Pool(PoolView),
    Own(Buffer),
    Arena(u64),
    /// The state buffer (past inputs and in-place concats).
    State(usize),
    Constant,
}

struct Slot {
    /// Input shapes seen by the last `update_shape` (`None` before the first).
    in_shapes: Option<Vec<Shape>>,
    mem: Mem,
    capacity_bytes: u64,
    /// Fill with NaN before the node writes (poison mode).
    poison: bool,
    /// Host value to upload this iteration ([`Role::HostValue`]).
    upload: Option<Vec<u8>>,
    /// The dispatches a kernel node recorded last time, replayed while its shapes and
    /// operand ranges stay the same (the node's dispatch plan).
    plan: Option<DispatchPlan>,
}

/// What a kernel node recorded: its operands' buffer ranges (inputs then output) and its
/// dispatches. Valid while the node's shapes are unchanged (cleared by update_shape), the
/// operands are these ranges and the kernels' generation is the same. The buffers held here
/// keep their identities from being reused; a plan is dropped when the request frees one of
/// its buffers, so plans never keep freed memory alive.
struct DispatchPlan {
    operands: Vec<(wgpu::Buffer, u64, u64)>,
    dispatches: Vec<RecordedDispatch>,
    generation: u64,
}

impl DispatchPlan {
    fn matches(&self, ins: &[Operand<'_>], out: &Operand<'_>, generation: u64) -> bool {
        self.generation == generation
            && self.operands.len() == ins.len() + 1
            && ins
                .iter()
                .chain(std::iter::once(out))
                .zip(&self.operands)
                .all(|(o, (b, off, size))| {
                    o.tensor.buffer == b
                        && o.tensor.offset_bytes == *off
                        && o.tensor.size_bytes == *size
                })
    }
}

struct StateSlot {
    /// Holds the past rows; `None` before the first append.
    buffer: Option<Buffer>,
    /// Rows' bytes valid in `buffer` (the past).
    valid_bytes: u64,
    /// Shape of the past tensor.
    shape: Shape,
    /// A larger buffer allocated this iteration; the past is copied into it in order.
    grown: Option<Buffer>,
    /// Bytes this iteration appends.
    append_bytes: u64,
    /// Shape after this iteration.
    next_shape: Shape,
}

impl StateSlot {
    fn current(&self) -> Option<&Buffer> {
        self.grown.as_ref().or(self.buffer.as_ref())
    }
}

/// One stream of inferences on a [`Network`]: its own predictor, pool, activations and
/// KV-cache states. Dropping it frees all of them.
pub struct InferRequest {
    net: Network,
    options: RunOptions,
    predictor: ShapePredictor,
    pool: MemoryPool<EngineStorage>,
    arena: Option<Buffer>,
    slots: Vec<Slot>,
    states: Vec<StateSlot>,
    /// Output shape per node id (valid for nodes updated at least once).
    shapes: Vec<Shape>,
    /// Host values per node id (shape data).
    values: Vec<Option<Vec<i64>>>,
    /// Source of NaN bytes for poison fills.
    nan_source: Option<Buffer>,
    /// Per-dispatch uniform slots of this request's submits (taken while encoding).
    uniforms: Option<UniformArena>,
    stats: RunStats,
    /// Whether the current iteration is the first (allocations then are not reallocations).
    first_iteration: bool,
}

impl std::fmt::Debug for InferRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferRequest")
            .field("options", &self.options)
            .field("stats", &self.stats)
            .finish()
    }
}

fn alloc_err(what: impl Into<String>) -> impl FnOnce(AllocError) -> RunError {
    let what = what.into();
    move |source| RunError::Alloc { what, source }
}

impl InferRequest {
    /// A request on `network`. Allocates the static arena (planner on) or acquires the static
    /// outputs from the pool in descending order of size (planner off).
    ///
    /// # Errors
    /// [`RunError::OutOfMemory`] / [`RunError::Alloc`] when the static memory does not fit.
    pub fn new(network: &Network, options: RunOptions) -> Result<InferRequest, RunError> {
        let inner = &network.inner;
        let engine = &inner.engine;
        let n = inner.graph.len();
        let mut req = InferRequest {
            net: network.clone(),
            options,
            predictor: ShapePredictor::new(options.policy, options.predictor),
            pool: MemoryPool::new(EngineStorage::new(engine.clone())),
            arena: None,
            slots: Vec::with_capacity(n),
            states: Vec::new(),
            shapes: vec![Shape::default(); n],
            values: vec![None; n],
            nan_source: None,
            uniforms: Some(UniformArena::new(engine.gpu().device())),
            stats: RunStats::default(),
            first_iteration: true,
        };
        for s in &inner.states {
            let Op::Input { dims } = &inner.graph.node(s.past).op else {
                continue;
            };
            // The past starts empty: axis 0 is 0, the other dimensions must be fixed.
            let mut shape = vec![0u64];
            for d in dims.iter().skip(1) {
                match d {
                    crate::graph::Dim::Fixed(v) => shape.push(*v),
                    crate::graph::Dim::Sym(sym) => match inner.graph_fixed(sym) {
                        Some(v) => shape.push(v),
                        None => {
                            return Err(RunError::BadState {
                                past: inner.graph.node(s.past).label.clone(),
                                present: inner.graph.node(s.present).label.clone(),
                                reason: format!("dimension `{sym}` after axis 0 must be fixed"),
                            })
                        }
                    },
                }
            }
            req.states.push(StateSlot {
                buffer: None,
                valid_bytes: 0,
                shape: Shape(shape.clone()),
                grown: None,
                append_bytes: 0,
                next_shape: Shape(shape),
            });
        }
        for c in &inner.nodes {
            let mem = match c.role {
                Role::Constant => Mem::Constant,
                Role::Input { state: Some(s) } | Role::StateConcat { state: s } => Mem::State(s),
                _ => match c.arena_offset {
                    Some(off) => Mem::Arena(off),
                    None => Mem::None,
                },
            };
            let capacity_bytes = match (&mem, &c.static_shape) {
                (Mem::Arena(_), Some(s)) => padded_bytes(s, c.dtype)?,
                _ => 0,
            };
            req.slots.push(Slot {
                plan: None,
                in_shapes: None,
                poison: matches!(mem, Mem::Arena(_)),
                mem,
                capacity_bytes,
                upload: None,
            });
        }
        if inner.arena_bytes > 0 {
            let arena = engine
                .allocate(&BufferDesc {
                    label: "dynrt static arena",
                    size_bytes: inner.arena_bytes,
                    kind: AllocKind::UsmDevice,
                })
                .map_err(|source| RunError::OutOfMemory {
                    node: "static arena".into(),
                    requested_bytes: inner.arena_bytes,
                    source,
                })?;
            req.count_allocation(arena.size_bytes());
            req.arena = Some(arena);
        }
        // Static outputs not in the arena: allocated now, largest first (the reference creates
        // primitive_insts in descending output size for better reuse).
        let mut statics: Vec<(u64, usize)> = Vec::new();
        for (k, c) in inner.nodes.iter().enumerate() {
            let allocatable = matches!(c.role, Role::Kernel | Role::Copy | Role::ConcatCopy);
            if let (true, None, Some(shape)) = (allocatable, c.arena_offset, &c.static_shape) {
                statics.push((padded_bytes(shape, c.dtype)?, k));
            }
        }
        statics.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (size, k) in statics {
            let kind = req.kind_of(k);
            req.obtain(k, size.max(4), size.max(4), kind, false)?;
        }
        Ok(req)
    }

    /// The network.
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// Counters since creation.
    pub fn stats(&self) -> RunStats {
        self.stats
    }

    /// The request's options.
    pub fn options(&self) -> RunOptions {
        self.options
    }

    /// Rows currently held by each state (the past length of the KV cache).
    pub fn state_shapes(&self) -> Vec<Shape> {
        self.states.iter().map(|s| s.shape.clone()).collect()
    }

    /// The states' buffers (their raw handles).
    fn states_buffers(&self) -> Vec<wgpu::Buffer> {
        self.states
            .iter()
            .filter_map(|s| s.buffer.as_ref().map(|b| b.raw().clone()))
            .collect()
    }

    /// Takes the KV cache out of this request (which then starts a new sequence) to continue
    /// it on a request of a network specialised from the same graph
    /// ([`Network::specialize`]): no copy, the buffers move.
    pub fn take_states(&mut self) -> KvStates {
        // The buffers leave this request: its plans and cached bind groups must not keep them.
        let leaving: Vec<wgpu::Buffer> = self.states_buffers();
        self.forget_bound_buffers(&leaving);
        let states = self
            .states
            .iter_mut()
            .map(|s| KvState {
                buffer: s.buffer.take(),
                valid_bytes: std::mem::take(&mut s.valid_bytes),
                shape: {
                    let shape = s.shape.clone();
                    if let Some(d) = s.shape.0.first_mut() {
                        *d = 0;
                    }
                    s.next_shape = s.shape.clone();
                    shape
                },
            })
            .collect();
        KvStates { states }
    }

    /// Continues the sequence held in `states` (from [`InferRequest::take_states`]).
    ///
    /// # Errors
    /// [`RunError::BadState`] when the number of states or their row shapes differ; the
    /// request is unchanged then.
    pub fn put_states(&mut self, states: KvStates) -> Result<(), RunError> {
        let inner = &self.net.inner;
        let bad = |i: usize, reason: String| {
            let s = &inner.states[i.min(inner.states.len().saturating_sub(1))];
            RunError::BadState {
                past: inner.graph.node(s.past).label.clone(),
                present: inner.graph.node(s.present).label.clone(),
                reason,
            }
        };
        if states.states.len() != self.states.len() || self.states.is_empty() {
            return Err(bad(
                0,
                format!(
                    "{} states given, the network has {}",
                    states.states.len(),
                    self.states.len()
                ),
            ));
        }
        for (i, (given, mine)) in states.states.iter().zip(&self.states).enumerate() {
            if given.shape.dims().get(1..) != mine.shape.dims().get(1..) {
                return Err(bad(
                    i,
                    format!("rows of shape {} do not fit {}", given.shape, mine.shape),
                ));
            }
        }
        // The buffers replaced here are freed: nothing cached may keep them.
        let replaced: Vec<wgpu::Buffer> = self.states_buffers();
        self.forget_bound_buffers(&replaced);
        for (given, mine) in states.states.into_iter().zip(&mut self.states) {
            mine.buffer = given.buffer;
            mine.valid_bytes = given.valid_bytes;
            mine.shape = given.shape;
            mine.next_shape = mine.shape.clone();
        }
        Ok(())
    }

    /// Forgets the states (a new sequence starts); their buffers are kept for reuse.
    pub fn reset_states(&mut self) {
        for s in &mut self.states {
            s.valid_bytes = 0;
            if let Some(d) = s.shape.0.first_mut() {
                *d = 0;
            }
            s.next_shape = s.shape.clone();
        }
    }

    fn engine(&self) -> &Engine {
        &self.net.inner.engine
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
        let c = &self.net.inner.nodes[k];
        if c.is_output || matches!(c.role, Role::Input { state: None }) {
            self.net.inner.io_kind
        } else {
            AllocKind::UsmDevice
        }
    }

    /// Gives node `k` a buffer of `size_bytes` (at least `needed_bytes`): from the pool or the
    /// engine. A preallocation that fails falls back to `needed_bytes`; when that fails too,
    /// the node is left without memory and the error names it.
    fn obtain(
        &mut self,
        k: usize,
        size_bytes: u64,
        needed_bytes: u64,
        kind: AllocKind,
        dynamic: bool,
    ) -> Result<(), RunError> {
        let inner = Arc::clone(&self.net.inner);
        let c = &inner.nodes[k];
        let label = &inner.graph.node(c.id).label;
        // The old buffer is dead (this node recomputes its output), so it is released first:
        // the pool may then hand its record to someone else, and peak memory stays lower.
        self.release_slot(k);
        // Network inputs and host values are written by the host before the submit (their
        // writes land before every command of it), so they must never share memory with a
        // node that runs earlier in the same submit: they own their buffers.
        let pooled = self.options.pool && !matches!(c.role, Role::HostValue | Role::Input { .. });
        let mut attempt = |size: u64| -> Result<(Mem, u64, Option<u64>), AllocError> {
            if pooled {
                let req = PoolRequest {
                    size_bytes: size,
                    kind,
                    network: inner.network_id,
                    requester: NodeId(k as u32),
                    restrictions: &c.restrictions,
                    dynamic,
                };
                match self.pool.acquire(&req) {
                    Ok(view) => {
                        let rec = self
                            .pool
                            .buffer(&view)
                            .map(|b| b.size_bytes())
                            .unwrap_or(size);
                        let fresh = (!view.reused).then_some(rec);
                        Ok((Mem::Pool(view), rec, fresh))
                    }
                    Err(crate::memory::pool::PoolError::Allocate { source, .. }) => Err(source),
                    Err(other) => Err(AllocError::Validation(other.to_string())),
                }
            } else {
                let buf = self.net.inner.engine.allocate(&BufferDesc {
                    label,
                    size_bytes: size,
                    kind,
                })?;
                let s = buf.size_bytes();
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
            Err(source) => Err(RunError::OutOfMemory {
                node: label.clone(),
                requested_bytes: needed_bytes,
                source,
            }),
        }
    }

    /// Drops the cached bind groups and dispatch plans that bind any of `gone`: they hold the
    /// buffers they bind, and a buffer this request frees (or hands away) must really leave.
    fn forget_bound_buffers(&mut self, gone: &[wgpu::Buffer]) {
        if gone.is_empty() {
            return;
        }
        self.net.inner.kernels().forget_bind_groups_binding(gone);
        for slot in &mut self.slots {
            let binds_gone = slot
                .plan
                .as_ref()
                .is_some_and(|p| p.operands.iter().any(|(b, _, _)| gone.contains(b)));
            if binds_gone {
                slot.plan = None;
            }
        }
    }

    fn release_slot(&mut self, k: usize) {
        let slot = &mut self.slots[k];
        match std::mem::replace(&mut slot.mem, Mem::None) {
            Mem::Pool(view) => {
                let raw = self.pool.buffer(&view).map(|b| b.raw().clone());
                self.pool
                    .release(self.net.inner.network_id, NodeId(k as u32));
                // Cached bind groups and plans must not keep released memory bound (or alive).
                if let Ok(raw) = raw {
                    self.forget_bound_buffers(&[raw]);
                }
            }
            Mem::Own(b) => {
                let raw = b.raw().clone();
                drop(b);
                self.forget_bound_buffers(&[raw]);
            }
            other => slot.mem = other,
        }
        if matches!(self.slots[k].mem, Mem::None) {
            self.slots[k].capacity_bytes = 0;
        }
    }

    /// `realloc_if_needed` for an ordinary node (DESIGN §3 step 3).
    fn realloc_if_needed(&mut self, k: usize, shape: &Shape) -> Result<(), RunError> {
        let inner = Arc::clone(&self.net.inner);
        let c = &inner.nodes[k];
        if c.static_shape.is_some() && !matches!(self.slots[k].mem, Mem::None) {
            return Ok(()); // allocated at creation with its final size
        }
        let label = &inner.graph.node(c.id).label;
        let needed = padded_bytes(shape, c.dtype)?.max(4);
        let bits = c.dtype.bits();
        let slot = &self.slots[k];
        let has_mem = !matches!(slot.mem, Mem::None);
        if has_mem && slot.capacity_bytes >= needed {
            // Record the shape even though the buffer is reused (reference semantics).
            self.predictor
                .predict_preallocation_shape(label, shape, bits, true)?;
            if !self
                .predictor
                .should_reclaim(label, needed, slot.capacity_bytes)
            {
                self.stats.reuses += 1;
                if self.options.poison {
                    self.slots[k].poison = true;
                }
                return Ok(());
            }
            self.stats.reclaims += 1;
            let kind = self.kind_of(k);
            return self.obtain(k, needed, needed, kind, true);
        }
        let size = self.preallocation_size(label, shape, c.dtype, needed)?;
        let kind = self.kind_of(k);
        self.obtain(k, size, needed, kind, true)
    }

    /// The size to allocate for an output of `shape` (`needed` bytes) that does not fit its
    /// buffer: the predictor's shape when it predicts one larger than `needed` and
    /// `can_preallocate` accepts it, else `needed` — never below the actual size (reference
    /// rule). Records the shape in the predictor.
    fn preallocation_size(
        &mut self,
        label: &str,
        shape: &Shape,
        dtype: DType,
        needed: u64,
    ) -> Result<u64, RunError> {
        let (predicted, pshape) =
            self.predictor
                .predict_preallocation_shape(label, shape, dtype.bits(), false)?;
        if !predicted {
            return Ok(needed);
        }
        let p = padded_bytes(&pshape, dtype)?;
        if p <= needed {
            return Ok(needed);
        }
        if self.engine().can_preallocate(p) {
            Ok(p)
        } else {
            self.stats.preallocations_refused += 1;
            Ok(needed)
        }
    }

    /// `realloc_if_needed` for a state's in-place concat: room for `new_shape`, keeping the
    /// past. A larger buffer is taken from the engine; the past is copied into it in order.
    fn realloc_state(&mut self, k: usize, s: usize, new_shape: &Shape) -> Result<(), RunError> {
        let inner = Arc::clone(&self.net.inner);
        let c = &inner.nodes[k];
        let label = &inner.graph.node(c.id).label;
        let needed = padded_bytes(new_shape, c.dtype)?.max(4);
        let bits = c.dtype.bits();
        let st = &self.states[s];
        let capacity = st.buffer.as_ref().map_or(0, |b| b.size_bytes());
        let past_bytes = st.valid_bytes;
        self.states[s].append_bytes = needed.saturating_sub(past_bytes);
        self.states[s].next_shape = new_shape.clone();
        if capacity >= needed {
            self.predictor
                .predict_preallocation_shape(label, new_shape, bits, true)?;
            self.stats.reuses += 1;
            return Ok(());
        }
        let size = self.preallocation_size(label, new_shape, c.dtype, needed)?;
        let engine = self.engine().clone();
        let desc = |size_bytes| BufferDesc {
            label,
            size_bytes,
            kind: AllocKind::UsmDevice,
        };
        let buf = match engine.allocate(&desc(size)) {
            Ok(b) => {
                if size > needed {
                    self.stats.preallocations += 1;
                }
                b
            }
            Err(_) if size > needed => {
                self.stats.preallocation_fallbacks += 1;
                engine
                    .allocate(&desc(needed))
                    .map_err(|source| RunError::OutOfMemory {
                        node: label.clone(),
                        requested_bytes: needed,
                        source,
                    })?
            }
            Err(source) => {
                return Err(RunError::OutOfMemory {
                    node: label.clone(),
                    requested_bytes: needed,
                    source,
                })
            }
        };
        self.count_allocation(buf.size_bytes());
        if self.states[s].buffer.is_some() {
            self.stats.state_growths += 1;
        }
        self.states[s].grown = Some(buf);
        Ok(())
    }

    /// Runs one iteration with `inputs` (every network input except the states' pasts) and
    /// returns the outputs named in `read`, in that order. One submit for all the work, then
    /// one readback per output read.
    ///
    /// # Errors
    /// [`RunError::BadInput`] / [`RunError::Graph`] for inputs that do not fit the graph;
    /// [`RunError::OutOfMemory`] naming the node whose output cannot be allocated (the request
    /// stays usable: states are unchanged and nothing was submitted);
    /// [`RunError::UnknownOutput`]; [`RunError::Alloc`] for readback failures.
    pub async fn infer(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        read: &[&str],
    ) -> Result<Vec<HostTensor>, RunError> {
        let result = self.run_iteration(inputs).await;
        if result.is_err() {
            // Nothing was submitted: forget the growths prepared for this iteration, and make
            // the next iteration infer every node again (some took new shapes and buffers).
            for st in &mut self.states {
                st.grown = None;
                st.append_bytes = 0;
                st.next_shape = st.shape.clone();
            }
            for slot in &mut self.slots {
                slot.in_shapes = None;
                slot.upload = None;
                slot.plan = None;
            }
        }
        result?;
        let mut out = Vec::with_capacity(read.len());
        for label in read {
            out.push(self.read_output(label).await?);
        }
        Ok(out)
    }

    async fn run_iteration(&mut self, inputs: &[(&str, &HostTensor)]) -> Result<(), RunError> {
        let inner = Arc::clone(&self.net.inner);
        let graph = &inner.graph;
        for st in &mut self.states {
            st.append_bytes = 0;
            st.next_shape = st.shape.clone();
        }
        // Bind the symbols from the given inputs and the states' pasts.
        let mut given: Vec<(&str, &Shape)> = Vec::new();
        for &(label, t) in inputs {
            let id = graph.find(label).ok_or_else(|| RunError::BadInput {
                input: label.to_string(),
                reason: "not an input of the network".into(),
            })?;
            let k = inner.pos_of[id.index()];
            if !matches!(inner.nodes[k].role, Role::Input { state: None }) {
                return Err(RunError::BadInput {
                    input: label.to_string(),
                    reason:
                        "not a network input the caller gives (state pasts are kept by the request)"
                            .into(),
                });
            }
            let dtype = graph.node(id).dtype;
            let expect = t.shape.size_bytes(dtype)?;
            if t.dtype.bits() != dtype.bits() || t.bytes.len() as u64 != expect {
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
            given.push((label, &t.shape));
        }
        for (si, s) in inner.states.iter().enumerate() {
            given.push((graph.node(s.past).label.as_str(), &self.states[si].shape));
        }
        let mut bindings: Bindings = graph.bind(&given)?;
        for (k, v) in inner_fixed(&inner) {
            bindings.entry(k).or_insert(v);
        }

        // Phase 1: update_shape, update_impl, realloc_if_needed for every node in order.
        for k in 0..inner.nodes.len() {
            let c = &inner.nodes[k];
            let id = c.id;
            let node = graph.node(id);
            // update_shape: skip when no input shape changed (data-dependent values such as
            // ShapeOf results are functions of shapes, so they cannot change either). Compared
            // in place: this runs for every node of every iteration.
            let input_shape = match &node.op {
                Op::Input { .. } => Some(graph.input_shape(id, &bindings)?),
                _ => None,
            };
            let changed = match (&self.slots[k].in_shapes, &input_shape) {
                (None, _) => true,
                (Some(prev), Some(s)) => prev.len() != 1 || &prev[0] != s,
                (Some(prev), None) => {
                    prev.len() != node.inputs.len()
                        || node
                            .inputs
                            .iter()
                            .zip(prev)
                            .any(|(i, p)| &self.shapes[i.index()] != p)
                }
            };
            if !changed {
                self.stats.shape_updates_skipped += 1;
                if c.role == Role::HostValue && self.options.poison {
                    self.queue_host_value(k, id);
                }
                continue;
            }
            let in_shapes: Vec<Shape> = match input_shape {
                Some(s) => vec![s],
                None => node
                    .inputs
                    .iter()
                    .map(|i| self.shapes[i.index()].clone())
                    .collect(),
            };
            self.stats.shape_updates += 1;
            let (shape, value) = graph.infer_node(id, &bindings, &self.shapes, &self.values)?;
            // update_impl happens when the dispatch is recorded (module docs).
            // realloc_if_needed.
            match c.role {
                Role::Constant | Role::ShapeOnly | Role::Input { state: Some(_) } => {}
                Role::StateConcat { state } => self.realloc_state(k, state, &shape)?,
                Role::Input { state: None }
                | Role::Copy
                | Role::ConcatCopy
                | Role::Kernel
                | Role::HostValue => {
                    self.realloc_if_needed(k, &shape)?;
                }
            }
            self.shapes[id.index()] = shape;
            self.values[id.index()] = value;
            self.slots[k].in_shapes = Some(in_shapes);
            self.slots[k].plan = None;
            if c.role == Role::HostValue {
                self.queue_host_value(k, id);
            }
        }

        // Inputs: written before the submit that reads them. usm_shared buffers are mapped
        // and written directly; device buffers go through wgpu's staging (queue.write_buffer,
        // which lands at the start of the next submit: nothing earlier reads these buffers).
        for &(label, t) in inputs {
            let Some(id) = graph.find(label) else {
                continue;
            };
            let k = inner.pos_of[id.index()];
            let bytes = pad4(&t.bytes);
            if bytes.is_empty() {
                continue;
            }
            let (buf, off) = self.slot_buffer(k).ok_or_else(|| RunError::BadInput {
                input: label.to_string(),
                reason: "no buffer".into(),
            })?;
            if buf.usages().contains(wgpu::BufferUsages::MAP_WRITE) {
                let engine = self.engine().clone();
                let (buf, off) = self.slot_buffer(k).ok_or_else(|| RunError::BadInput {
                    input: label.to_string(),
                    reason: "no buffer".into(),
                })?;
                engine
                    .write_mapped(buf, off, &bytes)
                    .await
                    .map_err(alloc_err(format!("writing input `{label}`")))?;
            } else {
                self.engine()
                    .gpu()
                    .queue()
                    .write_buffer(buf.raw(), off, &bytes);
            }
        }

        // Phase 2: encode every dispatch and copy, in processing order, into one encoder.
        // Consecutive kernels share one compute pass; a copy closes it (wgpu locks the encoder
        // while a pass is open).
        self.ensure_nan_source()?;
        let engine = self.engine().clone();
        let gpu = engine.gpu();
        // A validation error would otherwise only be logged and the whole iteration silently
        // skipped; the scope turns it into an error of this call.
        let scope = gpu.device().push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = gpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("dynrt iteration"),
            });
        let mut uniforms = match self.uniforms.take() {
            Some(u) => u,
            None => UniformArena::new(gpu.device()),
        };
        uniforms.reset();
        let mut host_uploads: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut pass: Option<OpenPass> = None;
        let mut offsets: Vec<u32> = Vec::new();
        let mut encoded = Ok(());
        {
            let mut kernels = inner.kernels();
            for k in 0..inner.nodes.len() {
                let mut ctx = EncodeCtx {
                    enc: &mut enc,
                    pass: &mut pass,
                    offsets: &mut offsets,
                    uniforms: &mut uniforms,
                    kernels: &mut kernels,
                    host_uploads: &mut host_uploads,
                };
                if let Err(e) = self.encode_node(&inner, k, &mut ctx) {
                    encoded = Err(e);
                    break;
                }
            }
        }
        drop(pass);
        uniforms.flush(gpu.queue());
        self.uniforms = Some(uniforms);
        encoded?;
        for (k, bytes) in host_uploads {
            // HostValue nodes own their buffer (never pooled), so this write cannot land in a
            // buffer that another command of this submit still reads.
            if let Some((buf, off)) = self.slot_buffer(k) {
                gpu.queue().write_buffer(buf.raw(), off, &bytes);
            }
        }
        gpu.queue().submit([enc.finish()]);
        if let Some(e) = scope.pop().await {
            return Err(RunError::Kernel {
                node: "(iteration)".into(),
                op: "submit",
                reason: e.to_string(),
            });
        }
        self.stats.submits += 1;
        self.stats.iterations += 1;
        self.first_iteration = false;
        // Commit the states: the grown buffer replaces the old one (freed once the copies ran).
        let mut replaced = Vec::new();
        for st in &mut self.states {
            if let Some(g) = st.grown.take() {
                if let Some(old) = st.buffer.replace(g) {
                    replaced.push(old.raw().clone());
                }
            }
            st.valid_bytes += st.append_bytes;
            st.append_bytes = 0;
            st.shape = st.next_shape.clone();
        }
        // The old state buffers are dropped: forget the bind groups and plans that bound them.
        self.forget_bound_buffers(&replaced);
        Ok(())
    }

    fn queue_host_value(&mut self, k: usize, id: NodeId) {
        if let Some(v) = &self.values[id.index()] {
            let bytes: Vec<u8> = v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
            self.slots[k].upload = Some(bytes);
        }
    }

    fn ensure_nan_source(&mut self) -> Result<(), RunError> {
        if !self.options.poison {
            return Ok(());
        }
        let need = self
            .slots
            .iter()
            .filter(|s| s.poison)
            .map(|s| s.capacity_bytes)
            .chain(
                self.states
                    .iter()
                    .filter_map(|s| s.grown.as_ref().map(|b| b.size_bytes())),
            )
            .max()
            .unwrap_or(0);
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
            .allocate_init(
                &BufferDesc {
                    label: "dynrt poison source",
                    size_bytes: size,
                    kind: AllocKind::UsmDevice,
                },
                &vec![0xFFu8; size as usize],
            )
            .map_err(alloc_err("poison source"))?;
        self.nan_source = Some(buf);
        Ok(())
    }

    /// The buffer and offset a node's output lives at.
    fn slot_buffer(&self, k: usize) -> Option<(&Buffer, u64)> {
        let inner = &self.net.inner;
        match &self.slots[k].mem {
            Mem::None => None,
            Mem::Pool(v) => self.pool.buffer(v).ok().map(|b| (b, v.offset_bytes)),
            Mem::Own(b) => Some((b, 0)),
            Mem::Arena(off) => self.arena.as_ref().map(|a| (a, *off)),
            Mem::State(s) => self.states[*s].current().map(|b| (b, 0)),
            Mem::Constant => inner.constants[inner.nodes[k].id.index()]
                .as_ref()
                .map(|b| (b, 0)),
        }
    }

    /// The operand of node `id`'s output for a kernel or a copy: buffer range and shape.
    fn tensor_of(&self, id: NodeId) -> Option<Operand<'_>> {
        let inner = &self.net.inner;
        let k = inner.pos_of[id.index()];
        // A state's past is read from the buffer that holds it now; the append of this
        // iteration goes to the same (or the grown) buffer after it.
        let (buffer, offset_bytes) = match (&self.slots[k].mem, inner.nodes[k].role) {
            (Mem::State(s), Role::Input { .. }) => (self.states[*s].buffer.as_ref()?, 0),
            _ => self.slot_buffer(k)?,
        };
        let available = buffer.size_bytes().saturating_sub(offset_bytes);
        let size_bytes = match self.slots[k].mem {
            Mem::Arena(_) | Mem::Pool(_) => self.slots[k].capacity_bytes.min(available),
            _ => available,
        };
        Some(Operand {
            tensor: TensorRef {
                buffer: buffer.raw(),
                offset_bytes,
                size_bytes,
            },
            shape: &self.shapes[id.index()],
            dtype: inner.nodes[k].dtype,
        })
    }

    fn poison_fill(
        &self,
        enc: &mut wgpu::CommandEncoder,
        dst: &Buffer,
        offset: u64,
        len: u64,
    ) -> bool {
        match &self.nan_source {
            Some(src) if len > 0 && src.size_bytes() >= len => {
                enc.copy_buffer_to_buffer(src.raw(), 0, dst.raw(), offset, len);
                true
            }
            _ => false,
        }
    }

    /// Records node `k`: the NaN fill in poison mode, then its copies or its dispatches.
    fn encode_node(
        &mut self,
        inner: &Inner,
        k: usize,
        ctx: &mut EncodeCtx<'_, '_>,
    ) -> Result<(), RunError> {
        let c = &inner.nodes[k];
        let node = inner.graph.node(c.id);
        let kernel_err = |reason: String| RunError::Kernel {
            node: node.label.clone(),
            op: node.op.name(),
            reason,
        };
        // Poison what was handed out, before the node writes it (and after every earlier
        // command, which may still have read the previous contents).
        let poison_now = self.options.poison
            && self.slots[k].poison
            && !matches!(
                c.role,
                Role::Input { .. } | Role::Constant | Role::StateConcat { .. } | Role::ShapeOnly
            );
        self.slots[k].poison = false;
        if poison_now {
            if let Some((buf, off)) = self.slot_buffer(k) {
                let cap = self.slots[k].capacity_bytes.min(buf.size_bytes() - off);
                *ctx.pass = None;
                if self.poison_fill(ctx.enc, buf, off, cap) {
                    self.stats.poison_fills += 1;
                }
            }
        }
        match c.role {
            Role::Input { .. } | Role::Constant | Role::ShapeOnly => {}
            Role::HostValue => {
                if let Some(bytes) = self.slots[k].upload.take() {
                    ctx.host_uploads.push((k, pad4(&bytes)));
                }
            }
            Role::StateConcat { state } => {
                *ctx.pass = None;
                let st = &self.states[state];
                let past = st.valid_bytes;
                let append = st.append_bytes;
                let target = st
                    .current()
                    .ok_or_else(|| kernel_err("state has no buffer".into()))?;
                if let Some(grown) = &st.grown {
                    if self.options.poison
                        && self.poison_fill(ctx.enc, grown, 0, grown.size_bytes())
                    {
                        self.stats.poison_fills += 1;
                    }
                    if let (Some(old), true) = (&st.buffer, past > 0) {
                        // Growth: the old contents move once.
                        ctx.enc
                            .copy_buffer_to_buffer(old.raw(), 0, grown.raw(), 0, past);
                        self.stats.copies += 1;
                    }
                }
                if node.inputs.len() != 2 {
                    return Err(kernel_err(
                        "a state concat takes exactly the past and the new rows".into(),
                    ));
                }
                let src = self
                    .tensor_of(node.inputs[1])
                    .ok_or_else(|| kernel_err("new rows have no buffer".into()))?;
                if append > 0 {
                    // Only the new slice is written (in-place concatenation).
                    ctx.enc.copy_buffer_to_buffer(
                        src.tensor.buffer,
                        src.tensor.offset_bytes,
                        target.raw(),
                        past,
                        append,
                    );
                    self.stats.copies += 1;
                }
            }
            Role::Copy => {
                let src = self
                    .tensor_of(node.inputs[0])
                    .ok_or_else(|| kernel_err("input has no buffer".into()))?;
                let out = self
                    .tensor_of(c.id)
                    .ok_or_else(|| kernel_err("output has no buffer".into()))?;
                let bytes = padded_bytes(out.shape, c.dtype)?;
                if bytes == 0 {
                    return Ok(());
                }
                if src.tensor.buffer == out.tensor.buffer {
                    // WebGPU forbids a buffer copy within one buffer (arena neighbours): the
                    // copy kernel does it instead.
                    let op = Op::Reshape {
                        target: out.shape.dims().iter().map(|&d| d as i64).collect(),
                    };
                    let n = encode_kernel(ctx, &op, &[src], &out).map_err(kernel_err)?;
                    self.stats.dispatches += n as u64;
                } else {
                    *ctx.pass = None;
                    ctx.enc.copy_buffer_to_buffer(
                        src.tensor.buffer,
                        src.tensor.offset_bytes,
                        out.tensor.buffer,
                        out.tensor.offset_bytes,
                        bytes,
                    );
                    self.stats.copies += 1;
                }
            }
            Role::ConcatCopy => {
                let ins: Vec<Operand<'_>> = node
                    .inputs
                    .iter()
                    .map(|&i| {
                        self.tensor_of(i)
                            .ok_or_else(|| kernel_err(format!("input {i} has no buffer")))
                    })
                    .collect::<Result<_, _>>()?;
                let out = self
                    .tensor_of(c.id)
                    .ok_or_else(|| kernel_err("output has no buffer".into()))?;
                let aligned = ins
                    .iter()
                    .all(|t| t.shape.size_bytes(t.dtype).is_ok_and(|b| b % 4 == 0));
                if !aligned || ins.iter().any(|t| t.tensor.buffer == out.tensor.buffer) {
                    let n = encode_kernel(ctx, &node.op, &ins, &out).map_err(kernel_err)?;
                    self.stats.dispatches += n as u64;
                } else {
                    *ctx.pass = None;
                    let mut at = out.tensor.offset_bytes;
                    let mut copies = 0;
                    for t in &ins {
                        let bytes = t.shape.size_bytes(t.dtype)?;
                        if bytes > 0 {
                            ctx.enc.copy_buffer_to_buffer(
                                t.tensor.buffer,
                                t.tensor.offset_bytes,
                                out.tensor.buffer,
                                at,
                                bytes,
                            );
                            copies += 1;
                        }
                        at += bytes;
                    }
                    self.stats.copies += copies;
                }
            }
            Role::Kernel => {
                let input = |i: NodeId| {
                    self.tensor_of(i)
                        .ok_or_else(|| kernel_err(format!("input {i} has no buffer")))
                };
                // Up to 4 operands on the stack (every dispatch of every iteration passes
                // here); a wider node collects into a Vec.
                let mut few: [Option<Operand<'_>>; 4] = [None; 4];
                let many: Vec<Operand<'_>>;
                let gathered: [Operand<'_>; 4];
                let ins: &[Operand<'_>] = match node.inputs.as_slice() {
                    [first, rest @ ..] if rest.len() < few.len() => {
                        let first = input(*first)?;
                        few[0] = Some(first);
                        for (slot, &i) in few[1..].iter_mut().zip(rest) {
                            *slot = Some(input(i)?);
                        }
                        gathered = few.map(|o| o.unwrap_or(first));
                        &gathered[..node.inputs.len()]
                    }
                    all => {
                        many = all.iter().map(|&i| input(i)).collect::<Result<_, _>>()?;
                        &many
                    }
                };
                let out = self
                    .tensor_of(c.id)
                    .ok_or_else(|| kernel_err("output has no buffer".into()))?;
                let generation = ctx.kernels.generation();
                if let Some(plan) = &self.slots[k].plan {
                    if plan.matches(ins, &out, generation) && replay(ctx, plan) {
                        let n = plan.dispatches.len() as u64;
                        ctx.kernels.count_replayed(n);
                        self.stats.dispatches += n;
                        self.stats.dispatches_replayed += n;
                        return Ok(());
                    }
                }
                let (n, recorded) =
                    encode_recorded(ctx, &node.op, ins, &out).map_err(kernel_err)?;
                let operands = ins
                    .iter()
                    .chain(std::iter::once(&out))
                    .map(|o| {
                        (
                            o.tensor.buffer.clone(),
                            o.tensor.offset_bytes,
                            o.tensor.size_bytes,
                        )
                    })
                    .collect();
                self.stats.dispatches += n as u64;
                self.slots[k].plan = Some(DispatchPlan {
                    operands,
                    dispatches: recorded,
                    generation,
                });
            }
        }
        Ok(())
    }

    /// Reads an output of the last iteration (a state's present included).
    ///
    /// # Errors
    /// [`RunError::UnknownOutput`]; [`RunError::Alloc`] when the readback fails.
    pub async fn read_output(&self, label: &str) -> Result<HostTensor, RunError> {
        let inner = &self.net.inner;
        let id = inner
            .graph
            .find(label)
            .filter(|id| inner.graph.outputs().contains(id))
            .ok_or_else(|| RunError::UnknownOutput {
                label: label.to_string(),
            })?;
        let k = inner.pos_of[id.index()];
        let dtype = inner.nodes[k].dtype;
        let shape = self.shapes[id.index()].clone();
        let bytes = shape.size_bytes(dtype)?;
        if bytes == 0 {
            return Ok(HostTensor {
                shape,
                dtype,
                bytes: Vec::new(),
            });
        }
        let (buf, off) = self.slot_buffer(k).ok_or_else(|| RunError::UnknownOutput {
            label: label.to_string(),
        })?;
        let data = self
            .engine()
            .read(buf, off, bytes)
            .await
            .map_err(alloc_err(format!("reading output `{label}`")))?;
        Ok(HostTensor {
            shape,
            dtype,
            bytes: data,
        })
    }

    /// [`InferRequest::infer`], blocking (native only).
    ///
    /// # Errors
    /// As [`InferRequest::infer`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn infer_blocking(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        read: &[&str],
    ) -> Result<Vec<HostTensor>, RunError> {
        pollster::block_on(self.infer(inputs, read))
    }
}

/// The open compute pass and the pipeline bound in it.
struct OpenPass {
    pass: wgpu::ComputePass<'static>,
    pipeline: Option<wgpu::ComputePipeline>,
}

/// The open compute pass, opened if needed.
fn open_pass<'c>(
    enc: &mut wgpu::CommandEncoder,
    pass: &'c mut Option<OpenPass>,
) -> &'c mut OpenPass {
    pass.get_or_insert_with(|| OpenPass {
        pass: enc
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("dynrt kernels"),
                timestamp_writes: None,
            })
            .forget_lifetime(),
        pipeline: None,
    })
}

/// Records `op` into the open compute pass (opening one if needed); returns the dispatches.
/// Nothing is kept for a plan (copies and concatenations that fall back to a kernel).
fn encode_kernel(
    ctx: &mut EncodeCtx<'_, '_>,
    op: &Op,
    ins: &[Operand<'_>],
    out: &Operand<'_>,
) -> Result<usize, String> {
    let open = open_pass(ctx.enc, ctx.pass);
    // `encode` sets its own pipelines: which one is bound afterwards is not tracked.
    open.pipeline = None;
    ctx.kernels
        .encode(&mut open.pass, ctx.uniforms, op, ins, out)
        .map_err(|e| e.to_string())
}

/// [`encode_kernel`] for a [`DispatchPlan`]: also returns the dispatches as recorded, and
/// skips `set_pipeline` when the pass already holds the pipeline.
fn encode_recorded(
    ctx: &mut EncodeCtx<'_, '_>,
    op: &Op,
    ins: &[Operand<'_>],
    out: &Operand<'_>,
) -> Result<(usize, Vec<RecordedDispatch>), String> {
    let open = open_pass(ctx.enc, ctx.pass);
    let mut recorder = Recorder {
        current: open.pipeline.take(),
        dispatches: Vec::new(),
    };
    let result =
        ctx.kernels
            .encode_recorded(&mut open.pass, ctx.uniforms, op, ins, out, &mut recorder);
    open.pipeline = recorder.current;
    result
        .map(|n| (n, recorder.dispatches))
        .map_err(|e| e.to_string())
}

/// Records a node's planned dispatches again: the same pipelines, bind groups, workgroups and
/// uniform bytes in fresh slots. Returns false, recording nothing, when a slot lands in
/// another uniform chunk than the bind group binds (the caller then encodes afresh; the slots
/// taken stay unused).
fn replay(ctx: &mut EncodeCtx<'_, '_>, plan: &DispatchPlan) -> bool {
    ctx.offsets.clear();
    for d in &plan.dispatches {
        let (chunk, offset) = ctx.uniforms.push_bytes(&d.params);
        if chunk != &d.uniform_chunk {
            return false;
        }
        ctx.offsets.push(offset);
    }
    let open = open_pass(ctx.enc, ctx.pass);
    for (d, &offset) in plan.dispatches.iter().zip(ctx.offsets.iter()) {
        if open.pipeline.as_ref() != Some(&d.pipeline) {
            open.pass.set_pipeline(&d.pipeline);
            open.pipeline = Some(d.pipeline.clone());
        }
        open.pass.set_bind_group(0, &d.bind_group, &[offset]);
        open.pass
            .dispatch_workgroups(d.workgroups.0, d.workgroups.1, 1);
    }
    true
}

/// What recording one node needs besides the request.
struct EncodeCtx<'a, 'g> {
    enc: &'a mut wgpu::CommandEncoder,
    /// The open compute pass, if any (closed before every copy).
    pass: &'a mut Option<OpenPass>,
    /// Dynamic offsets of a replay (kept to avoid an allocation per node).
    offsets: &'a mut Vec<u32>,
    uniforms: &'a mut UniformArena,
    kernels: &'a mut std::sync::MutexGuard<'g, crate::gpu::kernels::Kernels>,
    host_uploads: &'a mut Vec<(usize, Vec<u8>)>,
}

impl Drop for InferRequest {
    fn drop(&mut self) {
        // The network (and its kernel cache) may outlive this request: its cached bind groups
        // must not keep this request's buffers alive.
        self.net.inner.kernels().forget_bind_groups();
    }
}

fn inner_fixed(inner: &Inner) -> Vec<(String, u64)> {
    inner.fixed.iter().map(|(k, v)| (k.clone(), *v)).collect()
}

fn pad4(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}
