//! Helpers for GPU tests (this crate's and every helper's `tests/`): get a [`Gpu`] on a given
//! backend, or skip with a printed reason — unless `DYNRT_REQUIRE_GPU=1` (CI), where a missing
//! adapter fails the test.
//!
//! ```no_run
//! use dynrt::gpu::testing;
//! // One GPU from the environment (WGPU_BACKEND etc.), or skip:
//! let Some(gpu) = testing::gpu_or_skip("my_test") else { return };
//! // Or every backend the machine should offer (Vulkan/lavapipe and GL/llvmpipe):
//! for gpu in testing::gpus_or_skip("my_test") { /* ... */ }
//! ```
//!
//! Devices are cached per backend for the whole test process: creating one per test is slow
//! on software adapters, and several GL contexts in one process are fragile. Tests that need
//! their own counters make their own [`Engine`](super::Engine) on the shared [`Gpu`]; tests
//! that destroy a device take one of their own ([`fresh_gpu_or_skip`]). Tests share a GL
//! device safely: dynrt serialises its GL calls ([`Gpu::lock_device`]), and a test that calls
//! wgpu itself on a shared device takes that lock around its calls.

#![cfg(not(target_arch = "wasm32"))]

use super::{Gpu, GpuOptions};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The backends the GPU tests cover when the environment does not pick one.
pub const TEST_BACKENDS: [wgpu::Backend; 2] = [wgpu::Backend::Vulkan, wgpu::Backend::Gl];

/// True when `DYNRT_REQUIRE_GPU` is `1`/`true`: missing adapters fail instead of skip.
pub fn require_gpu() -> bool {
    std::env::var("DYNRT_REQUIRE_GPU")
        .map(|v| matches!(v.trim(), "1" | "true" | "yes"))
        .unwrap_or(false)
}

type Cache = Mutex<HashMap<String, Result<Gpu, String>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// How long creating a test device may take before the backend counts as unavailable:
/// generous for a busy 2-core machine (lavapipe and llvmpipe take well under a second), and
/// a bound where a driver's device creation hangs (GL through NVIDIA's EGL without a
/// display has been suspected of it). `DYNRT_DEVICE_DEADLINE_SECS` overrides it.
pub const DEVICE_DEADLINE: Duration = Duration::from_secs(120);

/// The deadline of one test ([`watch`]): generous for a busy 2-core machine, where the
/// longest tests (a 270M-parameter model against its reference) take minutes.
/// `DYNRT_TEST_DEADLINE_SECS` overrides it.
pub const TEST_DEADLINE: Duration = Duration::from_secs(1800);

fn secs_from_env(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(default, Duration::from_secs)
}

/// [`Gpu::new_blocking`] on a thread of its own, given up after [`DEVICE_DEADLINE`] (the
/// thread is left behind: a hung driver call cannot be cancelled).
fn new_gpu_bounded(opts: GpuOptions) -> Result<Gpu, String> {
    let deadline = secs_from_env("DYNRT_DEVICE_DEADLINE_SECS", DEVICE_DEADLINE);
    let what = format!("{:?}", opts.backends);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("dynrt test device".into())
        .spawn(move || {
            let _ = tx.send(Gpu::new_blocking(opts).map_err(|e| e.to_string()));
        })
        .map_err(|e| format!("cannot start the device thread: {e}"))?;
    rx.recv_timeout(deadline).unwrap_or_else(|_| {
        Err(format!(
            "creating a device on {what} did not finish in {} s (a hung driver?)",
            deadline.as_secs()
        ))
    })
}

/// A cached [`Gpu`] for `opts` (keyed by backends and adapter name), or the error text. The
/// device is created within [`DEVICE_DEADLINE`]; the calling test is watched ([`watch`]).
pub fn cached_gpu(opts: GpuOptions) -> Result<Gpu, String> {
    let key = format!(
        "{:?}/{:?}/{}",
        opts.backends, opts.adapter_name, opts.mappable_primary_buffers
    );
    watch();
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    c.entry(key)
        .or_insert_with(|| new_gpu_bounded(opts))
        .clone()
}

/// Tests being watched: a number per test thread, the thread's name (libtest names it after
/// the test) and when it started.
type Watched = Mutex<HashMap<u64, (String, Instant)>>;

fn watched() -> &'static Watched {
    static WATCHED: OnceLock<Watched> = OnceLock::new();
    WATCHED.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Removes its thread's test from the watch when the thread ends (libtest runs each test on
/// a thread of its own).
struct WatchGuard(u64);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        watched()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// A per-test watchdog: from the first GPU helper a test calls, a test that runs past
/// [`TEST_DEADLINE`] ends the whole test process with exit code 124 and a message naming it,
/// instead of hanging a CI run or a GPU machine's budget. Every helper of this module that
/// hands out a device calls it; a test may call it itself.
pub fn watch() {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicU64, Ordering};
    thread_local! {
        static GUARD: RefCell<Option<WatchGuard>> = const { RefCell::new(None) };
    }
    static NEXT: AtomicU64 = AtomicU64::new(1);
    static WATCHDOG: OnceLock<()> = OnceLock::new();
    let deadline = secs_from_env("DYNRT_TEST_DEADLINE_SECS", TEST_DEADLINE);
    GUARD.with(|g| {
        let mut g = g.borrow_mut();
        if g.is_none() {
            let id = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = std::thread::current()
                .name()
                .unwrap_or("(unnamed thread)")
                .to_string();
            watched()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, (name, Instant::now()));
            *g = Some(WatchGuard(id));
        }
    });
    WATCHDOG.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("dynrt test watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let w = watched().lock().unwrap_or_else(|e| e.into_inner());
                if let Some((name, started)) = w.values().find(|(_, t)| t.elapsed() > deadline) {
                    eprintln!(
                        "WATCHDOG: test `{name}` has run for {} s, past its deadline of {} s                          (DYNRT_TEST_DEADLINE_SECS): it hangs; ending the test process",
                        started.elapsed().as_secs(),
                        deadline.as_secs()
                    );
                    std::process::exit(124);
                }
            });
        if let Err(e) = spawned {
            eprintln!("the test watchdog could not start: {e}");
        }
    });
}

fn skip_or_fail(test: &str, what: &str, reason: &str) {
    if require_gpu() {
        panic!("{test}: {what} unavailable and DYNRT_REQUIRE_GPU=1: {reason}");
    }
    eprintln!("SKIP {test} on {what}: {reason}");
}

fn env_options(test: &str) -> Option<GpuOptions> {
    match GpuOptions::from_env() {
        Ok(o) => Some(o),
        Err(e) => {
            skip_or_fail(test, "any adapter", &e.to_string());
            None
        }
    }
}

/// A GPU chosen by the environment (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME`), or `None` after
/// printing why (panics instead when [`require_gpu`]).
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    let opts = env_options(test)?;
    match cached_gpu(opts) {
        Ok(g) => Some(g),
        Err(e) => {
            skip_or_fail(test, "any adapter", &e);
            None
        }
    }
}

/// One GPU per backend to test: the backends of `WGPU_BACKEND` if set, else
/// [`TEST_BACKENDS`]. A missing backend is skipped with a printed reason, or fails the test
/// when [`require_gpu`].
pub fn gpus_or_skip(test: &str) -> Vec<Gpu> {
    let Some(base) = env_options(test) else {
        return Vec::new();
    };
    let env_picked = std::env::var("WGPU_BACKEND").is_ok_and(|v| !v.trim().is_empty());
    let backends: Vec<wgpu::Backend> = if env_picked {
        TEST_BACKENDS
            .iter()
            .copied()
            .chain([wgpu::Backend::Metal, wgpu::Backend::Dx12])
            .filter(|b| base.backends.contains(wgpu::Backends::from(*b)))
            .collect()
    } else {
        TEST_BACKENDS.to_vec()
    };
    let mut out = Vec::new();
    for b in backends {
        match cached_gpu(base.clone().with_backend(b)) {
            Ok(g) => out.push(g),
            Err(e) => skip_or_fail(test, &format!("{b:?}"), &e),
        }
    }
    out
}

/// A device of its own (never the cached one), on the environment's backend choice
/// (`WGPU_BACKEND`; Vulkan before GL when several are allowed): for a test that destroys its
/// device ([`Gpu::destroy`]) or must not share it. `None` after printing why when there is no
/// adapter (panics instead when [`require_gpu`]).
pub fn fresh_gpu_or_skip(test: &str) -> Option<Gpu> {
    let opts = env_options(test)?;
    watch();
    match new_gpu_bounded(opts) {
        Ok(g) => Some(g),
        Err(e) => {
            skip_or_fail(test, "any adapter", &e.to_string());
            None
        }
    }
}

/// A device created the way an application creates its own (wgpu directly, with `limits`
/// and `features`, not through [`Gpu::new`]), on `backend`: for tests of
/// [`Gpu::from_device`]. `None` after printing why when the backend has no adapter or
/// refuses the request (panics instead when [`require_gpu`]).
pub fn app_device_or_skip(
    test: &str,
    backend: wgpu::Backend,
    limits: wgpu::Limits,
    features: wgpu::Features,
) -> Option<(wgpu::Device, wgpu::Queue)> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::from(backend);
    let instance = wgpu::Instance::new(desc);
    let what = format!("{backend:?}");
    let adapter = match pollster::block_on(instance.request_adapter(&Default::default())) {
        Ok(a) => a,
        Err(e) => {
            skip_or_fail(test, &what, &e.to_string());
            return None;
        }
    };
    let request = adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("test app device"),
        required_features: features,
        required_limits: limits,
        ..Default::default()
    });
    match pollster::block_on(request) {
        Ok(pair) => Some(pair),
        Err(e) => {
            skip_or_fail(test, &what, &e.to_string());
            None
        }
    }
}
