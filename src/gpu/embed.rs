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
//! * **Never blocking the render loop.** Both, for two different waits:
//!   - *CPU side*: dynrt's calls block the thread that makes them (a generation waits for
//!     its logits), so an app runs generation on a thread of its own: wgpu's device and
//!     queue are shared across threads natively, and every dynrt type a generation needs is
//!     `Send`. A thread rather than per-frame slices of the app's own thread, because a
//!     readback's wait and a first-use pipeline compile (seconds on a software adapter) would
//!     otherwise land in a frame. One wgpu rule still reaches across threads: a blocking
//!     `device.poll` holds a device lock that presenting a frame takes exclusively, for as
//!     long as it waits. So on a shared device dynrt never waits indefinitely: it polls in
//!     slices of at most [`SHARED_POLL_SLICE`], letting a `present` in between.
//!   - *GPU side*: the queue is shared and runs submissions in order, so an app frame
//!     submitted behind a whole forward pass waits for all of it (a prefill takes seconds on
//!     lavapipe). On a shared device dynrt therefore cuts each forward pass into bounded
//!     slices ([`EmbedOptions::max_slice`]): it submits a slice of dispatches, and before
//!     submitting the next it waits for the one before, so at most two slices sit ahead of
//!     an app frame in the queue. The slice length adapts to the measured GPU time per
//!     dispatch. Results are the same: the slices run in recording order.
//! * **Callbacks.** Polling runs every callback that is due, so an app's own `map_async`
//!   callbacks may run on dynrt's thread (wgpu requires them to be `Send` for that reason).
//! * **Device loss.** A device has one device-lost callback, and it is the app's: dynrt sets
//!   none on a shared device. The app tells dynrt from its own callback with
//!   [`Gpu::mark_lost`]; from then on dynrt's calls fail with [`super::DeviceLost`].
//! * **GL.** On a GL device dynrt serialises its own threads' device calls
//!   ([`Gpu::lock_device`]); the app's threads that call wgpu on the same device while dynrt
//!   runs should take that lock too (wgpu panics when a thread waits 6 s for the GL context).
//!
//! The whole of it in an app (docs/desktop.md; `examples/desktop_chat.rs` is
//! the same in an eframe window):
//!
//! ```no_run
//! use dynrt::gpu::{wgpu, EmbedOptions, Engine, Gpu};
//! use dynrt::llm::{GenerateParams, Model, ModelOptions};
//! use dynrt::memory::predictor::Policy;
//! use dynrt::runtime::RunOptions;
//! use std::sync::mpsc::{channel, Receiver};
//!
//! /// Your device must have been created with limits that include
//! /// `dynrt::gpu::required_limits()` (`your_limits.or_better_values_from(&...)`).
//! fn start_chat(
//!     device: &wgpu::Device,
//!     queue: &wgpu::Queue,
//!     prompt: String,
//! ) -> Result<Receiver<String>, Box<dyn std::error::Error>> {
//!     // dynrt may hold at most 512 MiB of the device's memory; the app keeps the rest.
//!     let engine = Engine::new(Gpu::from_device(device, queue, EmbedOptions::new(512 << 20))?);
//!     let path = dynrt::fetch::resolve_model(None)?; // the file `dynrt fetch` cached
//!     let (tx, rx) = channel();
//!     // Loading and generating block their thread, never the render loop's.
//!     std::thread::spawn(move || {
//!         let run = || -> Result<(), dynrt::llm::LlmError> {
//!             let model = Model::load(&engine, &path, ModelOptions::default())?;
//!             let mut session = model.session(RunOptions::new(Policy::Adaptive));
//!             let mut on_text = |piece: &str| drop(tx.send(piece.to_string()));
//!             session.chat_blocking(&prompt, &GenerateParams::default(), &mut on_text)?;
//!             Ok(())
//!         };
//!         if let Err(e) = run() {
//!             drop(tx.send(format!("[error: {e}]")));
//!         }
//!     });
//!     Ok(rx) // each frame: `while let Ok(piece) = rx.try_recv() { answer.push_str(&piece) }`
//! }
//! ```

use super::{Gpu, GpuError, GpuInner, GpuOptions};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest single wait dynrt makes on a shared device's fence: a `present` on the app's
/// thread waits at most this long for the device lock dynrt's wait holds.
pub const SHARED_POLL_SLICE: Duration = Duration::from_millis(2);

/// Default [`EmbedOptions::max_slice`]: half a 60 Hz frame.
pub const DEFAULT_MAX_SLICE: Duration = Duration::from_millis(8);

/// Dispatches in the first slice, before any has been timed.
const FIRST_SLICE_DISPATCHES: u32 = 16;

/// How many dispatches a slice of a forward pass holds, adapted to a target GPU time
/// ([`EmbedOptions::max_slice`]) from the time each slice took.
#[derive(Debug)]
pub(crate) struct Slicer {
    target: Duration,
    dispatches: AtomicU32,
}

impl Slicer {
    fn new(target: Duration) -> Slicer {
        Slicer {
            target,
            dispatches: AtomicU32::new(FIRST_SLICE_DISPATCHES),
        }
    }

    /// Dispatches the next slice may hold.
    pub(crate) fn dispatches(&self) -> u32 {
        self.dispatches.load(Ordering::Relaxed)
    }

    /// A slice of `ran` dispatches took `took` from its submission to its completion (its
    /// wait behind other work included): move the count toward the target, at most
    /// doubling or halving at a time.
    pub(crate) fn observe(&self, ran: u32, took: Duration) {
        if ran == 0 {
            return;
        }
        let per_dispatch = took.as_secs_f64().max(1e-6) / f64::from(ran);
        let want = (self.target.as_secs_f64() / per_dispatch) as u32;
        let next = want
            .clamp((ran / 2).max(1), ran.saturating_mul(2))
            .clamp(1, 4096);
        self.dispatches.store(next, Ordering::Relaxed);
    }
}

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
    /// GPU time dynrt aims to put in one submission, so that an app frame queued behind
    /// its work waits about that long (twice at most); `None` submits every forward pass
    /// whole (fastest when nothing else uses the queue). Default 8 ms.
    pub max_slice: Option<Duration>,
}

impl EmbedOptions {
    /// Options with a budget of `memory_budget_bytes`, no extra features, quiet.
    pub fn new(memory_budget_bytes: u64) -> EmbedOptions {
        EmbedOptions {
            memory_budget_bytes,
            required_features: wgpu::Features::empty(),
            verbose: false,
            max_slice: Some(DEFAULT_MAX_SLICE),
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

/// The limits dynrt checks, by name, read from `l`: everything its kernels and buffers
/// depend on (`dynrt info` prints them too). The values of [`required_limits`] are WebGPU's
/// defaults (what a browser grants without asking), so the browser build and an embedded
/// device need the same; a test checks every kernel of `shaders/` against them.
pub fn checked_limits(l: &wgpu::Limits) -> [(&'static str, u64); 11] {
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
            // The app requested the device: its hints are the app's, not known here.
            memory_hints: wgpu::MemoryHints::default(),
        };
        Ok(Gpu {
            inner: Arc::new(GpuInner {
                owned: None,
                device: device.clone(),
                queue: queue.clone(),
                limits,
                features,
                gl: GpuInner::gl_serial(info.backend),
                info,
                options: gpu_options,
                uncaptured: Arc::default(),
                slicer: options.max_slice.map(Slicer::new),
                lost: Arc::default(),
            }),
        })
    }

    /// Whether the device is an application's, shared through [`Gpu::from_device`].
    pub fn is_shared(&self) -> bool {
        self.inner.owned.is_none()
    }

    /// The slicing of forward passes on a shared device (`None`: whole passes).
    pub(crate) fn slicer(&self) -> Option<&Slicer> {
        self.inner.slicer.as_ref()
    }

    /// Waits until submission `index` has finished, in slices of [`SHARED_POLL_SLICE`] (native;
    /// a no-op on the web, where the browser schedules the queue). Returns at once once the
    /// device is lost.
    pub(crate) fn wait_for(&self, index: wgpu::SubmissionIndex) {
        #[cfg(not(target_arch = "wasm32"))]
        loop {
            if self.is_lost() {
                return;
            }
            let wait = wgpu::PollType::Wait {
                submission_index: Some(index.clone()),
                timeout: Some(SHARED_POLL_SLICE),
            };
            let polled = {
                let _device = self.lock_device();
                self.device().poll(wait)
            };
            match polled {
                Ok(_) => return,
                Err(wgpu::PollError::Timeout) => {}
                Err(e) => {
                    log::warn!("device poll failed: {e}");
                    return;
                }
            }
        }
        #[cfg(target_arch = "wasm32")]
        let _ = index;
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
    fn slices_move_toward_the_target_time() {
        let s = Slicer::new(Duration::from_millis(8));
        assert_eq!(s.dispatches(), FIRST_SLICE_DISPATCHES);
        // 16 dispatches in 64 ms: 4 ms each, 2 fit in 8 ms, but one step halves at most.
        s.observe(16, Duration::from_millis(64));
        assert_eq!(s.dispatches(), 8);
        s.observe(8, Duration::from_millis(32));
        assert_eq!(s.dispatches(), 4);
        s.observe(4, Duration::from_millis(16));
        assert_eq!(s.dispatches(), 2);
        s.observe(2, Duration::from_millis(8));
        assert_eq!(s.dispatches(), 2);
        // Fast dispatches: double at most per step, up to 4096.
        s.observe(2, Duration::from_micros(2));
        assert_eq!(s.dispatches(), 4);
        for _ in 0..20 {
            let n = s.dispatches();
            s.observe(n, Duration::from_micros(1));
        }
        assert_eq!(s.dispatches(), 4096);
        s.observe(0, Duration::ZERO);
        assert_eq!(s.dispatches(), 4096);
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
