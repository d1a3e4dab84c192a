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
//!   [`memory::AllocKind`] (`usm_device`, `usm_host`, `usm_shared`, `cl_mem`) and by device
//!   region, with bytes in use and peak, and a bounded `Allocate/Free` history
//!   (`DYNRT_VERBOSE=2`). A [`gpu::Buffer`] frees itself on drop. [`gpu::Frame`] records one
//!   submit's copies and dispatches: the runtime's one door to wgpu.
//! * [`memory::predictor::Sizer`] — the one sizing path (`realloc_if_needed`): the shape
//!   predictor (the openvino policy bit for bit, an adaptive one, or none) and the ledger of
//!   what it sized; `dynrt-bench predict` replays traces through the same code.
//! * [`memory::pool::MemoryPool`] — reuse of buffers between nodes that are never live together,
//!   from the memory dependencies of [`graph::deps`].
//! * [`memory::planner`] — static offsets for buffers of known lifetime in one arena;
//!   [`memory::regions`] — device regions and their allocators (the runtime places constants,
//!   placeholders and activations in them).
//! * [`graph::Graph`] / [`graph::GraphBuilder`] — the IR with symbolic dimensions; each op is a
//!   type implementing [`graph::OpDef`] (dtype rule, shape rule, CPU reference, host
//!   evaluation); [`graph::reference`] — the independent CPU reference; [`gpu::kernels`] — one
//!   WGSL kernel family per file.
//! * [`shape::DType`] (plain types and block-quantized formats) and [`tensor::ConstData`]
//!   (a constant's bytes, possibly a range of a memory-mapped file).
//! * [`runtime::Network`] (compiled once) and [`runtime::InferRequest`] (one per request): the
//!   per-iteration loop `update_shape → update_impl → realloc_if_needed → dispatch`, split into
//!   a device-free session and a thin GPU executor.
//! * [`gguf::Gguf`] — a validating GGUF parser over bytes (memory-mapped natively by
//!   [`gguf::MappedGguf`]), CPU [`gguf::dequantize`] and [`llm::ModelConfig`];
//!   [`tokenizer::Tokenizer`] — the model's byte-level BPE or SentencePiece, chat template
//!   and streaming decode; [`models`] — the models dynrt knows; `fetch` (native) — `dynrt
//!   fetch`, the model cache and `--model PATH`.
//! * [`llm::Model`] / [`llm::Session`] — a llama, qwen2 or gemma3 GGUF loaded once, sessions
//!   that each keep their own KV cache, greedy or sampled generation streamed as text.
//! * [`onnx::OnnxFile`] (a decoded, checked `.onnx` file) and [`onnx::import()`] (its graph, one
//!   converter per ONNX op type in [`onnx::import::CONVERTERS`]).
//! * [`sentence::SentenceModel`] — sentence embeddings: BERT from a sentence-transformers
//!   folder ([`safetensors::SafeTensors`] weights, [`tokenizer::WordPiece`]) or an ONNX
//!   encoder, batch and sequence both dynamic, sentences batched by length.
//! * `fileio` (native) — how every user-named file is read (regular files only, a stated
//!   bound per kind) and how outputs are written (a temporary file moved into place, never
//!   through a symbolic link).
//!
//! # Module map and adding an op
//!
//! docs/modules.md has the module map (what each module holds, which may touch wgpu: only
//! [`gpu`]), docs/adding.md the recipe for adding an op: the op's type in `src/graph/ops/`
//! (one line in the `registry!` list of [`graph::ops`]), its [`gpu::kernels::Kernel`] in its
//! family's file (one line in [`gpu::kernels::kernel_of`]), its WGSL and its test.
//! `UnaryOp::Sqrt`, a new variant of an existing family, touched three files.
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
//! (`dynrt demo`, `info`, `predict`, `plan`, `bench`) is described in docs/cli.md.
#![warn(missing_docs)]
// On wasm32 wgpu's handles are neither Send nor Sync (one JS thread), so the Arcs that share
// them natively (Engine, Gpu, Network) trip this lint there; the single-threaded target is why.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

pub mod demo;
#[cfg(not(target_arch = "wasm32"))]
pub mod fetch;
#[cfg(not(target_arch = "wasm32"))]
pub mod fileio;
pub mod formats;
pub mod gguf;
pub mod gpu;
pub mod graph;
pub mod llm;
pub mod memory;
pub mod models;
pub mod npy;
pub mod onnx;
pub mod rng;
pub mod runtime;
pub mod safetensors;
pub mod sentence;
pub mod shape;
pub mod structured;
pub mod tensor;
pub mod tokenizer;
#[cfg(all(target_arch = "wasm32", feature = "web"))]
pub mod web;
