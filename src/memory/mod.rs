//! Device-free memory management: allocation kinds, accounting, the shape predictor, the
//! memory pool, the static planner and device regions. Nothing here imports wgpu; the
//! [`crate::gpu`] module supplies the real storage.

pub mod accounting;
pub mod kind;
pub mod planner;
pub mod pool;
pub mod predictor;
pub mod regions;

pub use kind::AllocKind;
