//! dynrt: a WebGPU runtime for ML compute graphs whose shapes change while they run.
//!
//! (Crate overview and runnable example: filled in as the subsystems land.)
#![warn(missing_docs)]

pub mod gpu;
pub mod graph;
pub mod memory;
pub mod rng;
pub mod runtime;
pub mod shape;
#[cfg(all(target_arch = "wasm32", feature = "web"))]
pub mod web;
