//! The `fill` kernel (`shaders/fill.wgsl`): a ramp `dst[i] = scale * i + bias` written into an
//! engine buffer and submitted on its own, outside the graph's kernels (the headless example,
//! the browser's adapter check and the engine tests use it).

use crate::gpu::{AllocError, Buffer, BufferDesc, Engine, Gpu, GpuError};
use crate::memory::AllocKind;
use futures::FutureExt;

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
pub const FILL_WGSL: &str = crate::gpu::pipeline::with_prelude!("fill");
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
            &BufferDesc {
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
