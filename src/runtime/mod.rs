//! The runtime: a graph compiled for a device ([`Network`]) and the per-iteration loop of a
//! dynamic-shape inference ([`InferRequest`]), plus the built-in decoder demo ([`demo`]).
//!
//! # Network: compiled once, shared
//!
//! [`Network::compile`] takes a [`crate::graph::Graph`] and an [`crate::gpu::Engine`]:
//!
//! * **Constants in two phases** (`reference/openvino-gpu-memory-allocation.md`, "Constant
//!   memory allocation"): every constant is first written into a `usm_host` staging buffer;
//!   once the processing order is fixed and the users of each constant are known to be GPU
//!   kernels, a `usm_device` buffer is allocated for it, the staging bytes are copied there in
//!   one submit and the staging buffers are freed. The history therefore shows the
//!   `Allocate ... usm_host` / `Free ... usm_host` pair per constant. The device copies live in
//!   an `Arc` shared by every request of the network (weights are read-only).
//! * **Memory dependencies once**: the basic pass plus lifetime overlap
//!   ([`crate::graph::deps`]). The reference adds the "skipped branch" pass to the basic one
//!   for the same reason: a node processed between a tensor's producer and its last user must
//!   not take that tensor's memory, or an in-order queue would overwrite a live value.
//! * **Static outputs**: nodes whose output shape is fully known at compile time (no symbolic
//!   dimension left after the network's bindings) are either packed by the static planner
//!   into one arena buffer ([`crate::memory::planner`], offsets aligned to
//!   `min_storage_buffer_offset_alignment`, DESIGN §6) or, with the planner off, acquired from
//!   the request's pool in descending order of size. Activations belong to a request, never
//!   to the network: two requests may run interleaved and must not share them.
//!
//! # InferRequest: one per stream of inferences
//!
//! A request owns a [`crate::memory::predictor::ShapePredictor`], a memory pool over the
//! engine, its activation buffers and its *states* (the KV cache). One call to
//! [`InferRequest::infer`] runs one iteration, DESIGN §3, for each node in processing order:
//!
//! 1. `update_shape` — compare the input shapes with those the node saw last time; equal:
//!    skip (counted in [`RunStats::shape_updates_skipped`]); otherwise [`crate::graph::Op::infer`].
//! 2. `update_impl` — the kernel's pipeline comes from the cache of
//!    [`crate::gpu::kernels::Kernels`], keyed by family, entry point and specialisation
//!    constant (never by shape: shapes travel in per-dispatch uniforms, so one pipeline serves
//!    every shape). The kernel picks the entry from the concrete shapes (a `vec4` variant when
//!    sizes allow), so the lookup happens when the dispatch is recorded; hits and misses are
//!    counted there.
//! 3. `realloc_if_needed` — if the node's buffer holds the new output, reuse it (and still
//!    record the shape in the predictor); otherwise ask the predictor, check
//!    `can_preallocate` against the engine's limits and budget, and take a buffer of the
//!    predicted size from the pool (or the engine with the pool off). A preallocation that
//!    fails for lack of memory falls back to the exact size; a buffer is never smaller than
//!    the actual output. The adaptive policy may also shrink a buffer that stays mostly empty.
//! 4. `dispatch` — encode the kernel on the node's buffers with the actual byte ranges. A
//!    kernel node keeps what it recorded (pipeline, bind group, uniform bytes, workgroups) as
//!    its *dispatch plan*; while update_shape skips the node and its operands are the same
//!    buffer ranges, the plan is replayed (a uniform slot, `set_bind_group`, `dispatch`, and
//!    `set_pipeline` only when the pass holds another pipeline), without the shape checks,
//!    parameter computation and cache lookups ([`RunStats::dispatches_replayed`]; replayed
//!    dispatches count as pipeline cache hits). Plans hold their buffers, so when the request
//!    frees or replaces a buffer it drops the plans and cached bind groups that bind it.
//!
//! All dispatches of one iteration go into one command encoder and one submit. wgpu executes
//! one queue in order and inserts the barriers between passes and copies, so a buffer that
//! the pool hands from one node to a later one (their lifetimes do not overlap) is only
//! written after its previous user's commands. The one hazard wgpu does not order for us is
//! `queue.write_buffer`: it lands at the start of the *next* submit, before every command of
//! that submit. The runtime therefore only uses it for network inputs (read by the commands
//! of the same submit, written by nothing on the device) and never for pooled buffers; the
//! `DYNRT_POISON` fill is encoded as a copy command in order.
//!
//! # The KV cache: in-place concatenation
//!
//! A *state* pairs a graph input (`past_k`, `[t, dim]`) with a graph output (`present_k`)
//! produced by a `Concat` along axis 0 of that input and the step's new rows. The request
//! keeps one buffer per state, preallocated with room from the predictor. The concat node
//! does not run a kernel: its output *is* the state buffer, and the step copies only the new
//! slice to the end of it. When the buffer is too small, a larger one is allocated and the old
//! contents are copied into it once, in the same submit, before the new slice.
//!
//! # Inputs and outputs
//!
//! Network inputs and outputs use `usm_shared` when the adapter maps storage buffers
//! (`MAPPABLE_PRIMARY_BUFFERS`, e.g. lavapipe), and `usm_device` with `usm_host` staging
//! otherwise (GL, the browser).
//!
//! # Poison
//!
//! With `DYNRT_POISON=1` (or [`RunOptions::poison`]) every buffer handed out for reuse or
//! preallocation is filled with NaN (all bits set) before the node writes it. A kernel that
//! reads bytes it did not write, or a range computed wrongly, then shows up as NaN in the
//! outputs; correct code gives identical results with it on.

mod compile;
pub mod demo;
mod error;
pub mod model;
mod network;
mod options;
pub mod report;
mod request;
mod session;

pub use crate::tensor::HostTensor;
pub use compile::{NetworkOptions, StateBinding};
pub use error::RunError;
pub use network::Network;
pub use options::{RunOptions, RunStats};
pub use request::{InferRequest, KvStates};
