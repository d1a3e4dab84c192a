//! The GPU tests: everything that runs dynrt on an adapter in this process (kernels against
//! the CPU reference, the engine, the runtime, ONNX sessions, language models). One binary,
//! so that `cargo test` links dynrt and wgpu once for all of them rather than once per file;
//! the devices of `dynrt::gpu::testing` are cached per process, so the tests share them.
//!
//! Tests that need a process of their own run a child of this binary filtered to one test
//! ([`common::run_alone`]): `env` sets the environment every other test reads, `history`
//! turns the verbose history on from the environment.

#[path = "../common/mod.rs"]
mod common;

mod demo;
mod device_lost;
mod embed;
mod engine;
mod env;
mod gl_threads;
mod history;
mod kernels;
mod llm;
mod llm_events;
mod llm_scheduler;
mod onnx_import;
mod onnx_nbits;
mod onnx_node_run;
mod onnx_session;
mod onnx_smollm2;
mod ops;
mod runtime;
mod runtime_kv;
mod runtime_weights;
mod sentence;
