//! dynrt inside an application that already owns a wgpu device (an egui/eframe, Bevy or
//! iced app, or its own renderer): [`Gpu::from_device`] takes the app's `wgpu::Device` and
//! `wgpu::Queue`, checks what dynrt's kernels need, and shares them; the app says how much
//! memory dynrt may use ([`EmbedOptions::memory_budget_bytes`]).
//!
//! How a shared device behaves (and why):
//!
//! * **Budget.** wgpu does not report how much memory a device has or what the app's own
//!   buffers take, so the split is the app's call: the [`super::Engine`] made from this `Gpu`
//!   refuses, with [`super::AllocError::OverBudget`], any allocation that would take dynrt's
//!   device bytes past the budget. The app's own textures and buffers are not counted.
//! * **Errors.** A device has one uncaptured-error handler; [`Gpu::from_device`] leaves the
//!   app's in place (or wgpu's default, which panics) and installs none. Everything dynrt does
//!   that can fail runs inside error scopes it pushes and pops around the call; wgpu keeps
//!   error scopes per thread, so dynrt's scopes catch only dynrt's errors, nest inside any
//!   scope the app has open on the same thread without disturbing it, and never see the
//!   app's errors on other threads. [`Gpu::uncaptured_errors`] stays empty here.
//! * **Never blocking the render loop.** dynrt's calls block the thread that makes them
//!   (a generation waits for its logits), so an app runs generation on a thread of its own:
//!   wgpu's device and queue are shared across threads natively, and every dynrt type a
//!   generation needs is `Send`. That is preferred to running bounded slices per frame
//!   because a forward pass is one submission whose length the app cannot slice, and a
//!   frame would wait for its readback. One wgpu rule still reaches across threads: a
//!   blocking `device.poll` holds a device lock that presenting a frame needs, for as long
//!   as it waits. So on a shared device dynrt never waits indefinitely: it polls in slices
//!   of at most [`SHARED_POLL_SLICE`], letting a `present` in between. What remains shared
//!   is the GPU queue itself: the app's frame executes after the dynrt work submitted
//!   before it (one forward pass at most, as dynrt submits per pass).
//! * **Callbacks.** Polling runs every callback that is due, so an app's own `map_async`
//!   callbacks may run on dynrt's thread (wgpu requires them to be `Send` for that reason).

use super::{Gpu, GpuError, GpuInner, GpuOptions};
use std::sync::Arc;
use std::time::Duration;

/// Longest single wait dynrt makes on a shared device's fence: a `present` on the app's
/// thread waits at most this long for the device lock dynrt's wait holds.
pub const SHARED_POLL_SLICE: Duration = Duration::from_millis(2);

/// How dynrt uses a device that the application created.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EmbedOptions {
    /// Device bytes dynrt may hold at once (weights, KV cache, activations, its staging
    /// excluded): the app's share for dynrt. The engine enforces it.
    pub memory_budget_bytes: u64,
    /// Features the app's dynrt workload needs on top of what dynrt's kernels need (none):
    /// e.g. `MAPPABLE_PRIMARY_BUFFERS` for `usm_shared` buffers. Checked, never enabled: a
    /// wgpu device's features are fixed when it is created.
    pub required_features: wgpu::Features,
    /// Print the allocation history to stderr (as `DYNRT_VERBOSE=2`).
    pub verbose: bool,
}

impl EmbedOptions {
    /// Options with a budget of `memory_budget_bytes`, no extra features, quiet.
    pub fn new(memory_budget_bytes: u64) -> EmbedOptions {
        EmbedOptions {
            memory_budget_bytes,
            required_features: wgpu::Features::empty(),
            verbose: false,
        }
    }

    /// The same options also requiring `features`.
    pub fn with_required_features(mut self, features: wgpu::Features) -> EmbedOptions {
        self.required_features |= features;
        self
    }
}

/// One device limit below what dynrt needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitShortfall {
    /// The field of `wgpu::Limits`.
    pub limit: &'static str,
    /// What dynrt needs.
    pub required: u64,
    /// What the device has.
    pub available: u64,
}

impl std::fmt::Display for LimitShortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {} but dynrt needs {}",
            self.limit, self.available, self.required
        )
    }
}

/// The limits dynrt checks, read from `l`: everything its kernels and buffers depend on.
/// The values of [`required_limits`] are WebGPU's defaults (what a browser grants without
/// asking), so the browser build and an embedded device need the same; a test checks every
/// kernel of `shaders/` against them.
fn checked_limits(l: &wgpu::Limits) -> [(&'static str, u64); 11] {
    [
        ("max_bind_groups", l.max_bind_groups.into()),
        (
            "max_storage_buffers_per_shader_stage",
            l.max_storage_buffers_per_shader_stage.into(),
        ),
        (
            "max_uniform_buffers_per_shader_stage",
            l.max_uniform_buffers_per_shader_stage.into(),
        ),
        (
            "max_storage_buffer_binding_size",
            l.max_storage_buffer_binding_size,
        ),
        ("max_buffer_size", l.max_buffer_size),
        (
            "max_compute_workgroup_storage_size",
            l.max_compute_workgroup_storage_size.into(),
        ),
        (
            "max_compute_invocations_per_workgroup",
            l.max_compute_invocations_per_workgroup.into(),
        ),
        (
            "max_compute_workgroup_size_x",
            l.max_compute_workgroup_size_x.into(),
        ),
        (
            "max_compute_workgroup_size_y",
            l.max_compute_workgroup_size_y.into(),
        ),
        (
            "max_compute_workgroup_size_z",
            l.max_compute_workgroup_size_z.into(),
        ),
        (
            "max_compute_workgroups_per_dimension",
            l.max_compute_workgroups_per_dimension.into(),
        ),
    ]
}

/// The limits a device must have for dynrt: WebGPU's defaults for compute and storage
/// buffers, WebGL2's floor for everything dynrt does not use. An app that creates its device
/// for dynrt too asks for `its_limits.or_better_values_from(&required_limits())`.
pub fn required_limits() -> wgpu::Limits {
    let d = wgpu::Limits::defaults();
    wgpu::Limits {
        max_bind_groups: d.max_bind_groups,
        max_storage_buffers_per_shader_stage: d.max_storage_buffers_per_shader_stage,
        max_uniform_buffers_per_shader_stage: d.max_uniform_buffers_per_shader_stage,
        max_storage_buffer_binding_size: d.max_storage_buffer_binding_size,
        max_buffer_size: d.max_buffer_size,
        max_compute_workgroup_storage_size: d.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: d.max_compute_invocations_per_workgroup,
        max_compute_workgroup_size_x: d.max_compute_workgroup_size_x,
        max_compute_workgroup_size_y: d.max_compute_workgroup_size_y,
        max_compute_workgroup_size_z: d.max_compute_workgroup_size_z,
        max_compute_workgroups_per_dimension: d.max_compute_workgroups_per_dimension,
        ..wgpu::Limits::downlevel_webgl2_defaults()
    }
}

/// Every checked limit of `available` below [`required_limits`].
pub fn limit_shortfalls(available: &wgpu::Limits) -> Vec<LimitShortfall> {
    checked_limits(&required_limits())
        .into_iter()
        .zip(checked_limits(available))
        .filter(|((_, need), (_, have))| have < need)
        .map(|((limit, required), (_, available))| LimitShortfall {
            limit,
            required,
            available,
        })
        .collect()
}

impl Gpu {
    /// Shares a device the application created and keeps using (its renderer's): dynrt
    /// allocates, uploads and dispatches on `device` and `queue` (clones of the app's
    /// handles; the device lives until the app's and dynrt's last handle are dropped). The
    /// adapter's name, backend and the limits are read from the device. See the module
    /// docs for the budget, error handling and threading on a shared device.
    ///
    /// # Errors
    /// [`GpuError::LimitsTooLow`] naming every limit below [`required_limits`] (a device
    /// created with WebGL2's limits has no compute at all); [`GpuError::MissingFeatures`]
    /// naming the features of [`EmbedOptions::required_features`] the device lacks;
    /// [`GpuError::BadBudget`] for a zero budget.
    pub fn from_device(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        options: EmbedOptions,
    ) -> Result<Gpu, GpuError> {
        let info = device.adapter_info();
        let limits = device.limits();
        let features = device.features();
        let shortfalls = limit_shortfalls(&limits);
        if !shortfalls.is_empty() {
            return Err(GpuError::LimitsTooLow {
                adapter: info.name,
                shortfalls,
            });
        }
        let missing = options.required_features - features;
        if !missing.is_empty() {
            return Err(GpuError::MissingFeatures {
                adapter: info.name,
                missing,
            });
        }
        if options.memory_budget_bytes == 0 {
            return Err(GpuError::BadBudget { budget_bytes: 0 });
        }
        log::info!(
            "dynrt: sharing the app's device on `{}` ({:?}), budget {} bytes, shared={}",
            info.name,
            info.backend,
            options.memory_budget_bytes,
            features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
        );
        let gpu_options = GpuOptions {
            backends: wgpu::Backends::from(info.backend),
            adapter_name: None,
            memory_budget_bytes: Some(options.memory_budget_bytes),
            mappable_primary_buffers: features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            verbose: options.verbose,
            power_preference: wgpu::PowerPreference::default(),
        };
        Ok(Gpu {
            inner: Arc::new(GpuInner {
                owned: None,
                device: device.clone(),
                queue: queue.clone(),
                limits,
                features,
                info,
                options: gpu_options,
                uncaptured: Arc::default(),
            }),
        })
    }

    /// Whether the device is an application's, shared through [`Gpu::from_device`].
    pub fn is_shared(&self) -> bool {
        self.inner.owned.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webgpu_defaults_satisfy_and_webgl2_names_every_missing_compute_limit() {
        assert!(limit_shortfalls(&wgpu::Limits::defaults()).is_empty());
        let short = limit_shortfalls(&wgpu::Limits::downlevel_webgl2_defaults());
        let names: Vec<_> = short.iter().map(|s| s.limit).collect();
        assert!(names.contains(&"max_storage_buffers_per_shader_stage"));
        assert!(names.contains(&"max_compute_invocations_per_workgroup"));
        let s = short
            .iter()
            .find(|s| s.limit == "max_storage_buffers_per_shader_stage")
            .unwrap();
        assert_eq!((s.required, s.available), (8, 0));
        // GLES 3.1's downlevel limits: 4 storage buffers, 16352 bytes of workgroup memory.
        let gles = limit_shortfalls(&wgpu::Limits::downlevel_defaults());
        let names: Vec<_> = gles.iter().map(|s| s.limit).collect();
        assert_eq!(
            names,
            [
                "max_storage_buffers_per_shader_stage",
                "max_compute_workgroup_storage_size"
            ]
        );
    }

    #[test]
    fn required_limits_pass_their_own_check() {
        assert!(limit_shortfalls(&required_limits()).is_empty());
        // An app merging dynrt's needs into egui's usual request gets a device dynrt takes.
        let egui_like = wgpu::Limits {
            max_texture_dimension_2d: 8192,
            ..wgpu::Limits::downlevel_webgl2_defaults()
        };
        let merged = egui_like.or_better_values_from(&required_limits());
        assert!(limit_shortfalls(&merged).is_empty());
        assert_eq!(merged.max_texture_dimension_2d, 8192);
    }
}
