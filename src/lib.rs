//! dynrt: a WebGPU runtime for ML compute graphs whose shapes change while they run.
//!
//! dynrt runs compute graphs on `wgpu` natively (Vulkan, Metal, DX12, GL; Mesa lavapipe and
//! llvmpipe on machines without a GPU) and in the browser (wasm32 + WebGPU, feature `web`). Its
//! heart is memory management for dynamic shapes, such as a language model's KV cache that grows
//! by one row every decode step.
//!
//! # Key types
//!
//! * [`gpu::Gpu`] — adapter and device; [`gpu::Engine`] — every real allocation, by
//!   [`memory::AllocKind`] (`usm_device`, `usm_host`, `usm_shared`, `cl_mem`), with bytes in use
//!   and peak per kind and the `Allocate/Free` history (`DYNRT_VERBOSE=2`). A [`gpu::Buffer`]
//!   frees itself on drop.
//! * [`memory::predictor::ShapePredictor`] — how much to preallocate before a dispatch
//!   (the reference policy bit for bit, an adaptive one, or none).
//! * [`memory::pool::MemoryPool`] — reuse of buffers between nodes that are never live together,
//!   from the memory dependencies of [`graph::deps`].
//! * [`memory::planner`] — static offsets for buffers of known lifetime in one arena;
//!   [`memory::regions`] — device regions and their allocators.
//! * [`graph::Graph`] / [`graph::GraphBuilder`] — the IR with symbolic dimensions, per-op shape
//!   inference and a CPU reference ([`graph::reference`]); [`gpu::kernels`] — the WGSL kernels.
//! * [`runtime::Network`] (compiled once) and [`runtime::InferRequest`] (one per request): the
//!   per-iteration loop `update_shape → update_impl → realloc_if_needed → dispatch`.
//!
//! # Example
//!
//! Allocate a device buffer, upload through staging, read it back, and watch the accounting:
//!
//! ```
//! use dynrt::gpu::{BufferDesc, Engine, Gpu, GpuOptions};
//! use dynrt::memory::AllocKind;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = match Gpu::new_blocking(GpuOptions::from_env()?) {
//!     Ok(gpu) => gpu,
//!     // No adapter on this machine: `apt-get install mesa-vulkan-drivers` gives lavapipe.
//!     Err(e) => { eprintln!("{e}"); return Ok(()); }
//! };
//! let engine = Engine::new(gpu);
//! let data: Vec<f32> = (0..1024).map(|i| i as f32).collect();
//! let buffer = engine.allocate(&BufferDesc {
//!     label: "activations",
//!     size_bytes: 4096,
//!     kind: AllocKind::UsmDevice,
//! })?;
//! engine.write(&buffer, 0, bytemuck::cast_slice(&data))?;
//! let back = engine.read_blocking(&buffer, 0, 4096)?;
//! assert_eq!(bytemuck::cast_slice::<u8, f32>(&back), &data[..]);
//! assert_eq!(engine.stats().current_bytes(AllocKind::UsmDevice), 4096);
//! drop(buffer);
//! assert_eq!(engine.stats().current_bytes(AllocKind::UsmDevice), 0);
//! # Ok(())
//! # }
//! ```
//!
//! The decode loop through [`runtime`] is in `examples/decode_loop.rs`; the command-line tool
//! (`dynrt demo`, `info`, `predict`, `plan`, `bench`) is described in the README.
#![warn(missing_docs)]
// On wasm32 wgpu's handles are neither Send nor Sync (one JS thread), so the Arcs that share
// them natively (Engine, Gpu, Network) trip this lint there; the single-threaded target is why.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

pub mod gpu;
pub mod graph;
pub mod memory;
pub mod npy;
pub mod onnx;
pub mod rng;
pub mod runtime;
pub mod shape;
pub mod tensor;
#[cfg(all(target_arch = "wasm32", feature = "web"))]
pub mod web;
