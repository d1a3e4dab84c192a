//! GPU access: the only module that imports wgpu (in progress)
