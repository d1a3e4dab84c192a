//! The class of kernels an adapter runs ([`QuantLayout`]): software adapters and hardware
//! GPUs get differently shaped kernels. The class is decided here, from the adapter alone;
//! which kernel each class takes for an op is the kernel families' business
//! ([`QuantLayout::linear_kernel`] in `kernels::quant`), so the families that only need the
//! class (`attention`, `reduce`) import this file, not `quant`.

use super::{wgpu, Gpu};

/// How the `quant` kernels spread their work, by the kind of adapter ([`Kernels::new`] picks
/// it from the adapter's device type; [`Kernels::set_quant_layout`] overrides it, as the tests
/// do to check both).
///
/// [`Kernels::new`]: super::kernels::Kernels::new
/// [`Kernels::set_quant_layout`]: super::kernels::Kernels::set_quant_layout
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantLayout {
    /// A software adapter (llvmpipe, lavapipe, SwiftShader) running `threads` CPU threads:
    /// workgroups of 8 invocations (one 256-bit SIMD group each), as many output rows per
    /// invocation as still gives every thread a group, and the register-tiled prefill kernel.
    Cpu {
        /// Threads the adapter runs workgroups on (the host's available parallelism).
        threads: u32,
    },
    /// A hardware GPU: for decode, the subgroup matrix-vector kernel where the device has
    /// subgroup operations (lanes of one subgroup share each output row and meet by
    /// shuffles), else 64-invocation workgroups that share each row and meet in workgroup
    /// memory; for prefill the GEMM that stages x and dequantized weight tiles in workgroup
    /// memory (`quant_mm`).
    Gpu {
        /// The smallest subgroup the device runs compute work in, where it offers subgroup
        /// operations (`Features::SUBGROUP`; wgpu's `AdapterInfo::subgroup_min_size`: 32 on
        /// NVIDIA, 8 on lavapipe); `None` where it does not (GL, the browser through wgpu 30,
        /// whose WebGPU backend does not map the `subgroups` feature).
        subgroup: Option<u32>,
    },
}

impl QuantLayout {
    /// Largest M (rows of x) served by the matrix-vector kernel, which reads the weight once
    /// per row of x; more rows take a prefill kernel, which reads it once per 8 (software
    /// adapters: measured faster from 4 rows on llvmpipe) or 64 rows (hardware GPUs: below 9
    /// rows a 64-row tile would mostly compute padding).
    pub fn matvec_max_m(self) -> u64 {
        match self {
            QuantLayout::Cpu { .. } => 3,
            QuantLayout::Gpu { .. } => 8,
        }
    }

    /// The layout for an adapter of `device_type`, without subgroups (see [`QuantLayout::of`]).
    pub fn for_device(device_type: wgpu::DeviceType) -> QuantLayout {
        if device_type == wgpu::DeviceType::Cpu {
            QuantLayout::cpu_class()
        } else {
            QuantLayout::Gpu { subgroup: None }
        }
    }

    /// The software adapters' layout with this machine's hardware threads (one on wasm32),
    /// whatever the adapter: what `--kernels cpu` forces.
    pub fn cpu_class() -> QuantLayout {
        #[cfg(not(target_arch = "wasm32"))]
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        #[cfg(target_arch = "wasm32")]
        let threads = 1;
        QuantLayout::Cpu { threads }
    }

    /// The layout for `gpu`'s device: by its adapter's type, with its subgroups on a
    /// hardware GPU. The one place that decides which class of kernels an adapter runs.
    pub fn of(gpu: &Gpu) -> QuantLayout {
        match QuantLayout::for_device(gpu.adapter_info().device_type) {
            QuantLayout::Gpu { .. } => QuantLayout::gpu_class(gpu),
            cpu => cpu,
        }
    }

    /// The hardware-GPU layout with `gpu`'s subgroups, whatever its adapter's type: what a
    /// hardware GPU with the same features would run (the tests force it on software
    /// adapters so the GPU kernels run there too).
    pub fn gpu_class(gpu: &Gpu) -> QuantLayout {
        QuantLayout::Gpu {
            subgroup: subgroup_size(gpu),
        }
    }
}

/// The smallest subgroup of `gpu`'s device when it has subgroup operations and reports a
/// size the subgroup kernels take (a power of two from 4 to 128).
fn subgroup_size(gpu: &Gpu) -> Option<u32> {
    let size = gpu.adapter_info().subgroup_min_size;
    (gpu.features().contains(wgpu::Features::SUBGROUP)
        && size.is_power_of_two()
        && (4..=128).contains(&size))
    .then_some(size)
}
