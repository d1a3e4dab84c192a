//! The host tests: everything that needs no adapter (the graph IR and its CPU evaluator, the
//! planner and the pool, the ONNX and GGUF readers against their references, the shaders read
//! as text, fuzz loops, `dynrt fetch`, the rule that only `src/gpu/` names wgpu, the import
//! graph of `src/` without cycles, the docs' links and paths). One binary, so that `cargo
//! test` links dynrt once for all of them rather than once per file.

#[path = "../common/mod.rs"]
mod common;

mod doc_links;
mod embed_memory;
mod fetch;
mod fuzz;
mod fuzz_onnx;
mod gemma_tokenizer;
mod graph;
mod imports;
mod onnx_files;
mod onnx_node_tests;
mod plan_properties;
mod pool_properties;
mod quant_formats;
mod shaders;
mod smollm2;
mod wgpu_door;
mod wgsl_portable;
mod wordpiece;
