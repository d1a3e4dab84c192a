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
//! their own counters make their own [`Engine`](super::Engine) on the shared [`Gpu`].

#![cfg(not(target_arch = "wasm32"))]

use super::{Gpu, GpuOptions};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

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

/// A cached [`Gpu`] for `opts` (keyed by backends and adapter name), or the error text.
pub fn cached_gpu(opts: GpuOptions) -> Result<Gpu, String> {
    let key = format!(
        "{:?}/{:?}/{}",
        opts.backends, opts.adapter_name, opts.mappable_primary_buffers
    );
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    c.entry(key)
        .or_insert_with(|| Gpu::new_blocking(opts).map_err(|e| e.to_string()))
        .clone()
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
