//! GPU access: the only module that imports wgpu (in progress)
pub mod kernels;
