//! Compute pipeline creation (inside error scopes) and the WGSL sources pipelines are made from
//! (the shared prelude, then a shader file). The kernels, `fill` included, live in
//! [`kernels`](super::kernels), which imports this file and is not imported by it.

use super::{Gpu, GpuError};
use futures::FutureExt;

/// `shaders/common/prelude.wgsl`: what the kernel families share (the 2-D grid's indices, NaN
/// and infinity as runtime values, the lowest finite f32, i64 parameters saturated to i32, the
/// broadcasting uniform struct), put in front of every shader file by `with_prelude!`.
pub const PRELUDE_WGSL: &str = include_str!("../../shaders/common/prelude.wgsl");

/// The WGSL that pipelines of `shaders/<name>.wgsl` are compiled from: [`PRELUDE_WGSL`], then
/// the file. Every shader file is loaded through it, so each backend and the browser compile
/// the same text, and [`shader_sources`](super::kernels::shader_sources) hands the tests that
/// text.
macro_rules! with_prelude {
    ($name:literal) => {
        concat!(
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/shaders/common/prelude.wgsl"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/shaders/",
                $name,
                ".wgsl"
            )),
        )
    };
}
pub(crate) use with_prelude;

/// Parses and validates WGSL with naga (the same front end wgpu uses).
///
/// # Errors
/// naga's message, with source locations, as a `String`.
pub fn validate_wgsl(source: &str) -> Result<naga::Module, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| e.emit_to_string(source))?;
    Ok(module)
}

impl Gpu {
    /// Builds a compute pipeline from WGSL source with an automatic bind-group layout. The
    /// shader and pipeline are created inside a validation error scope, so a bad shader is an
    /// error, not a panic.
    ///
    /// On a GL device, destroying a pipeline takes the GL context: drop the one returned while
    /// holding [`Gpu::lock_device`] when other threads use the device.
    ///
    /// # Errors
    /// [`GpuError::Shader`] with wgpu's message.
    pub fn compile_compute(
        &self,
        label: &str,
        wgsl: &str,
        entry_point: &str,
    ) -> Result<wgpu::ComputePipeline, GpuError> {
        let device = self.device();
        // Compiling takes the GL context (see `Gpu::lock_device`).
        let _device = self.lock_device();
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(wgsl.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some(entry_point),
            compilation_options: Default::default(),
            cache: None,
        });
        // wgpu-core resolves scopes immediately; on the web the result comes later and an
        // error, if any, surfaces when the pipeline is used.
        if let Some(e) = scope.pop().now_or_never().flatten() {
            return Err(GpuError::Shader {
                label: label.to_string(),
                message: e.to_string(),
            });
        }
        Ok(pipeline)
    }
}
