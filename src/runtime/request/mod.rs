//! The GPU executor of a request: a [`RequestState`] on the engine's buffers, plus what only the
//! device needs (dispatch plans, uniform slots, the NaN source of poison mode), the input
//! writes, the encoding of every node into one [`Frame`] and the output readbacks. See
//! [`crate::runtime`] for the design.
//!
//! Files: this one (the request, its inputs, the iteration and the readbacks), `encode` (one
//! node into the frame: poison fill, copies, dispatches), `index_checks` (the device check of
//! gathers whose indices a kernel computes).

mod encode;
mod index_checks;

use super::compile::Role;
use super::network::{Inner, Network};
use super::options::{HostTime, RunOptions, RunStats};
use super::state::{MovedState, RequestState, View};
use super::RunError;
use crate::gpu::kernels::{DispatchPlan, Operand, TensorRef, UniformArena};
use crate::gpu::pool_storage::EngineStorage;
use crate::gpu::{
    AllocError, Buffer, BufferUid, CommandLog, Engine, Frame, ReadTicket, ReadbackRing,
};
use crate::graph::NodeId;
use crate::memory::predictor::{Sizer, SizingSummary};
use crate::memory::regions::Region;
use crate::shape::Shape;
use crate::tensor::HostTensor;
use index_checks::IndexChecks;
use std::sync::Arc;

/// The KV cache of a request, taken out with [`InferRequest::take_states`] and given to a
/// request of a sibling network with [`InferRequest::put_states`]. Dropping it frees the
/// buffers.
pub struct KvStates {
    states: Vec<MovedState<Buffer>>,
    /// The sizer of the sequence (its history goes on in the request that continues it).
    sizer: Sizer,
}

impl std::fmt::Debug for KvStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStates")
            .field("shapes", &self.shapes())
            .finish()
    }
}

impl KvStates {
    /// Shape of each state (rows held along axis 0).
    pub fn shapes(&self) -> Vec<Shape> {
        self.states.iter().map(|s| s.shape.clone()).collect()
    }
}

/// Rows `first..first + rows` of KV-cache state `state` (in the order of the network's
/// states), for [`InferRequest::rows_to_host`] and [`InferRequest::rows_from_host`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRows {
    /// The state.
    pub state: usize,
    /// Its first row.
    pub first: u64,
    /// Rows.
    pub rows: u64,
}

/// Rows of KV-cache states copied to host memory (a `usm_host` buffer, outside the device
/// budget) by [`InferRequest::rows_to_host`]; dropping it frees that memory.
pub struct HostRows {
    buffer: Buffer,
    bytes: u64,
}

impl std::fmt::Debug for HostRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRows")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl HostRows {
    /// Bytes of the rows held.
    pub fn size_bytes(&self) -> u64 {
        self.bytes
    }
}

/// Where an iteration's inputs come from and its outputs go on the device, besides the host
/// ([`InferRequest::submit`]): what lets a decode loop feed the token one step sampled into
/// the next step without the host seeing it first.
#[derive(Debug, Default, Clone)]
pub struct DeviceIo<'a> {
    /// Inputs copied from a device buffer at the start of the iteration, before its first
    /// kernel: `(input label, shape, source buffer, source offset)`. The bytes of the
    /// shape in the input's type are copied (a multiple of 4).
    pub inputs: Vec<(&'a str, Shape, &'a Buffer, u64)>,
    /// Outputs copied into a device buffer at the end of the iteration, after its last
    /// kernel: `(output label, destination buffer, destination offset)`.
    pub outputs: Vec<(&'a str, &'a Buffer, u64)>,
}

/// How one output read by [`InferRequest::submit`] comes back.
#[derive(Debug, Clone)]
struct ReadSpec {
    shape: Shape,
    dtype: crate::shape::DType,
    /// Element bytes and strides of a strided view (compacted on the host), else `None`.
    strided: Option<(u64, Vec<u64>)>,
    /// Bytes of the tensor (contiguous) or of the range a strided view spans.
    bytes: u64,
}

/// An iteration submitted by [`InferRequest::submit`] whose outputs are still on their way:
/// [`InferRequest::collect`] reads them, [`InferRequest::release`] gives them up.
#[derive(Debug)]
pub struct Pending {
    ticket: Option<ReadTicket>,
    reads: Vec<ReadSpec>,
}

/// One stream of inferences on a [`Network`]: its own predictor, pool, activations and
/// KV-cache states. Dropping it frees all of them.
pub struct InferRequest {
    net: Network,
    state: RequestState<EngineStorage>,
    /// The dispatch plan of each kernel node, by position.
    plans: Vec<Option<DispatchPlan>>,
    /// Source of NaN bytes for poison fills.
    nan_source: Option<Buffer>,
    /// Per-dispatch uniform slots of this request's submits (taken while encoding).
    uniforms: Option<UniformArena>,
    /// Whether iterations log their commands ([`InferRequest::log_commands`]).
    log_commands: bool,
    /// The last iteration's command log.
    last_log: Option<CommandLog>,
    /// Per node (processing order), the dispatches of the last logged iteration.
    last_node_dispatches: Vec<u64>,
    /// Inputs kept on the device between iterations ([`InferRequest::keep_input`]).
    kept: Vec<KeptInput>,
    /// The device check of the gathers whose indices a kernel computes (none: no buffer).
    index_checks: Option<IndexChecks>,
    /// Host time of the iterations so far.
    host: HostTime,
    /// The `usm_host` buffers outputs are copied into for the host to read.
    ring: ReadbackRing,
}

/// An input kept on the device between iterations.
#[derive(Clone)]
struct KeptInput {
    label: String,
    tensor: Arc<HostTensor>,
    /// The range (buffer, offset) a submitted iteration wrote its bytes to: while the input's
    /// slot is still that range, iterations write nothing.
    written: Option<(BufferUid, u64)>,
}

impl std::fmt::Debug for InferRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferRequest")
            .field("options", &self.state.options())
            .field("stats", &self.state.stats())
            .finish()
    }
}

fn alloc_err(what: impl Into<String>) -> impl FnOnce(AllocError) -> RunError {
    let what = what.into();
    move |source| match source {
        AllocError::DeviceLost(lost) => RunError::DeviceLost(lost),
        cause => RunError::Alloc { what, cause },
    }
}

/// An engine buffer range as a kernel operand.
fn operand<'a>(v: View<'a, Buffer>) -> Operand<'a> {
    Operand {
        tensor: TensorRef {
            buffer: v.buffer,
            offset_bytes: v.offset_bytes,
            size_bytes: v.size_bytes,
        },
        shape: v.shape,
        dtype: v.dtype,
        strides: v.strides,
        layout: crate::gpu::kernels::WeightLayout::File,
    }
}

/// The operand of node `id`'s output (constants from the network).
fn tensor_of<'a>(
    state: &'a RequestState<EngineStorage>,
    inner: &'a Inner,
    id: NodeId,
) -> Option<Operand<'a>> {
    if let Some(v) = state.view(id) {
        return Some(operand(v));
    }
    let k = inner.compiled.pos(id).index();
    if !state.is_constant(k) {
        return None;
    }
    let (buffer, offset_bytes, size_bytes) = inner.data.constant(id)?;
    Some(Operand {
        tensor: TensorRef {
            buffer,
            offset_bytes,
            size_bytes,
        },
        shape: state.shape(id),
        dtype: inner.compiled.nodes[k].dtype,
        strides: None,
        layout: inner.data.layout(id),
    })
}

impl InferRequest {
    /// A request on `network`. Allocates the static arena (planner on) or acquires the static
    /// outputs from the pool in descending order of size (planner off).
    ///
    /// # Errors
    /// [`RunError::OutOfMemory`] when the static memory does not fit.
    pub fn new(network: &Network, options: RunOptions) -> Result<InferRequest, RunError> {
        let inner = &network.inner;
        let engine = &inner.engine;
        engine.gpu().check_alive()?;
        let state = RequestState::new(
            Arc::clone(&inner.compiled),
            options,
            EngineStorage::new(engine.clone()).in_region(Region::Internal),
            EngineStorage::new(engine.clone()).in_region(Region::Placeholders),
            Arc::clone(&inner.placeholders),
        )?;
        let n = inner.compiled.nodes.len();
        Ok(InferRequest {
            net: network.clone(),
            state,
            plans: (0..n).map(|_| None).collect(),
            nan_source: None,
            uniforms: Some(UniformArena::new(engine)),
            log_commands: false,
            last_log: None,
            last_node_dispatches: Vec::new(),
            kept: Vec::new(),
            index_checks: IndexChecks::new(engine, &inner.compiled)?,
            host: HostTime::default(),
            ring: ReadbackRing::new(engine),
        })
    }

    /// The network.
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// Counters since creation.
    pub fn stats(&self) -> RunStats {
        self.state.stats()
    }

    /// Host time of the iterations so far: shape updates and sizing, then encoding and the
    /// submit (not the GPU's work nor the readbacks).
    pub fn host_time(&self) -> HostTime {
        self.host
    }

    /// The request's options.
    pub fn options(&self) -> RunOptions {
        self.state.options()
    }

    /// The sizing decisions of this request (and of the sequence it continues): what
    /// `dynrt-bench predict` gives when it replays [`InferRequest::sizing_trace`].
    pub fn sizing(&self) -> SizingSummary {
        self.state.sizer().summary()
    }

    /// The shape trace of every sizing decision (`id,dtype,shape` CSV), when
    /// [`RunOptions::trace`] is on.
    pub fn sizing_trace(&self) -> Option<&str> {
        self.state.sizer().trace()
    }

    /// Logs every command of the following iterations (dispatches with their pipelines, bind
    /// groups and uniform bytes; copies; queue writes): [`InferRequest::take_command_log`]
    /// gives the last one. For benchmarks that replay the same work with plain wgpu calls.
    pub fn log_commands(&mut self, on: bool) {
        self.log_commands = on;
        if !on {
            self.last_log = None;
        }
    }

    /// The command log of the last iteration, when logging.
    pub fn take_command_log(&mut self) -> Option<CommandLog> {
        self.last_log.take()
    }

    /// The dispatches each node recorded in the last iteration, by label, in processing
    /// order (nodes that dispatched nothing included), when logging
    /// ([`InferRequest::log_commands`]); empty otherwise.
    pub fn node_dispatches(&self) -> Vec<(&str, u64)> {
        let c = &self.net.inner.compiled;
        self.last_node_dispatches
            .iter()
            .zip(&c.nodes)
            .map(|(&n, node)| (c.graph.node(node.id).label.as_str(), n))
            .collect()
    }

    /// Rows currently held by each state (the past length of the KV cache).
    pub fn state_shapes(&self) -> Vec<Shape> {
        self.state.state_shapes()
    }

    /// Bytes the KV cache's buffers reserve (the rows held plus the room preallocated for
    /// growth), summed over the states.
    pub fn state_reserved_bytes(&self) -> u64 {
        self.state.state_reserved_bytes()
    }

    /// Drops the oldest `rows` rows of KV-cache state `state` (in the order of the
    /// network's states): see [`crate::runtime::StateBinding`]. The next iteration moves the
    /// kept rows into a buffer of their own (one copy of what is kept) and frees the old
    /// one; a sliding-window layer keeps its cache bounded this way.
    ///
    /// # Errors
    /// [`RunError::BadState`] when there is no such state or it holds fewer rows; nothing
    /// changes then.
    pub fn drop_state_front(&mut self, state: usize, rows: u64) -> Result<(), RunError> {
        self.state.drop_state_front(state, rows)
    }

    /// Bytes of each KV-cache state's buffer (rows held plus room), in state order.
    pub fn state_buffer_bytes(&self) -> Vec<u64> {
        self.state.state_buffer_bytes()
    }

    /// Takes the KV cache out of this request (which then starts a new sequence) to continue
    /// it on a request of a network specialised from the same graph
    /// ([`Network::specialize`]): no copy, the buffers move.
    pub fn take_states(&mut self) -> KvStates {
        let (states, sizer) = self.state.take_states();
        self.forget_freed();
        KvStates { states, sizer }
    }

    /// Continues the sequence held in `states` (from [`InferRequest::take_states`]). A
    /// request that has not run yet also continues the sequence's sizing: its predictor
    /// history, ledger, summary and trace ([`InferRequest::sizing`]).
    ///
    /// # Errors
    /// [`RunError::BadState`] when the number of states or their row shapes differ; the
    /// request is unchanged then.
    pub fn put_states(&mut self, states: KvStates) -> Result<(), RunError> {
        self.state.put_states(states.states, states.sizer)?;
        self.forget_freed();
        Ok(())
    }

    /// Copies `ranges` of the states' rows to host memory, packed in order (one submit,
    /// ordered after every iteration submitted so far): what a paged KV cache offloads.
    /// The device rows are unchanged; the caller may reuse them once this returns.
    ///
    /// # Errors
    /// [`RunError::BadState`] for a range the state does not hold in one run of rows;
    /// [`RunError::Alloc`] when the host buffer cannot be had. Nothing is copied then.
    pub fn rows_to_host(&self, ranges: &[StateRows]) -> Result<HostRows, RunError> {
        let mut copies = Vec::with_capacity(ranges.len());
        for r in ranges {
            copies.push(self.state.state_rows(r.state, r.first, r.rows)?);
        }
        let bytes = copies.iter().map(|c| c.2).sum();
        let buffer = self
            .engine()
            .copy_to_host("dynrt offloaded rows", &copies)
            .map_err(alloc_err("offloading KV rows to the host"))?;
        Ok(HostRows { buffer, bytes })
    }

    /// Writes rows from `host` (packed as [`InferRequest::rows_to_host`] copied them) into
    /// `ranges` of the states, which may be other rows than those copied: the writes land
    /// before the next iteration's work.
    ///
    /// # Errors
    /// [`RunError::BadState`] for a range the state does not hold; [`RunError::BadInput`]
    /// when the ranges do not hold exactly `host`'s bytes; [`RunError::Alloc`] when the host
    /// memory cannot be mapped. Nothing is written then.
    pub async fn rows_from_host(
        &self,
        host: &HostRows,
        ranges: &[StateRows],
    ) -> Result<(), RunError> {
        let mut writes = Vec::with_capacity(ranges.len());
        let mut at = 0u64;
        for r in ranges {
            let (buffer, offset, len) = self.state.state_rows(r.state, r.first, r.rows)?;
            writes.push((at, buffer, offset, len));
            at += len;
        }
        if at != host.bytes {
            return Err(RunError::BadInput {
                input: "host rows".into(),
                reason: format!("the ranges hold {at} bytes, the host rows {}", host.bytes),
            });
        }
        self.engine()
            .write_from_host(&host.buffer, &writes)
            .await
            .map_err(alloc_err("restoring KV rows from the host"))
    }

    /// Frees the buffer of every node output (the states, the constants and the static arena
    /// stay): after an iteration failed for lack of memory ([`RunError::OutOfMemory`]), so
    /// that the next one, smaller, allocates for its own shapes only instead of keeping
    /// those sized for the one that failed. The next iteration infers every node again. The
    /// buffer a submit packs its host writes into goes too: it is made only where it fits,
    /// after the iteration's own buffers, and held on it would take memory from them.
    pub fn release_outputs(&mut self) {
        self.state.release_outputs();
        if let Some(uniforms) = &mut self.uniforms {
            uniforms.release_upload();
        }
        for plan in &mut self.plans {
            *plan = None;
        }
        self.forget_freed();
    }

    /// Sizes the request's buffers for an iteration with `inputs` without running it: every
    /// node's shape is inferred and its buffer allocated (the pool packing them) as
    /// [`InferRequest::infer`] would, and nothing is encoded or submitted. An iteration whose
    /// outputs fit what is held then reallocates nothing. A caller that knows the largest
    /// shapes to come sizes for them once instead of growing buffer by buffer, without paying
    /// an iteration at those shapes.
    ///
    /// # Errors
    /// As [`InferRequest::infer`]'s checks of its inputs and its allocations (nothing was
    /// submitted; the request stays usable); [`RunError::DeviceLost`].
    pub fn reserve(&mut self, inputs: &[(&str, &HostTensor)]) -> Result<(), RunError> {
        self.engine().gpu().check_alive()?;
        let reserved = self.state.reserve(inputs);
        for plan in &mut self.plans {
            *plan = None;
        }
        self.forget_freed();
        reserved
    }

    /// Forgets the states (a new sequence starts); their buffers are kept for reuse.
    pub fn reset_states(&mut self) {
        self.state.reset_states();
    }

    /// Keeps `tensor` as input `label` on the device: iterations may leave the input out and
    /// then use this value, written to the device once (by the next iteration) rather than at
    /// every iteration, as long as its buffer stays the same. An iteration that gives the
    /// input replaces the kept value. ONNX Runtime's IO binding of a device tensor does the
    /// same for its callers.
    ///
    /// # Errors
    /// [`RunError::BadInput`] for a label that is not an input, a state's past (the request
    /// keeps those itself) or a tensor of the wrong type or size; nothing changes then.
    pub fn keep_input(&mut self, label: &str, tensor: HostTensor) -> Result<(), RunError> {
        if self.state.check_input(label, &tensor)?.is_some() {
            return Err(RunError::BadInput {
                input: label.to_string(),
                reason: "the past of a state: the request keeps its rows on the device already"
                    .into(),
            });
        }
        let kept = KeptInput {
            label: label.to_string(),
            tensor: Arc::new(tensor),
            written: None,
        };
        match self.kept.iter_mut().find(|k| k.label == label) {
            Some(k) => *k = kept,
            None => self.kept.push(kept),
        }
        Ok(())
    }

    /// Stops keeping input `label` (its value is forgotten: iterations must give it again).
    /// Returns whether it was kept.
    pub fn release_input(&mut self, label: &str) -> bool {
        let before = self.kept.len();
        self.kept.retain(|k| k.label != label);
        self.kept.len() != before
    }

    /// The inputs kept on the device, in the order they were first kept.
    pub fn kept_inputs(&self) -> impl Iterator<Item = &str> {
        self.kept.iter().map(|k| k.label.as_str())
    }

    fn engine(&self) -> &Engine {
        &self.net.inner.engine
    }

    /// Drops the cached bind groups and dispatch plans that bind a buffer the request state freed
    /// (or handed away): they hold the buffers they bind, and a freed buffer must really leave.
    fn forget_freed(&mut self) {
        let gone: Vec<BufferUid> = self.state.take_freed().into_iter().map(BufferUid).collect();
        if gone.is_empty() {
            return;
        }
        self.net.inner.kernels().forget_bind_groups_binding(&gone);
        for plan in &mut self.plans {
            if plan.as_ref().is_some_and(|p| p.binds_any(&gone)) {
                *plan = None;
            }
        }
    }

    /// Runs one iteration with `inputs` (every network input except the states' pasts) and
    /// returns the outputs named in `read`, in that order. One submit for all the work, then
    /// one readback per output read.
    ///
    /// # Errors
    /// [`RunError::BadInput`] / [`RunError::Graph`] for inputs that do not fit the graph;
    /// [`RunError::OutOfMemory`] naming the node whose output cannot be allocated (the request
    /// stays usable: states are unchanged and nothing was submitted);
    /// [`RunError::UnknownOutput`]; [`RunError::Alloc`] for readback failures;
    /// [`RunError::DeviceLost`] once the device is lost (at once, without touching it).
    pub async fn infer(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        read: &[&str],
    ) -> Result<Vec<HostTensor>, RunError> {
        let gpu = self.engine().gpu().clone();
        gpu.check_alive()?;
        self.infer_inner(inputs, read)
            .await
            .map_err(|e| e.or_lost(&gpu))
    }

    async fn infer_inner(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        read: &[&str],
    ) -> Result<Vec<HostTensor>, RunError> {
        // The outputs are read where they are once the iteration has run (mapped, or copied
        // through a readback buffer freed at once): a request that waits for each iteration
        // keeps no readback ring.
        let pending = self.submit(inputs, &DeviceIo::default(), &[]).await?;
        self.release(pending);
        let mut out = Vec::with_capacity(read.len());
        for label in read {
            out.push(self.read_output(label).await?);
        }
        Ok(out)
    }

    /// Runs one iteration as [`InferRequest::infer`] does, without waiting for the device:
    /// the iteration is encoded and submitted, the outputs named in `read` are copied on the
    /// GPU into the request's readback ring, and [`InferRequest::collect`] reads them later,
    /// waiting only for this iteration (not for ones submitted after it): nothing in it waits
    /// for the device (natively; in the browser the submit's validation scope resolves
    /// later). `io` wires inputs
    /// and outputs to device buffers ([`DeviceIo`]). A decode loop submits step N + 1 before
    /// it collects step N.
    ///
    /// The promise of [`InferRequest::infer`] holds for each submit: on error nothing of this
    /// iteration is submitted and the KV cache is as the iterations submitted before left
    /// it (their outputs can still be collected).
    ///
    /// # Errors
    /// As [`InferRequest::infer`], and [`RunError::BadInput`] for a device input that is not
    /// an input of the network or an output that is not one of its outputs.
    pub async fn submit(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        io: &DeviceIo<'_>,
        read: &[&str],
    ) -> Result<Pending, RunError> {
        let gpu = self.engine().gpu().clone();
        gpu.check_alive()?;
        // Device inputs take a shape for the shape pass and no host bytes.
        let mut fed: Vec<(&str, HostTensor)> = Vec::with_capacity(io.inputs.len());
        for &(label, ref shape, _, _) in &io.inputs {
            let compiled = &self.net.inner.compiled;
            let dtype = compiled
                .graph
                .find(label)
                .map(|id| compiled.graph.node(id).dtype)
                .ok_or_else(|| RunError::BadInput {
                    input: label.to_string(),
                    reason: "not an input of the network".into(),
                })?;
            let bytes = shape.size_bytes(dtype)? as usize;
            fed.push((
                label,
                HostTensor {
                    shape: shape.clone(),
                    dtype,
                    bytes: vec![0; bytes],
                },
            ));
        }
        let mut all: Vec<(&str, &HostTensor)> = inputs.to_vec();
        all.extend(fed.iter().map(|(l, t)| (*l, t)));
        // A snapshot (the tensors shared), so the iteration may borrow the request mutably; a
        // kept input given in `inputs` takes the given value (kept from now on if it runs).
        let kept: Vec<KeptInput> = self
            .kept
            .iter()
            .map(|k| match all.iter().find(|(l, _)| *l == k.label) {
                Some(&(_, t)) => KeptInput {
                    label: k.label.clone(),
                    tensor: Arc::new(t.clone()),
                    written: None,
                },
                None => k.clone(),
            })
            .collect();
        let result = self.run_iteration(&all, &kept, io, read).await;
        match &result {
            Ok((written, _)) => {
                for ((k, now), w) in self.kept.iter_mut().zip(kept).zip(written) {
                    k.tensor = now.tensor;
                    if w.is_some() {
                        k.written = *w;
                    }
                }
            }
            Err(_) => {
                self.state.abort();
                for plan in &mut self.plans {
                    *plan = None;
                }
                // Nothing was submitted (or it failed): write the kept inputs again.
                for k in &mut self.kept {
                    k.written = None;
                }
            }
        }
        self.forget_freed();
        result
            .map(|(_, pending)| pending)
            .map_err(|e| e.or_lost(&gpu))
    }

    /// The outputs of a submitted iteration ([`InferRequest::submit`]), in the order they
    /// were named, once it has run on the device.
    ///
    /// # Errors
    /// [`RunError::Alloc`] when the readback fails.
    pub async fn collect(&mut self, pending: Pending) -> Result<Vec<HostTensor>, RunError> {
        let Some(ticket) = pending.ticket else {
            return Ok(pending
                .reads
                .into_iter()
                .map(|r| HostTensor {
                    shape: r.shape,
                    dtype: r.dtype,
                    bytes: Vec::new(),
                })
                .collect());
        };
        let data = self
            .ring
            .read(ticket)
            .await
            .map_err(alloc_err("reading outputs"))?;
        Ok(pending
            .reads
            .into_iter()
            .zip(data)
            .map(|(r, mut bytes)| {
                let bytes = match &r.strided {
                    Some((elem, strides)) => {
                        super::state::compact(&bytes, &r.shape, strides, *elem)
                    }
                    None => {
                        bytes.truncate(r.bytes as usize);
                        bytes
                    }
                };
                HostTensor {
                    shape: r.shape,
                    dtype: r.dtype,
                    bytes,
                }
            })
            .collect())
    }

    /// Gives up the outputs of a submitted iteration without reading them (the iteration
    /// still runs; its effects on the KV cache stay unless rolled back with
    /// [`InferRequest::drop_rows_back`]).
    pub fn release(&mut self, pending: Pending) {
        if let Some(t) = pending.ticket {
            self.ring.release(t);
        }
    }

    /// Forgets the newest `rows` rows of every KV-cache state: a pipelined decode loop
    /// rolls back the step it submitted after a stop token. The rows' bytes stay in the
    /// buffers until the next iteration writes over them (commands already submitted that
    /// write them run before any later one).
    ///
    /// # Errors
    /// [`RunError::BadState`] when a state holds fewer rows or is written in place (a paged
    /// pool); nothing changes then.
    pub fn drop_rows_back(&mut self, rows: u64) -> Result<(), RunError> {
        self.state.drop_rows_back(rows)
    }

    /// Bytes of the readback ring's `usm_host` buffers.
    pub fn readback_bytes(&self) -> u64 {
        self.ring.size_bytes()
    }

    /// One iteration with `inputs` and the `kept` inputs not among them. Returns, for each
    /// kept input, the range its bytes were written to by this iteration (None: not written,
    /// its slot still holds them).
    async fn run_iteration(
        &mut self,
        given: &[(&str, &HostTensor)],
        kept: &[KeptInput],
        io: &DeviceIo<'_>,
        read: &[&str],
    ) -> Result<(Vec<Option<(BufferUid, u64)>>, Pending), RunError> {
        let inner = Arc::clone(&self.net.inner);
        let compiled = &inner.compiled;
        let mut inputs: Vec<(&str, &HostTensor)> = given.to_vec();
        for k in kept {
            if !given.iter().any(|(l, _)| *l == k.label) {
                inputs.push((&k.label, &k.tensor));
            }
        }
        let inputs = &inputs[..];
        let started = web_time::Instant::now();
        // Phase 1 (device-free): update_shape and realloc_if_needed for every node.
        self.state.prepare(inputs)?;
        inner.data.weights().begin_iteration();
        let prepared = web_time::Instant::now();
        self.forget_freed();
        for (k, plan) in self.plans.iter_mut().enumerate() {
            if self.state.reinferred(k) {
                *plan = None;
            }
        }

        // Inputs: written before the submit that reads them. usm_shared buffers are mapped
        // and written directly (now); device buffers through the queue when the frame is
        // submitted (a queue write lands at the start of the next submit: nothing earlier
        // reads these buffers).
        // A kept input is written only when its slot is not the range written last time.
        let mut queued: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut written = vec![None; kept.len()];
        let mut input_bytes = 0u64;
        for &(label, t) in inputs {
            let Some(id) = compiled.graph.find(label) else {
                continue;
            };
            let k = compiled.pos(id).index();
            // A state's past given by the caller is written by its concat node, row block by
            // row block into the padded cache (`upload_writes`); written here too, whole at
            // the cache's start, it would be a second copy of every fed cache in the staging,
            // in the wrong layout, that only the order of the queue writes overwrites.
            if t.bytes.is_empty()
                || matches!(compiled.nodes[k].role, Role::Input { state: Some(_) })
                || io.inputs.iter().any(|d| d.0 == label)
            {
                continue;
            }
            let (buf, off) = self
                .state
                .slot_buffer(k)
                .ok_or_else(|| RunError::BadInput {
                    input: label.to_string(),
                    reason: "no buffer".into(),
                })?;
            if let Some(i) = kept.iter().position(|x| x.label == label) {
                if kept[i].written == Some((buf.uid(), off)) {
                    continue;
                }
                written[i] = Some((buf.uid(), off));
            }
            let bytes = pad4(&t.bytes);
            input_bytes += bytes.len() as u64;
            // Through the queue whatever the kind: mapping a usm_shared input would wait
            // for every submitted iteration that still reads it.
            queued.push((k, bytes));
        }
        let reads = self.read_specs(read)?;
        let out_copies = self.output_copies(io)?;

        // Phase 2: encode every dispatch and copy, in processing order, into one frame.
        self.ensure_nan_source()?;
        let engine = self.engine().clone();
        let uniforms = match self.uniforms.take() {
            Some(u) => u,
            None => UniformArena::new(&engine),
        };
        let submitted = {
            let mut kernels = inner.kernels();
            let mut frame = Frame::begin(&engine, &mut kernels, uniforms, "dynrt iteration");
            if self.log_commands {
                frame.log_commands();
            }
            for (k, bytes) in queued {
                if let Some((buf, off)) = self.state.slot_buffer(k) {
                    frame.write_before_submit(buf, off, bytes);
                }
            }
            if let Some(checks) = &self.index_checks {
                let bytes = checks.buffer.size_bytes() as usize;
                frame.write_before_submit(&checks.buffer, 0, vec![0; bytes]);
            }
            for &(label, ref shape, src, src_offset) in &io.inputs {
                let (k, dtype) = self.node_of(label)?;
                let bytes = shape.size_bytes(dtype)?.div_ceil(4) * 4;
                if let Some((buf, off)) = self.state.slot_buffer(k) {
                    if bytes > 0 {
                        frame.copy(src, src_offset, buf, off, bytes);
                    }
                }
            }
            let mut encoded = Ok(());
            let mut node_dispatches = Vec::new();
            for k in 0..compiled.nodes.len() {
                let before = self.state.stats().dispatches;
                if let Err(e) = self.encode_node(&inner, k, &mut frame) {
                    encoded = Err(e);
                    break;
                }
                if self.log_commands {
                    node_dispatches.push(self.state.stats().dispatches - before);
                }
            }
            self.last_node_dispatches = node_dispatches;
            if let Err(e) = encoded {
                self.uniforms = Some(frame.abandon());
                return Err(e);
            }
            for &(k, dst, dst_offset, bytes) in &out_copies {
                if let Some((buf, off)) = self.state.slot_buffer(k) {
                    frame.copy(buf, off, dst, dst_offset, bytes);
                }
            }
            let mut ranges: Vec<(&Buffer, u64, u64)> = Vec::with_capacity(reads.len());
            for (k, spec) in &reads {
                if let Some((buf, off)) = self.state.slot_buffer(*k) {
                    ranges.push((buf, off, spec.bytes.div_ceil(4) * 4));
                }
            }
            let ticket = if ranges.len() == reads.len() && !ranges.is_empty() {
                match self.ring.record(&mut frame, &ranges) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        self.uniforms = Some(frame.abandon());
                        return Err(alloc_err("the readback ring")(e));
                    }
                }
            } else {
                None
            };
            let (submitted, uniforms, log) = frame.submit();
            self.uniforms = Some(uniforms);
            self.last_log = log;
            (submitted, ticket)
        };
        let (submitted, mut ticket) = submitted;
        if let Some(t) = ticket.as_mut() {
            self.ring.seal(t, &submitted);
        }
        let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let (finish_ns, submit_ns) = submitted.host_ns();
        self.host.iterations += 1;
        self.host.prepare_ns += nanos(prepared.duration_since(started));
        self.host.encode_ns += nanos(prepared.elapsed()).saturating_sub(finish_ns + submit_ns);
        self.host.finish_ns += finish_ns;
        self.host.submit_ns += submit_ns;
        submitted.check().await.map_err(|reason| RunError::Kernel {
            node: "(iteration)".into(),
            op: "submit",
            reason,
        })?;
        self.read_index_checks().await?;
        let stats = self.state.stats_mut();
        stats.submits += 1;
        stats.input_bytes_written += input_bytes;
        self.state.commit();
        Ok((
            written,
            Pending {
                ticket,
                reads: reads.into_iter().map(|(_, r)| r).collect(),
            },
        ))
    }

    /// Position and type of network node `label`.
    fn node_of(&self, label: &str) -> Result<(usize, crate::shape::DType), RunError> {
        let compiled = &self.net.inner.compiled;
        let id = compiled
            .graph
            .find(label)
            .ok_or_else(|| RunError::BadInput {
                input: label.to_string(),
                reason: "not a node of the network".into(),
            })?;
        let k = compiled.pos(id).index();
        Ok((k, compiled.nodes[k].dtype))
    }

    /// The device copies of `io.outputs`: `(node, destination, offset, bytes)`.
    fn output_copies<'b>(
        &self,
        io: &DeviceIo<'b>,
    ) -> Result<Vec<(usize, &'b Buffer, u64, u64)>, RunError> {
        let compiled = &self.net.inner.compiled;
        let mut out = Vec::with_capacity(io.outputs.len());
        for &(label, dst, offset) in &io.outputs {
            let id = compiled
                .graph
                .find(label)
                .filter(|id| compiled.graph.outputs().contains(id))
                .ok_or_else(|| RunError::UnknownOutput {
                    label: label.to_string(),
                })?;
            let k = compiled.pos(id).index();
            let bytes = self.state.shape(id).size_bytes(compiled.nodes[k].dtype)?;
            out.push((k, dst, offset, bytes.div_ceil(4) * 4));
        }
        Ok(out)
    }

    /// How each output of `read` comes back after this iteration: `(node, spec)`.
    fn read_specs(&self, read: &[&str]) -> Result<Vec<(usize, ReadSpec)>, RunError> {
        let compiled = &self.net.inner.compiled;
        let mut out = Vec::with_capacity(read.len());
        for label in read {
            let id = compiled
                .graph
                .find(label)
                .filter(|id| compiled.graph.outputs().contains(id))
                .ok_or_else(|| RunError::UnknownOutput {
                    label: label.to_string(),
                })?;
            let k = compiled.pos(id).index();
            let dtype = compiled.nodes[k].dtype;
            let shape = self.state.shape(id).clone();
            let bytes = shape.size_bytes(dtype)?;
            let strides = self
                .state
                .view(id)
                .and_then(|v| v.strides)
                .filter(|s| !crate::gpu::kernels::layout::is_row_major(&shape, s))
                .map(<[u64]>::to_vec);
            let spec = match (strides, self.state.slot_buffer(k)) {
                (Some(strides), Some((buf, off))) if bytes > 0 => {
                    let elem = bytes / shape.checked_num_elements().unwrap_or(1).max(1);
                    let last: u64 = shape
                        .dims()
                        .iter()
                        .zip(&strides)
                        .map(|(&d, &s)| d.saturating_sub(1) * s)
                        .sum();
                    let span = ((last + 1) * elem).div_ceil(4) * 4;
                    let span = span.min(buf.size_bytes().saturating_sub(off) / 4 * 4);
                    ReadSpec {
                        shape,
                        dtype,
                        strided: Some((elem, strides)),
                        bytes: span,
                    }
                }
                _ => ReadSpec {
                    shape,
                    dtype,
                    strided: None,
                    bytes,
                },
            };
            out.push((k, spec));
        }
        Ok(out)
    }

    /// Reads an output of the last iteration (a state's present included).
    ///
    /// # Errors
    /// [`RunError::UnknownOutput`]; [`RunError::Alloc`] when the readback fails.
    pub async fn read_output(&self, label: &str) -> Result<HostTensor, RunError> {
        let compiled = &self.net.inner.compiled;
        let id = compiled
            .graph
            .find(label)
            .filter(|id| compiled.graph.outputs().contains(id))
            .ok_or_else(|| RunError::UnknownOutput {
                label: label.to_string(),
            })?;
        let k = compiled.pos(id).index();
        let dtype = compiled.nodes[k].dtype;
        let shape = self.state.shape(id).clone();
        let bytes = shape.size_bytes(dtype)?;
        if bytes == 0 {
            return Ok(HostTensor {
                shape,
                dtype,
                bytes: Vec::new(),
            });
        }
        let (buf, off) = self
            .state
            .slot_buffer(k)
            .ok_or_else(|| RunError::UnknownOutput {
                label: label.to_string(),
            })?;
        let strides = self
            .state
            .view(id)
            .and_then(|v| v.strides)
            .filter(|s| !crate::gpu::kernels::layout::is_row_major(&shape, s))
            .map(<[u64]>::to_vec);
        let Some(strides) = strides else {
            let data = self
                .engine()
                .read(buf, off, bytes)
                .await
                .map_err(alloc_err(format!("reading output `{label}`")))?;
            return Ok(HostTensor {
                shape,
                dtype,
                bytes: data,
            });
        };
        // A strided view (a padded KV cache): read the range it spans, keep its elements.
        let elem = bytes / shape.checked_num_elements().unwrap_or(1).max(1);
        let last: u64 = shape
            .dims()
            .iter()
            .zip(&strides)
            .map(|(&d, &s)| d.saturating_sub(1) * s)
            .sum();
        let span = ((last + 1) * elem).div_ceil(4) * 4;
        let span = span.min(buf.size_bytes().saturating_sub(off));
        let data = self
            .engine()
            .read(buf, off, span)
            .await
            .map_err(alloc_err(format!("reading output `{label}`")))?;
        Ok(HostTensor {
            bytes: super::state::compact(&data, &shape, &strides, elem),
            shape,
            dtype,
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

impl Drop for InferRequest {
    fn drop(&mut self) {
        // The network (and its kernel cache) may outlive this request: its cached bind groups
        // must not keep this request's buffers alive.
        self.net.inner.kernels().forget_bind_groups();
    }
}

fn pad4(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.resize(v.len().div_ceil(4) * 4, 0);
    v
}
