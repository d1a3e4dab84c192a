//! GPU access: adapter and device, the allocation kinds on wgpu buffers, uploads and
//! readbacks, and compute pipelines. This is the only module of dynrt that imports `wgpu`.
//!
//! * [`Gpu`] — one adapter, its device and queue (cheap to clone): dynrt's own
//!   ([`Gpu::new`]) or an application's, shared ([`Gpu::from_device`], see [`embed`]).
//! * [`Engine`] — every real allocation goes through it: [`Engine::allocate`] takes a
//!   [`BufferDesc`] (label, size, [`AllocKind`]) and returns a [`Buffer`] that frees itself on
//!   drop; the engine keeps per-kind bytes in use and peak and the allocation history
//!   ([`crate::memory::accounting`]).
//! * [`kind_usages`] — the allocation-kind table (docs/design.md), also printed by `dynrt info`.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dynrt::gpu::{BufferDesc, Engine, Gpu, GpuOptions};
//! use dynrt::memory::AllocKind;
//! let gpu = Gpu::new_blocking(GpuOptions::from_env()?)?;
//! let engine = Engine::new(gpu);
//! let buf = engine.allocate(&BufferDesc { label: "x", size_bytes: 16, kind: AllocKind::UsmDevice })?;
//! engine.write(&buf, 0, &[1u8; 16])?;
//! assert_eq!(engine.read_blocking(&buf, 0, 16)?, vec![1u8; 16]);
//! drop(buf); // freed: the usm_device bytes in use go back to zero
//! assert_eq!(engine.stats().current_bytes(AllocKind::UsmDevice), 0);
//! # Ok(()) }
//! ```

pub use wgpu;
/// An adapter's name, backend, device type and driver ([`Gpu::adapter_info`],
/// [`enumerate_all_adapters`]).
pub use wgpu::AdapterInfo;

#[cfg(all(feature = "bench", not(target_arch = "wasm32")))]
pub mod bench;
mod class;
pub mod embed;
mod engine;
mod frame;
pub mod kernels;
mod lost;
mod pipeline;
pub mod pool_storage;
mod readback;
mod serial;
#[cfg(feature = "testing")]
pub mod testing;
mod usage;

pub use class::QuantLayout;
pub use embed::{
    checked_limits, limit_shortfalls, required_limits, EmbedOptions, LimitShortfall,
    DEFAULT_MAX_SLICE, SHARED_POLL_SLICE,
};
pub use engine::{
    AllocError, Buffer, BufferDesc, BufferUid, Engine, KindRequest, MapAccess, UPLOAD_CHUNK_BYTES,
};
pub use frame::{CommandLog, Frame, LoggedCommand, Planned, Submitted};
pub use kernels::fill::{FillParams, FillPipeline, FILL_WGSL};
pub use kernels::shader_sources;
pub use lost::DeviceLost;
pub use pipeline::{validate_wgsl, PRELUDE_WGSL};
pub use readback::{ReadTicket, ReadbackRing};
pub use serial::DeviceGuard;
pub use usage::{
    kind_support, kind_support_on, kind_usages, preferred_kind, AdapterClass, KindSupport,
};

use crate::memory::AllocKind;
use lost::LostFlag;
use serial::DeviceLock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn join_shortfalls(s: &[LimitShortfall]) -> String {
    s.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Memory budget used when neither [`GpuOptions::memory_budget_bytes`] nor
/// `DYNRT_MEMORY_BUDGET` sets one: wgpu 30 does not report how much memory an adapter has, so
/// this is a figure that fits the software adapters CI uses and most discrete GPUs (4 GiB).
pub const DEFAULT_MEMORY_BUDGET_BYTES: u64 = 4 << 30;

/// Errors while finding an adapter or creating a device.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No adapter on any enabled backend.
    #[error(
        "no GPU adapter found on backends {backends}: install a driver, e.g. on Debian/Ubuntu \
         `apt-get install mesa-vulkan-drivers` for Vulkan on lavapipe (software), or set \
         WGPU_BACKEND=gl to use llvmpipe through EGL"
    )]
    NoAdapter {
        /// The backends that were searched, as wgpu prints them.
        backends: String,
    },
    /// `WGPU_ADAPTER_NAME` (or [`GpuOptions::adapter_name`]) matched no adapter.
    #[error("no adapter name contains `{filter}`; adapters found: {found:?}")]
    NoMatchingAdapter {
        /// The requested substring (case-insensitive).
        filter: String,
        /// Names of the adapters that exist.
        found: Vec<String>,
    },
    /// The adapter refused the device request.
    #[error("device request failed on `{adapter}`: {reason}")]
    DeviceRequest {
        /// Adapter name.
        adapter: String,
        /// wgpu's message.
        reason: String,
    },
    /// An environment variable has a value dynrt cannot use.
    #[error("environment variable {name}={value:?} is invalid: {reason}")]
    BadEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is expected.
        reason: &'static str,
    },
    /// A shared device ([`Gpu::from_device`]) has limits below what dynrt's kernels need.
    #[error("the device on `{adapter}` cannot run dynrt: {}; create it with limits that include dynrt::gpu::required_limits()", join_shortfalls(shortfalls))]
    LimitsTooLow {
        /// Adapter name.
        adapter: String,
        /// Every limit that is too low, with both numbers.
        shortfalls: Vec<LimitShortfall>,
    },
    /// A shared device lacks features [`EmbedOptions::required_features`] asks for.
    #[error("the device on `{adapter}` lacks the features {missing:?}: request them when creating the device")]
    MissingFeatures {
        /// Adapter name.
        adapter: String,
        /// The required features the device does not have.
        missing: wgpu::Features,
    },
    /// A memory budget dynrt cannot use.
    #[error("a memory budget of {budget_bytes} bytes leaves dynrt nothing to allocate: give it a positive number of bytes")]
    BadBudget {
        /// The budget given.
        budget_bytes: u64,
    },
    /// A shader failed to parse, validate or compile into a pipeline.
    #[error("shader `{label}` failed: {message}")]
    Shader {
        /// Label of the shader or pipeline.
        label: String,
        /// naga's or wgpu's message.
        message: String,
    },
    /// The device is lost ([`Gpu::is_lost`]).
    #[error(transparent)]
    DeviceLost(#[from] DeviceLost),
}

/// How to pick the adapter and configure the device.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// Backends to search (`WGPU_BACKEND`, comma list: vulkan, gl, metal, dx12, webgpu).
    pub backends: wgpu::Backends,
    /// Case-insensitive substring of the adapter name (`WGPU_ADAPTER_NAME`).
    pub adapter_name: Option<String>,
    /// Device memory budget in bytes for the [`Engine`] (`DYNRT_MEMORY_BUDGET`); `None` uses
    /// [`DEFAULT_MEMORY_BUDGET_BYTES`].
    pub memory_budget_bytes: Option<u64>,
    /// Request `MAPPABLE_PRIMARY_BUFFERS` when the adapter offers it and its memory is the
    /// host's ([`AdapterClass::Unified`]; never on a discrete GPU) (default true). Turning it
    /// off makes `usm_shared` unsupported, as on GL and the web.
    pub mappable_primary_buffers: bool,
    /// Print the allocation history to stderr (`DYNRT_VERBOSE=2`).
    pub verbose: bool,
    /// Power preference when several adapters match.
    pub power_preference: wgpu::PowerPreference,
    /// How wgpu sub-allocates device memory for dynrt's buffers. The default,
    /// [`wgpu::MemoryHints::MemoryUsage`], has wgpu's Vulkan and D3D12 backends take memory in
    /// blocks of 8-64 MiB (device) and 4-32 MiB (host-visible) instead of 128-256 / 64-128 MiB:
    /// dynrt pools and packs its own buffers, so wgpu's large blocks would only be memory
    /// allocated and never used (the exported SmolLM2 decoder on lavapipe: 743,581,184 bytes
    /// of Vulkan memory at the peak with `Performance`, the 542 MB of weights plus a 128 MiB
    /// and a 64 MiB block; see docs/benchmarks/2026-11-23-onnx-runtime-side-by-side.md).
    pub memory_hints: wgpu::MemoryHints,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            backends: wgpu::Backends::all(),
            adapter_name: None,
            memory_budget_bytes: None,
            mappable_primary_buffers: true,
            verbose: false,
            power_preference: wgpu::PowerPreference::HighPerformance,
            memory_hints: wgpu::MemoryHints::MemoryUsage,
        }
    }
}

impl GpuOptions {
    /// Defaults, overridden by `WGPU_BACKEND`, `WGPU_ADAPTER_NAME`, `DYNRT_MEMORY_BUDGET` (bytes)
    /// and `DYNRT_VERBOSE`. On wasm32 there is no environment: the defaults.
    ///
    /// # Errors
    /// [`GpuError::BadEnv`] for a `WGPU_BACKEND` naming no backend or a budget that is not a
    /// positive integer.
    pub fn from_env() -> Result<Self, GpuError> {
        #[allow(unused_mut)]
        let mut o = GpuOptions::default();
        #[cfg(not(target_arch = "wasm32"))]
        {
            if let Ok(v) = std::env::var("WGPU_BACKEND") {
                if !v.trim().is_empty() {
                    let b = parse_backends(&v).ok_or(GpuError::BadEnv {
                        name: "WGPU_BACKEND",
                        value: v.clone(),
                        reason: "expected a comma list of vulkan, gl, metal, dx12, webgpu",
                    })?;
                    o.backends = b;
                }
            }
            if let Ok(v) = std::env::var("WGPU_ADAPTER_NAME") {
                if !v.trim().is_empty() {
                    o.adapter_name = Some(v.trim().to_string());
                }
            }
            if let Ok(v) = std::env::var("DYNRT_MEMORY_BUDGET") {
                if !v.trim().is_empty() {
                    let bytes = v.trim().parse::<u64>().ok().filter(|b| *b > 0).ok_or(
                        GpuError::BadEnv {
                            name: "DYNRT_MEMORY_BUDGET",
                            value: v.clone(),
                            reason: "expected a positive number of bytes",
                        },
                    )?;
                    o.memory_budget_bytes = Some(bytes);
                }
            }
            o.verbose = crate::memory::accounting::verbose_from_env();
        }
        Ok(o)
    }

    /// The same options restricted to one backend.
    pub fn with_backend(mut self, backend: wgpu::Backend) -> Self {
        self.backends = wgpu::Backends::from(backend);
        self
    }
}

/// Parses a `WGPU_BACKEND`-style comma list; `None` if no name is known.
pub fn parse_backends(list: &str) -> Option<wgpu::Backends> {
    let mut b = wgpu::Backends::empty();
    for name in list.split(',') {
        b |= match name.trim().to_ascii_lowercase().as_str() {
            "vulkan" | "vk" => wgpu::Backends::VULKAN,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            "metal" | "mtl" => wgpu::Backends::METAL,
            "dx12" | "d3d12" => wgpu::Backends::DX12,
            "webgpu" => wgpu::Backends::BROWSER_WEBGPU,
            _ => return None,
        };
    }
    (!b.is_empty()).then_some(b)
}

/// A GL device's pipelines, shared by every [`kernels::Kernels`] of the device and kept as
/// long as it lives (see [`GlSerial`]).
type GlPipelines = HashMap<kernels::PipelineKey, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>;

/// What a GL device needs so that no thread waits on wgpu's context lock for long
/// (docs/design.md, "Threads and the GL context").
#[derive(Default)]
struct GlSerial {
    /// Taken around every call that reaches the GL context ([`Gpu::lock_device`]).
    lock: DeviceLock,
    /// Destroying a pipeline takes the GL context, and the last clone of a pipeline can be
    /// dropped anywhere (a dispatch plan, a command log): so pipelines are created once per
    /// device and kept until the device goes, and their destruction happens with the device's.
    pipelines: Mutex<GlPipelines>,
}

struct GpuInner {
    /// The instance and adapter of a device dynrt created, kept so they outlive every clone
    /// of `Gpu`; `None` for an application's device ([`Gpu::from_device`]).
    #[allow(dead_code)]
    owned: Option<(wgpu::Instance, wgpu::Adapter)>,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    features: wgpu::Features,
    info: wgpu::AdapterInfo,
    options: GpuOptions,
    uncaptured: Arc<std::sync::Mutex<Vec<String>>>,
    /// Forward passes cut into bounded submissions (shared devices only).
    slicer: Option<embed::Slicer>,
    /// On a native GL device: the lock and the pipelines of [`GlSerial`].
    gl: Option<GlSerial>,
    /// Set once the device is lost.
    lost: Arc<LostFlag>,
}

impl GpuInner {
    /// The serialising of a device on `backend` (native GL only: the other backends'
    /// device calls do not wait on one context lock with a deadline).
    fn gl_serial(backend: wgpu::Backend) -> Option<GlSerial> {
        (cfg!(not(target_arch = "wasm32")) && backend == wgpu::Backend::Gl).then(GlSerial::default)
    }
}

/// How long one wait on a GL device's fence may hold the GL context
/// ([`Gpu::poll_wait`]): other threads' short calls (an unmap, a buffer's creation) get the
/// context between two waits.
#[cfg(not(target_arch = "wasm32"))]
const GL_POLL_SLICE: std::time::Duration = std::time::Duration::from_millis(20);

/// How a poll of [`Gpu::poll_until`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) enum Polled {
    /// The caller's condition held.
    Done,
    /// The work submitted before the poll has finished.
    Idle,
    /// The device is lost.
    Lost,
    /// wgpu refused the poll (logged).
    Failed,
}

/// How many uncaptured error messages a [`Gpu`] keeps (the count is exact beyond it).
const UNCAPTURED_KEEP: usize = 32;

/// One adapter with its device and queue. Cloning is cheap (an `Arc`); the device lives until
/// the last clone (and every [`Engine`] and [`Buffer`] made from it) is dropped.
///
/// **Threads.** A `Gpu` and everything made from it may be used from several threads. On GL,
/// where wgpu panics when a thread waits more than 6 s for the one GL context, dynrt
/// serialises its device calls behind [`Gpu::lock_device`] (a lock without a deadline), so a
/// long submit on one thread makes the others wait, never panic; on the other backends calls
/// run side by side. See docs/design.md, "Threads and the GL context".
///
/// **Device loss.** When the device is lost ([`Gpu::is_lost`]) every later call fails fast
/// with [`DeviceLost`] (inside [`AllocError`], [`GpuError`] and the runtime's, models' and
/// sessions' errors) instead of waiting on the device; a new `Gpu` and a model loaded again
/// on it are the way on. See docs/design.md, "Device loss".
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<GpuInner>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &self.inner.info.name)
            .field("backend", &self.inner.info.backend)
            .finish()
    }
}

impl Gpu {
    /// Finds an adapter and creates the device.
    ///
    /// Adapter choice: when [`GpuOptions::adapter_name`] is set, the first adapter on the
    /// enabled backends whose name contains it (case-insensitive); otherwise wgpu's choice for
    /// the power preference, then a fallback (software) adapter. The device gets the adapter's
    /// full limits (max buffer size and max storage binding size matter to dynrt) and
    /// `MAPPABLE_PRIMARY_BUFFERS` when offered, wanted and the adapter's memory is unified
    /// ([`AdapterClass`]). An uncaptured-error handler logs
    /// errors instead of wgpu's default panic; the engine wraps its own calls in error scopes.
    ///
    /// # Errors
    /// [`GpuError::NoAdapter`], [`GpuError::NoMatchingAdapter`], [`GpuError::DeviceRequest`].
    pub async fn new(opts: GpuOptions) -> Result<Gpu, GpuError> {
        let (instance, adapter) = instance_and_adapter(&opts).await?;
        let info = adapter.get_info();
        let mut features = wgpu::Features::empty();
        // Only where the host shares the adapter's memory (usage::AdapterClass).
        if opts.mappable_primary_buffers
            && AdapterClass::of(&info).maps_device_memory()
            && adapter
                .features()
                .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
        {
            features |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        // Subgroup operations and f16 arithmetic where offered: kernels use them only where
        // the device has them (crate::gpu::kernels::quant::QuantLayout).
        features |= adapter.features() & (wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16);
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("dynrt device"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: opts.memory_hints.clone(),
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| GpuError::DeviceRequest {
                adapter: info.name.clone(),
                reason: e.to_string(),
            })?;
        // wgpu's default handler panics; everything dynrt does that can fail runs inside an
        // error scope, so what reaches this handler is a bug worth logging, not a
        // reason to abort the process.
        let uncaptured: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("uncaptured wgpu error: {e}");
            let mut v = sink.lock().unwrap_or_else(|p| p.into_inner());
            if v.len() < UNCAPTURED_KEEP {
                v.push(e.to_string());
            }
        }));
        // The callback runs inside whichever wgpu call learns of the loss (possibly with the
        // device lock held): it only records it.
        let lost = Arc::new(LostFlag::default());
        let flag = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            let why = lost::describe(reason, &message);
            log::error!("dynrt: the device was lost ({why})");
            flag.set(why);
        });
        let features = device.features();
        let limits = device.limits();
        let gl = GpuInner::gl_serial(info.backend);
        log::info!(
            "dynrt: adapter `{}` ({:?}, {:?}), max_buffer_size={} bytes, shared={}",
            info.name,
            info.backend,
            info.device_type,
            limits.max_buffer_size,
            features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
        );
        Ok(Gpu {
            inner: Arc::new(GpuInner {
                owned: Some((instance, adapter)),
                device,
                queue,
                limits,
                features,
                info,
                options: opts,
                uncaptured,
                slicer: None,
                gl,
                lost,
            }),
        })
    }

    /// [`Gpu::new`], blocking (native only).
    ///
    /// # Errors
    /// As [`Gpu::new`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking(opts: GpuOptions) -> Result<Gpu, GpuError> {
        pollster::block_on(Gpu::new(opts))
    }

    /// The device.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }
    /// The queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }
    /// The device's limits (equal to the adapter's: dynrt requests them all).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.inner.limits
    }
    /// The device's features.
    pub fn features(&self) -> wgpu::Features {
        self.inner.features
    }
    /// Whether the device has f16 arithmetic in shaders (`SHADER_F16`).
    pub fn has_shader_f16(&self) -> bool {
        self.inner.features.contains(wgpu::Features::SHADER_F16)
    }
    /// Whether the device has subgroup operations (`SUBGROUP`); their sizes are in
    /// [`Gpu::adapter_info`].
    pub fn has_subgroups(&self) -> bool {
        self.inner.features.contains(wgpu::Features::SUBGROUP)
    }
    /// Name, backend, device type and driver of the adapter.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.inner.info
    }
    /// The backend in use.
    pub fn backend(&self) -> wgpu::Backend {
        self.inner.info.backend
    }
    /// The options the device was created with.
    pub fn options(&self) -> &GpuOptions {
        &self.inner.options
    }
    /// Whether `usm_shared` buffers are real bindable-and-mappable buffers here:
    /// `MAPPABLE_PRIMARY_BUFFERS` is enabled and the adapter's memory is the host's
    /// ([`AdapterClass`]). False on GL (llvmpipe), on the web and on every discrete GPU.
    pub fn supports_shared(&self) -> bool {
        self.inner
            .features
            .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
            && self.adapter_class().maps_device_memory()
    }

    /// Whether the adapter's memory is the host's ([`AdapterClass::of`] its info): what
    /// decides if the CPU may map buffers that kernels use.
    pub fn adapter_class(&self) -> AdapterClass {
        AdapterClass::of(&self.inner.info)
    }

    /// Whether and how buffers of `kind` can be allocated on this device, with the reason
    /// when not ([`kind_support_on`]).
    pub fn kind_support(&self, kind: AllocKind) -> KindSupport {
        kind_support_on(
            kind,
            self.adapter_class(),
            self.inner
                .features
                .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
        )
    }
    /// wgpu errors that no error scope caught (logged at `error` level when they happened),
    /// oldest first, at most 32. dynrt scopes everything it does, so a non-empty list means a
    /// bug or raw wgpu use outside the engine; tests assert it stays empty. Always empty on
    /// a shared device ([`Gpu::from_device`]): such errors go to the application's handler.
    pub fn uncaptured_errors(&self) -> Vec<String> {
        self.inner
            .uncaptured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether buffers of `kind` can be allocated on this device (see [`kind_support`]).
    pub fn supports_kind(&self, kind: AllocKind) -> bool {
        self.kind_support(kind).supported
    }

    /// Resolves when all work submitted so far is done: the queue's `onSubmittedWorkDone`
    /// (natively the device is polled until then; in the browser the page's event loop
    /// keeps running while it waits). Returns at once on a lost device.
    pub async fn idle(&self) {
        if self.is_lost() {
            return;
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        self.inner.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        #[cfg(not(target_arch = "wasm32"))]
        if self.poll_until(|| false) != Polled::Idle {
            // Lost or refused: the callback may never run.
            return;
        }
        // A dropped sender (device lost) also ends the wait.
        let _ = rx.await;
    }

    /// Waits until all submitted work is done (native); a no-op on the web where the browser
    /// polls the device. On a shared device the wait is sliced ([`embed::SHARED_POLL_SLICE`])
    /// so that the application's `present` calls in between; on GL each slice holds the
    /// device lock ([`Gpu::lock_device`]) for at most 20 ms so that other threads' calls
    /// get the GL context in between. Returns at once on a lost device.
    pub fn poll_wait(&self) {
        self.poll_until(|| false);
    }

    /// Polls the device until `done()` or until all submitted work is done, whichever comes
    /// first (native; a no-op on the web). `done` is checked after each poll: map callbacks
    /// run inside polls, so a readback waits only for its own copy. Also ends when the
    /// device is lost or wgpu refuses the poll.
    pub(crate) fn poll_until(&self, mut done: impl FnMut() -> bool) -> Polled {
        #[cfg(not(target_arch = "wasm32"))]
        {
            // A blocking poll holds the device's snatch lock for its whole wait, and the
            // app's `present` takes that lock exclusively: on a shared device dynrt waits in
            // short slices. On GL a wait holds the GL context (wgpu caps one wait at about
            // 2 s and reports a timeout), so it is sliced too.
            let timeout = if self.is_shared() {
                Some(embed::SHARED_POLL_SLICE)
            } else if self.inner.gl.is_some() {
                Some(GL_POLL_SLICE)
            } else {
                None
            };
            loop {
                if self.is_lost() {
                    return Polled::Lost;
                }
                let wait = wgpu::PollType::Wait {
                    submission_index: None,
                    timeout,
                };
                let polled = {
                    let _device = self.lock_device();
                    self.inner.device.poll(wait)
                };
                match polled {
                    Ok(_) if self.is_lost() => return Polled::Lost,
                    Ok(_) => return Polled::Idle,
                    Err(wgpu::PollError::Timeout) => {}
                    Err(e) => {
                        log::warn!("device poll failed: {e}");
                        return Polled::Failed;
                    }
                }
                if done() {
                    return Polled::Done;
                }
            }
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = &mut done;
            Polled::Idle
        }
    }

    /// Takes this device for the calling thread: on a GL device, waits (without a deadline)
    /// until no other thread of dynrt uses it, and keeps it until the guard is dropped; on
    /// every other backend it returns at once and holds nothing. dynrt takes it around each
    /// of its own calls that reach the GL context (buffer creation and destruction, mapping,
    /// pipeline creation, submits, polls); code that calls wgpu directly on a dynrt GL device
    /// from several threads takes it too. The same thread may take it again while holding it.
    ///
    /// Why: wgpu's GL backend panics when a thread waits more than 6 seconds for its context,
    /// and one thread can hold it that long (on llvmpipe a submit computes before it returns).
    /// See docs/design.md, "Threads and the GL context".
    pub fn lock_device(&self) -> DeviceGuard<'_> {
        match &self.inner.gl {
            Some(gl) => gl.lock.lock(),
            None => DeviceGuard::none(),
        }
    }

    /// A GL device's pipeline cache ([`GlSerial::pipelines`]); `None` on other backends.
    pub(crate) fn gl_pipelines(&self) -> Option<&Mutex<GlPipelines>> {
        self.inner.gl.as_ref().map(|gl| &gl.pipelines)
    }

    /// Whether the device is lost: wgpu's device-lost callback ran (a driver reset, the GPU
    /// taken away, [`Gpu::destroy`]), or the application said so ([`Gpu::mark_lost`]). Once
    /// true it stays true, and every call on this `Gpu`, its engines, models and sessions
    /// fails with [`DeviceLost`] without waiting on the device.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.is_set()
    }

    /// The [`DeviceLost`] error when the device is lost, else `None`.
    pub fn lost(&self) -> Option<DeviceLost> {
        self.inner.lost.reason().map(|reason| DeviceLost {
            adapter: self.inner.info.name.clone(),
            reason,
        })
    }

    /// `Err(DeviceLost)` when the device is lost.
    ///
    /// # Errors
    /// [`DeviceLost`].
    pub fn check_alive(&self) -> Result<(), DeviceLost> {
        self.lost().map_or(Ok(()), Err)
    }

    /// Records that the device is lost, with `reason`. dynrt learns of a loss itself on a
    /// device it created; an application that shares its device ([`Gpu::from_device`]) owns
    /// the device-lost callback and calls this from it.
    pub fn mark_lost(&self, reason: &str) {
        self.inner.lost.set(reason.to_string());
    }

    /// Destroys the device: its memory is released at once and every later call fails with
    /// [`DeviceLost`] (`destroyed`). Work in flight on other threads ends with the same error.
    /// A way to give the memory back without waiting for every handle to drop, and the way
    /// tests make a device lost.
    pub fn destroy(&self) {
        self.mark_lost("destroyed");
        let _device = self.lock_device();
        self.inner.device.destroy();
    }
}

/// An instance on `opts.backends` and the adapter [`pick_adapter`] chooses on it. Natively,
/// when GL is one of several backends it is tried only when the others give no adapter:
/// creating a GL instance initialises EGL, whose Mesa build prints warnings (such as
/// `XDG_RUNTIME_DIR is invalid`) on a headless machine even when the run then uses Vulkan.
async fn instance_and_adapter(
    opts: &GpuOptions,
) -> Result<(wgpu::Instance, wgpu::Adapter), GpuError> {
    let on = |backends: wgpu::Backends| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        wgpu::Instance::new(desc)
    };
    let gl = wgpu::Backends::GL;
    if cfg!(not(target_arch = "wasm32")) && opts.backends.contains(gl) && opts.backends != gl {
        let first = opts.backends.difference(gl);
        let instance = on(first);
        let narrowed = GpuOptions {
            backends: first,
            ..opts.clone()
        };
        if let Ok(adapter) = pick_adapter(&instance, &narrowed).await {
            return Ok((instance, adapter));
        }
    }
    let instance = on(opts.backends);
    let adapter = pick_adapter(&instance, opts).await?;
    Ok((instance, adapter))
}

async fn pick_adapter(
    instance: &wgpu::Instance,
    opts: &GpuOptions,
) -> Result<wgpu::Adapter, GpuError> {
    if let Some(filter) = &opts.adapter_name {
        let want = filter.to_lowercase();
        let adapters = instance.enumerate_adapters(opts.backends).await;
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        return adapters
            .into_iter()
            .find(|a| a.get_info().name.to_lowercase().contains(&want))
            .ok_or(GpuError::NoMatchingAdapter {
                filter: filter.clone(),
                found: names,
            });
    }
    for force_fallback_adapter in [false, true] {
        let r = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: opts.power_preference,
                force_fallback_adapter,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await;
        if let Ok(a) = r {
            return Ok(a);
        }
    }
    Err(GpuError::NoAdapter {
        backends: format!("{:?}", opts.backends),
    })
}

/// Every adapter on every backend this build of wgpu has (native only), as `dynrt info`
/// lists them.
#[cfg(not(target_arch = "wasm32"))]
pub fn enumerate_all_adapters() -> Vec<AdapterInfo> {
    enumerate_adapters(wgpu::Backends::all())
}

/// Every adapter on `backends` (native only; the web has one adapter per request).
#[cfg(not(target_arch = "wasm32"))]
pub fn enumerate_adapters(backends: wgpu::Backends) -> Vec<wgpu::AdapterInfo> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    pollster::block_on(instance.enumerate_adapters(backends))
        .iter()
        .map(|a| a.get_info())
        .collect()
}
