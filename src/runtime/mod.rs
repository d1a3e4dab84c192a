//! The runtime: a graph compiled for a device ([`Network`]) and the per-iteration loop of a
//! dynamic-shape inference ([`InferRequest`]). The built-in decoder demo ([`crate::demo`]) and
//! the language models ([`crate::llm`]) are its users.
//!
//! Files: `compile.rs` (the device-free plan: roles, states, static shapes, memory
//! dependencies, the arena plan), `network.rs` (the device half: the data region, the
//! kernels' dtype check), `state/` (the device-free per-iteration state: update_shape,
//! sizing through [`crate::memory::predictor::Sizer`], and in `state/kv.rs` the KV-cache
//! states; generic over a storage and property-tested on host memory), `request/` (the thin
//! GPU executor: input writes, one [`crate::gpu::Frame`] per iteration, readbacks),
//! `placeholders.rs` (the placeholder pool), [`report`].
//!
//! # Network: compiled once, shared
//!
//! [`Network::compile`] takes a [`crate::graph::Graph`] and an [`crate::gpu::Engine`]:
//!
//! * **Kernels' dtype rules**: every node the device computes must have a kernel for its
//!   element types ([`crate::gpu::kernels::Kernel::check_dtypes`]); otherwise compiling fails
//!   with [`RunError::UnsupportedDType`] naming the node, before anything is allocated.
//! * **Device regions** (docs/design.md, "Memory pool and static planner"), each
//!   counted by the engine ([`crate::memory::accounting::MemoryStats::regions`], reported by
//!   `dynrt demo --json` and drawn by `--report`):
//!   - *constants*: the weights of the network family (shared by [`Network::specialize`]d
//!     siblings), placed once from the low end of one or more device buffers (the *data
//!     region*, each segment at most the device's largest buffer) and freed with the last
//!     network that uses them. They are uploaded straight from each constant's bytes
//!     ([`crate::tensor::ConstData`], possibly a range of a memory-mapped file) through the
//!     engine's bounded staging chunks: nothing is expanded or copied whole on the host.
//!   - *placeholders*: network inputs and outputs, per inference. Each request is one
//!     inference in flight: it takes slots from its network's placeholder pool and gives them
//!     back when it is dropped; the pool keeps [`NetworkOptions::inflight`] free copies of
//!     each placeholder for the next requests. The KV-cache states (in-outs that outlive an
//!     inference and move between requests) count in this region too.
//!   - *internal*: activations (the static arena of the planner, the memory pool's records),
//!     host values, the per-dispatch uniform slots and the NaN source of poison mode.
//! * **The bidirectional allocator, where it fits on wgpu**: constants from the low end of
//!   the data region and placeholders from the high end, with a typed collision error
//!   ([`crate::memory::regions::RegionError::Collision`]) when they would meet. It fits where
//!   inputs and outputs are plain device memory (`usm_device`: GL, the web): the last segment
//!   keeps room for `inflight` copies of the inputs and outputs whose shapes are static, and a
//!   slot that does not fit (a dynamic shape, a request beyond `inflight`) collides and gets a
//!   buffer of its own. It does not fit where inputs and outputs are `usm_shared` (adapters
//!   with `MAPPABLE_PRIMARY_BUFFERS`): WebGPU maps whole buffers, and a mapped buffer may not
//!   be used by any submitted command, so the host writing one request's inputs would stall
//!   every kernel reading weights from the same buffer; and a mappable usage would force the
//!   weights into host-visible memory on discrete GPUs. There the placeholders are buffers of
//!   their own, pooled the same way. Two wgpu facts shape the region on every adapter: a
//!   buffer cannot grow (its size is fixed when the network compiles, hence the static-shape
//!   reserve), and one buffer is at most `max_buffer_size` (hence the segments).
//! * **Memory dependencies once**: the basic pass plus lifetime overlap
//!   ([`crate::graph::deps`]). The reference adds the "skipped branch" pass to the basic one
//!   for the same reason: a node processed between a tensor's producer and its last user must
//!   not take that tensor's memory, or an in-order queue would overwrite a live value.
//! * **Static outputs**: nodes whose output shape is fully known at compile time (no symbolic
//!   dimension left after the network's bindings) are either packed by the static planner
//!   into one arena buffer ([`crate::memory::planner`], offsets aligned to
//!   `min_storage_buffer_offset_alignment`) or, with the planner off, acquired from
//!   the request's pool in descending order of size. Activations belong to a request, never
//!   to the network: two requests may run interleaved and must not share them.
//! * **Kinds** come from the reference rule ([`crate::gpu::Engine::preferred_kind`]): inputs
//!   and outputs are memory the host locks and kernels bind (`usm_shared` where the adapter
//!   maps storage buffers, else `usm_device` with staging); constants and activations are
//!   kernel memory (`usm_device`).

//! # InferRequest: one per stream of inferences
//!
//! A request owns a [`crate::memory::predictor::Sizer`] (the shape predictor and the ledger
//! of what it sized: the same code `dynrt-bench predict` replays), a memory pool over the engine,
//! its activation buffers, its placeholder slots and its *states* (the KV cache). One call to
//! [`InferRequest::infer`] runs one iteration (docs/design.md) for each node in processing order:
//!
//! 1. `update_shape` — compare the input shapes with those the node saw last time; equal:
//!    skip (counted in [`RunStats::shape_updates_skipped`]); otherwise [`crate::graph::Op::infer`].
//! 2. `update_impl` — the kernel's pipeline comes from the cache of
//!    [`crate::gpu::kernels::Kernels`], keyed by family, entry point and specialisation
//!    constant (never by shape: shapes travel in per-dispatch uniforms, so one pipeline serves
//!    every shape). The kernel picks the entry from the concrete shapes (a `vec4` variant when
//!    sizes allow), so the lookup happens when the dispatch is recorded; hits and misses are
//!    counted there.
//! 3. `realloc_if_needed` — the request's [`crate::memory::predictor::Sizer`] decides, with
//!    the rules `dynrt-bench predict` replays ([`crate::memory::predictor::Ledger`]): if the
//!    node's buffer holds the new output, reuse it (and still record the shape in the
//!    predictor); otherwise ask the predictor, check `can_preallocate` against the engine's
//!    limits and budget, and take a buffer of the decided size from the pool, the placeholder
//!    pool (inputs, outputs) or the engine (pool off). A preallocation that fails for lack of
//!    memory falls back to the exact size; a buffer is never smaller than the actual output.
//!    Under the adaptive policy a mostly empty buffer is shrunk while the request
//!    over-reserves. With [`RunOptions::trace`] every decision is a row of the request's shape
//!    trace ([`InferRequest::sizing_trace`]; `dynrt demo --trace-out`), whose replay gives the
//!    run's [`InferRequest::sizing`] numbers.
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
//! A *state* pairs a graph input (the past, `past_key_values.0.key`) with a graph output (the
//! present) produced by a two-input `Concat` of that input and the step's new rows, along any
//! axis: axis 0 for a `[t, dim]` cache, the sequence axis 2 of the `[batch, heads, t,
//! head_dim]` caches exported models write. [`find_states`] recognises the pattern; callers
//! may also name the pairs ([`NetworkOptions::states`]). The request keeps one buffer per
//! state, preallocated with room from the predictor: a *padded* layout whose growing axis
//! has the buffer's capacity (`[batch, heads, capacity, head_dim]`, see `state/kv.rs`). The
//! concat node does not run a kernel: its output *is* the state buffer, and the step copies
//! only the new rows into their place (one copy per `batch x heads` block). When the buffer
//! is too small, a larger one is allocated and the old rows are copied into it once, in the
//! same submit, before the new ones. The next step's past is the same buffer: no copy and no
//! allocation between growths.
//!
//! Every tensor of a padded state is a *strided view* of its buffer: the past, the present,
//! and a `Transpose` of either (`compile.rs`'s `Role::StateView`: no dispatch, its strides are
//! the permuted strides) when all its readers take strided inputs. Kernels get such operands
//! with explicit strides ([`crate::gpu::kernels::Operand::strides`]); the kernels that read
//! them ([`crate::gpu::kernels::Kernel::reads_strided`]) are matmul (both sides: rows,
//! columns and batches by stride) and the movement family's strided copies (reshape,
//! transpose, slice, concat). Any other kernel reading a state's view gets a contiguous copy
//! from the runtime: compiling inserts a strided copy node (`<node>#contiguous`) in front of
//! it. Reading a present on the host gathers the rows from the padded buffer. A caller may
//! also give a state's past as an input: it replaces the rows held (written into the state
//! buffer before the submit), e.g. a first step that starts from a stored cache.
//!
//! An **in-place** state is one whose present is a [`crate::graph::ops::ScatterRows`] of its
//! past: a paged KV pool. Its shape never changes (the past's dimensions come from the fixed
//! symbols or the inputs, rows included), its buffer is allocated at the first iteration with
//! exactly its bytes, and the scatter's kernel writes the step's rows into that buffer
//! (`Role::StateScatter`); readers of the present read the same buffer.

//! # Inputs and outputs
//!
//! Network inputs and outputs are placeholders (see above): `usm_shared` when the adapter
//! maps storage buffers (`MAPPABLE_PRIMARY_BUFFERS`, e.g. lavapipe), written and read by
//! mapping; `usm_device` otherwise (GL, the browser), written through the queue and read
//! through `usm_host` readback buffers, and placed in the data region's high end where they
//! fit.
//!
//! # Poison
//!
//! With `DYNRT_POISON=1` (or [`RunOptions::poison`]) every buffer handed out for reuse or
//! preallocation is filled with NaN (all bits set) before the node writes it. A kernel that
//! reads bytes it did not write, or a range computed wrongly, then shows up as NaN in the
//! outputs; correct code gives identical results with it on.

mod compile;
mod error;
mod network;
mod options;
mod placeholders;
mod replay;
pub mod report;
mod request;
mod state;
mod weights;

pub use crate::tensor::HostTensor;
pub use compile::{find_states, NetworkOptions, StateBinding};
pub use error::RunError;
pub use network::Network;
pub use options::{HostTime, RunOptions, RunStats};
pub use replay::{replay_on_host, HostReplay, ReplayStep};
pub use request::{DeviceIo, HostRows, InferRequest, KvStates, Pending, StateRows};
pub use weights::WeightCacheStats;
