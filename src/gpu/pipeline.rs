//! Compute pipeline creation (inside error scopes), the WGSL sources pipelines are made from
//! (the shared prelude, then a shader file), and the `fill` kernel family.

use super::{AllocError, Buffer, Engine, Gpu, GpuError};
use crate::memory::AllocKind;
use futures::FutureExt;

/// `shaders/common/prelude.wgsl`: what the kernel families share (the 2-D grid's indices, NaN
/// and infinity as runtime values, the lowest finite f32, i64 parameters saturated to i32, the
/// broadcasting uniform struct), put in front of every shader file by `with_prelude!`.
pub const PRELUDE_WGSL: &str = include_str!("../../shaders/common/prelude.wgsl");

/// The WGSL that pipelines of `shaders/<name>.wgsl` are compiled from: [`PRELUDE_WGSL`], then
/// the file. Every shader file is loaded through it, so each backend and the browser compile
/// the same text, and [`shader_sources`] hands the tests that text.
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

/// Every WGSL source dynrt compiles, by the stem of its file (`shaders/<stem>.wgsl`): each
/// kernel family's ([`kernels::FAMILIES`](super::kernels::FAMILIES)) and `fill`'s, as their
/// pipelines get it (the prelude, the file, and for `quant` the formats' decoders).
pub fn shader_sources() -> impl Iterator<Item = (&'static str, &'static str)> {
    super::kernels::FAMILIES
        .iter()
        .map(|f| (f.name, (f.source)()))
        .chain([("fill", FILL_WGSL)])
}

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

/// The uniform block of `shaders/fill.wgsl` (`struct FillParams`), 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FillParams {
    /// Number of f32 elements to write.
    pub len: u32,
    /// Elements per grid row (x workgroups × 64); the kernel's index is `y * row + x`.
    pub row_elements: u32,
    /// Slope of the ramp.
    pub scale: f32,
    /// Value at index 0.
    pub bias: f32,
}

/// The `fill` kernel family (`shaders/fill.wgsl`), entry point `fill_affine`:
/// `dst[i] = scale * i + bias` for `i < len`.
pub struct FillPipeline {
    /// Dropped in `Drop`, under the device lock.
    pipeline: std::mem::ManuallyDrop<wgpu::ComputePipeline>,
    gpu: Gpu,
}

impl Drop for FillPipeline {
    fn drop(&mut self) {
        // Destroying a pipeline takes the GL context (see `Gpu::lock_device`).
        let _device = self.gpu.lock_device();
        // SAFETY: the pipeline is dropped once, here, and never used afterwards.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.pipeline) };
    }
}

/// WGSL source of the `fill` family (the prelude, then `shaders/fill.wgsl`).
pub const FILL_WGSL: &str = with_prelude!("fill");
const WORKGROUP_SIZE: u32 = 64;
const MAX_GROUPS_PER_DIM: u32 = 65535;

impl FillPipeline {
    /// Compiles the kernel.
    ///
    /// # Errors
    /// [`GpuError::Shader`].
    pub fn new(gpu: &Gpu) -> Result<FillPipeline, GpuError> {
        Ok(FillPipeline {
            pipeline: std::mem::ManuallyDrop::new(gpu.compile_compute(
                "fill_affine",
                FILL_WGSL,
                "fill_affine",
            )?),
            gpu: gpu.clone(),
        })
    }

    /// Writes `dst[i] = scale * i + bias` for the first `len` f32 elements of `dst`, which must
    /// be preallocated and bindable. The parameters go into a small `cl_mem` uniform buffer
    /// (created with its contents, freed after submission). Work is submitted, not awaited.
    ///
    /// # Errors
    /// [`AllocError::NotBindable`] for `usm_host`, [`AllocError::OutOfBounds`] if `len`
    /// elements do not fit `dst` or one binding, allocation errors of the parameter buffer,
    /// [`AllocError::Validation`] from wgpu.
    pub fn dispatch(
        &self,
        engine: &Engine,
        dst: &Buffer,
        len: u32,
        scale: f32,
        bias: f32,
    ) -> Result<(), AllocError> {
        let pipeline: &wgpu::ComputePipeline = &self.pipeline;
        let dst_raw = dst.binding()?;
        let bytes = u64::from(len) * 4;
        let max_binding = engine.gpu().limits().max_storage_buffer_binding_size;
        if bytes > dst.size_bytes() || bytes > max_binding {
            return Err(AllocError::OutOfBounds {
                offset_bytes: 0,
                size_bytes: bytes,
                buffer_bytes: dst.size_bytes().min(max_binding),
            });
        }
        if len == 0 {
            return Ok(());
        }
        let groups = len.div_ceil(WORKGROUP_SIZE);
        let groups_x = groups.min(MAX_GROUPS_PER_DIM);
        let groups_y = groups.div_ceil(groups_x);
        let params = FillParams {
            len,
            row_elements: groups_x * WORKGROUP_SIZE,
            scale,
            bias,
        };
        let params_buf = engine.allocate_init(
            &super::BufferDesc {
                label: "fill_affine params",
                size_bytes: std::mem::size_of::<FillParams>() as u64,
                kind: AllocKind::ClMem,
            },
            bytemuck::bytes_of(&params),
        )?;
        let gpu = engine.gpu();
        let device = gpu.device();
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("fill_affine bindings"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: params_buf.binding()?.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: dst_raw,
                        offset: 0,
                        size: std::num::NonZeroU64::new(bytes),
                    }),
                },
            ],
        });
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("fill_affine"),
        });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("fill_affine"),
                timestamp_writes: None,
            });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups_x, groups_y, 1);
        }
        {
            let _device = gpu.lock_device();
            gpu.queue().submit([enc.finish()]);
        }
        if let Some(e) = scope.pop().now_or_never().flatten() {
            return Err(engine.lost_or(AllocError::Validation(e.to_string())));
        }
        Ok(())
    }
}
